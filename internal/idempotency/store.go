package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// Request is one keyed request: who sent it, under which key, and what it
// asked for.
type Request struct {
	CallerID string
	Key      string
	// Operation is the contract's operationId (createCharge). It is stored
	// with the record and names the Handler that resumes it (see Registry).
	Operation   string
	Method      string
	Path        string
	Fingerprint []byte
}

// RecoveryPoint names a phase boundary an operation has passed. Every
// operation starts at RecoveryStarted and ends at RecoveryFinished; an
// operation with an external effect defines the points in between.
type RecoveryPoint string

const (
	RecoveryStarted  RecoveryPoint = "started"
	RecoveryFinished RecoveryPoint = "finished"
)

// ErrLeaseLost means a newer attempt took the record over: the phase that
// found out has been rolled back and the caller must stop driving it.
var ErrLeaseLost = errors.New("idempotency: lease lost to a newer attempt")

// ErrSetAside marks a Handler's error (wrap it: fmt.Errorf("%w: %w",
// ErrSetAside, err)) as one that no retry can fix and that no final answer
// may record, such as the processor refusing our downstream key because it
// saw it with another request. The record is set aside for a person at
// once (status dead), rather than retried by the reconciler until it gives
// up, or stored as a failure that may not be true.
var ErrSetAside = errors.New("idempotency: set aside for an operator")

// Store runs keyed operations against the idempotency_keys table.
type Store struct {
	pool    *pgxpool.Pool
	lease   time.Duration
	maxRun  time.Duration
	wait    time.Duration
	waiters *Listener // nil: duplicates do not wait (wait is 0)
	log     *slog.Logger
	replays *replayCache // nil: every replay reads the database
	faults  Faults       // nil in production
}

// Faults are the test facility's ways into the engine: the demo and the
// crash tests kill the process at the places they name, the history check's
// tests stall an owner past its lease and plant a bug. Production passes
// none (StoreConfig.Faults is nil), and no operation's code carries them.
type Faults interface {
	// AfterClaim runs once a request's claim gave it the record (a new one,
	// or one taken over), before it starts work and before its heartbeat
	// starts renewing the lease.
	AfterClaim(Record)
	// AfterPhase runs once a phase has committed, with the record as it
	// now stands (at the recovery point the phase reached).
	AfterPhase(Record)
	// BeforeFinalCommit runs inside the final phase of an operation that
	// has more than one, after the phase's own writes and before the
	// record's completion and the commit, which are sent together: the
	// effect is written but not committed.
	BeforeFinalCommit(Record)
	// Unfenced says whether a completion is written without its fence (a
	// PLANTED BUG: CompleteIdempotencyKeyUnfenced), for the test that shows
	// the history check catches it.
	Unfenced() bool
}

// StoreConfig tunes a Store.
type StoreConfig struct {
	// Lease is how long an owner holds a record without renewing it. An
	// owner renews it every third of a lease while it works (the processor
	// call included), so a live owner never loses it to a short lease, and
	// a crashed one is noticed within one lease: after that, a retry or
	// the reconciler takes the record over (IDEMPOTENCY_LEASE).
	//
	// It is also the grace the reconciler gives a client: after a request
	// ends in a transient failure (its client told to retry), the
	// reconciler leaves the record alone for one lease, so that the
	// client's own retry, not a background worker, is what resumes it.
	Lease time.Duration
	// MaxRun bounds one execution, however long its owner keeps renewing:
	// a processor call that never returns must not hold the key for ever.
	// Zero is three leases.
	MaxRun time.Duration
	// Wait is how long a request that finds its key in progress under a
	// live lease waits for the original to finish, to answer with its
	// stored response, before it answers 409 (IDEMPOTENCY_WAIT). Zero, or
	// no Listener, answers 409 at once.
	Wait time.Duration
	// Listener wakes waiting duplicates when their record is notified.
	Listener *Listener
	// Faults, for tests and the demo only; nil in production.
	Faults Faults
}

// NewStore returns a Store over pool.
func NewStore(pool *pgxpool.Pool, cfg StoreConfig, log *slog.Logger) *Store {
	s := &Store{pool: pool, lease: cfg.Lease, maxRun: cfg.MaxRun, wait: cfg.Wait, waiters: cfg.Listener, log: log, faults: cfg.Faults}
	if s.maxRun <= 0 {
		s.maxRun = 3 * s.lease
	}
	if s.waiters == nil {
		s.wait = 0
	}
	return s
}

// CacheReplays keeps the answers of up to size completed records in this
// process, so that their replays need no database round trip; retention
// is IDEMPOTENCY_KEY_RETENTION, which bounds how long an answer may be
// kept (see replays.go for why that makes the cache safe). Call it before
// the Store is used.
func (s *Store) CacheReplays(size int, retention time.Duration) {
	if size > 0 {
		s.replays = newReplayCache(size, retention)
	}
}

// Lease is the right, held by exactly one request (or worker) at a time, to
// drive one record forward from its recovery point.
type Lease struct {
	store    *Store
	record   Record
	response *Response
	// claimed is when the claim that gave this lease was sent, on this
	// process's clock, and age how old the record was then, on the
	// database's: what the replay cache needs to keep the answer no longer
	// than the record is certain to exist.
	claimed time.Time
	age     time.Duration
	// lost is set when a renewal of the lease matched no row: a newer
	// attempt took the record over, or the lease lapsed before the
	// renewal came.
	lost atomic.Bool
}

// Record is the record as of the last phase this lease committed.
func (l *Lease) Record() Record { return l.record }

// RecoveryPoint is where the operation stands: where a Handler resumes.
func (l *Lease) RecoveryPoint() RecoveryPoint { return l.record.RecoveryPoint }

// A PhaseFunc does one phase's work inside tx and says how the phase ended:
// with the next RecoveryPoint, or with the operation's final *Response.
type PhaseFunc func(ctx context.Context, tx pgx.Tx) (Result, error)

// Result is how a phase ends: a RecoveryPoint or a *Response.
type Result interface{ isResult() }

func (RecoveryPoint) isResult() {}
func (*Response) isResult()     {}

// Phase runs fn and the record's fenced update in one transaction, so the
// phase's effects and "this phase is done" commit together or not at all.
//
// The fenced update comes last and succeeds only while this attempt holds
// a live lease. If a newer attempt took the record over while fn ran, or
// the lease ran out, it fails (SQLSTATE RS001, migration 0023) instead of
// matching no row: it is sent in one round trip with the COMMIT, which the
// error stops. The whole transaction (fn's writes included) rolls back,
// and Phase returns ErrLeaseLost. If a takeover races
// with this transaction, the row lock taken by the update orders them: the
// takeover waits, then re-reads the row. If this phase completed the
// record, there is nothing to take over. If it only moved the recovery
// point, the takeover proceeds from that new point, and this owner's next
// write is refused: the record moves forward exactly once either way.
func (l *Lease) Phase(ctx context.Context, fn PhaseFunc) error {
	if l.lost.Load() {
		// A renewal found the lease lost: stop before the next write (it
		// would be fenced out anyway).
		return ErrLeaseLost
	}
	// One span per phase, named after the recovery point it starts from:
	// a resumed operation's trace shows which phases this attempt ran, and
	// which it skipped because an earlier attempt committed them.
	ctx, span := startPhase(ctx, l.record)
	var result Result
	// BEGIN goes with fn's first statement, and COMMIT with the fenced
	// write (internal/postgres, TransactPipelined): the same statements in
	// two round trips fewer. The fenced write fails when the fence is
	// lost, so the COMMIT behind it never runs then.
	err := postgres.TransactPipelined(ctx, l.store.pool, func(tx *postgres.PipelinedTx) error {
		var err error
		if result, err = fn(ctx, tx); err != nil {
			return err
		}
		if _, final := result.(*Response); final && l.record.RecoveryPoint != RecoveryStarted && l.store.faults != nil {
			l.store.faults.BeforeFinalCommit(l.record)
		}
		return l.writeResult(ctx, tx.ThenCommit(), result)
	})
	if err != nil {
		endWithError(span, err)
		return err
	}
	// Only now, after the commit, does the in-memory record move on.
	switch r := result.(type) {
	case RecoveryPoint:
		l.record.RecoveryPoint = r
	case *Response:
		l.record.Status = StatusCompleted
		l.record.RecoveryPoint = RecoveryFinished
		l.response = r
	}
	if span.IsRecording() {
		span.SetAttributes(attrReachedPoint.String(string(l.record.RecoveryPoint)))
	}
	span.End()
	if l.store.faults != nil {
		l.store.faults.AfterPhase(l.record)
	}
	return nil
}

// writeResult writes a phase's result to the record, fenced on the
// attempt: ErrLeaseLost when this owner no longer holds a live lease.
func (l *Lease) writeResult(ctx context.Context, tx dbsqlc.DBTX, result Result) error {
	q, rec := queries, l.record
	var err error
	switch r := result.(type) {
	case RecoveryPoint:
		err = q.SetRecoveryPoint(ctx, tx, dbsqlc.SetRecoveryPointParams{
			RecoveryPoint: string(r), CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
		})
	case *Response:
		var headers []byte
		if headers, err = encodeHeaders(r.Header); err != nil {
			return err
		}
		status := int32(r.Status) // #nosec G115 -- an HTTP status code
		if l.store.faults != nil && l.store.faults.Unfenced() {
			err = queries.CompleteIdempotencyKeyUnfenced(ctx, tx, dbsqlc.CompleteIdempotencyKeyUnfencedParams{
				ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: r.Body, CallerID: rec.CallerID, ID: rec.ID,
			})
			break
		}
		err = queries.CompleteIdempotencyKey(ctx, tx, dbsqlc.CompleteIdempotencyKeyParams{
			ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: r.Body,
			CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
		})
	default:
		return fmt.Errorf("idempotency: a phase must end with a RecoveryPoint or a *Response, got %T", result)
	}
	if leaseLost(err) {
		return ErrLeaseLost
	}
	return err
}

// leaseLost says whether err is a fenced write refusing an owner that lost
// its fence: the SQLSTATE that idempotency_lease_lost() raises (migration
// 0023).
func leaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RS001"
}

// A Handler drives an owned operation from l.RecoveryPoint() to its final
// response, one l.Phase at a time. It is called both for a fresh claim
// (at RecoveryStarted) and for a takeover (at whatever point the previous
// owner reached), so it must switch on the recovery point.
//
// Its error decides what is kept:
//   - nil: the last phase stored a response; that response is returned.
//   - a transient error (the database or a downstream service failed in a
//     way worth retrying, see IsRetryable): the lease is released and the
//     record stays at its recovery point, so a retry resumes there. Nothing
//     is stored: a retry must not replay a failure that was not final.
//   - a *problem.Error: a final outcome found during execution (a
//     business-rule conflict). It is stored and replayed like a success.
//   - any other error (a bug, a panic), before the first phase committed:
//     nothing happened, so it is a final internal error, stored as a
//     generic 500 (a retry would only fail again).
//   - any other error after the first phase committed: an effect may be
//     pending outside our database (a charge at the processor), and a
//     stored 500 would leave it unrecorded for ever. The record stays
//     resumable, exactly as after a transient failure (the client gets a
//     503), and the reconciler sets it aside for a person if it keeps
//     failing. So a handler never has to sort its own unexpected errors.
type Handler func(ctx context.Context, l *Lease) error

// IsRetryable reports whether a Handler's error leaves the operation
// resumable rather than final.
func IsRetryable(err error) bool {
	var p *problem.Error
	if errors.As(err, &p) {
		return p.Status() == http.StatusServiceUnavailable
	}
	return postgres.IsTransient(err)
}

// Execute runs the keyed request req: it claims the key and either answers
// from the record (replay, 409, 422) or runs h as the owner. The returned
// Response is what the client receives; an error is a problem that was not
// stored (a conflict on the key, or a transient failure).
func (s *Store) Execute(ctx context.Context, req Request, h Handler) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// From here on, nothing depends on the client staying connected: the
	// claim, every phase and the stored response run on contexts that the
	// request's cancellation does not reach. Only waiting for another
	// request's answer stops when the client goes away.
	lease, resp, err := s.claim(ctx, req)
	if lease != nil {
		resp, err = s.run(ctx, req, lease, h)
	}
	// A live owner holds the key (found by the claim, or by an owner that
	// lost its lease to it): wait for its answer, or say when to ask again.
	var busy *busyError
	if errors.As(err, &busy) && s.wait > 0 {
		resp, err = s.waitForOriginal(ctx, req, h, busy)
	}
	if errors.As(err, &busy) {
		observe(ctx, req.Operation, metrics.OutcomeInProgress)
		return nil, busy.problem()
	}
	return resp, err
}

// run drives the operation req that lease holds to its answer, bounded by
// MaxRun however long its owner keeps the lease renewed, and on a context
// the client's cancellation does not reach.
func (s *Store) run(ctx context.Context, req Request, lease *Lease, h Handler) (*Response, error) {
	if s.faults != nil {
		s.faults.AfterClaim(lease.record)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	// A retryable failure releases the lease at once, so the client's retry
	// finds the record free; the reconciler waits a lease before it steps in.
	resp, err := s.Drive(ctx, lease, h, s.lease)
	if err == nil {
		// Drive answers without an error only from a completed record:
		// this lease's, or the one that fenced it out.
		s.replays.put(req, resp, lease.claimed, lease.age)
	}
	return resp, err
}

// fromCache answers req from the replay cache, if its key is there (ok):
// a completed record this process has written or replayed lately is
// answered from memory, without the database (see replays.go for why that
// is safe).
func (s *Store) fromCache(ctx context.Context, req Request) (_ *Response, _ error, ok bool) {
	cached, ok := s.replays.get(req.CallerID, req.Key)
	if !ok {
		return nil, nil, false
	}
	ctx, span := startClaim(ctx, req)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attrReplayCache.Bool(true))
	}
	resp, err := replayCached(ctx, req, cached)
	return resp, err, true
}

// replayCached answers req from the replay cache, exactly as the claim
// would have from the completed record: a different request under the key
// is a 422, the same one gets the stored response.
func replayCached(ctx context.Context, req Request, cached *cachedReplay) (*Response, error) {
	if subtle.ConstantTimeCompare(cached.fingerprint(), req.Fingerprint) != 1 {
		observe(ctx, req.Operation, metrics.OutcomeMismatch)
		return nil, reused(cached.method(), cached.path())
	}
	observe(ctx, req.Operation, metrics.OutcomeReplayed)
	metrics.ReplayCacheHits.Inc()
	return cached.response(), nil
}

// reused is the 422 for a key first used for another request.
func reused(method, path string) *problem.Error {
	return problem.New(problem.IdempotencyKeyReused,
		"this Idempotency-Key was first used for a different request (%s %s, or another body); use a new key for a new operation",
		method, path)
}

// Drive runs h on a lease already held (from a claim, or from the
// reconciler's ClaimStale) and settles the outcome as the Handler
// documentation says. After a retryable failure the lease is released at
// once, and the reconciler's next try is scheduled reconcileAfter from now.
func (s *Store) Drive(ctx context.Context, lease *Lease, h Handler, reconcileAfter time.Duration) (*Response, error) {
	// The owner renews its lease while the handler runs; if a renewal
	// finds the lease lost, the handler's context is canceled (a processor
	// call in flight is abandoned: its outcome is the new owner's to
	// learn, under the same downstream key) and its next phase is refused.
	work, cancelWork := context.WithCancel(ctx)
	stopHeartbeat := lease.heartbeat(work, cancelWork)
	err := runHandler(work, h, lease)
	stopHeartbeat()
	cancelWork()
	rec := lease.record
	switch {
	case err == nil && lease.response != nil:
		return lease.response, nil
	case lease.lost.Load():
		// A newer owner holds the record, whatever the handler's error
		// says about the call it was cut off in. Answer with what became
		// of the operation.
		return s.current(ctx, lease.record)
	case err == nil:
		err = fmt.Errorf("idempotency: handler for %s %s returned without a response", rec.RequestMethod, rec.RequestPath)
	case errors.Is(err, ErrLeaseLost):
		// This owner was fenced out and its last phase rolled back. Answer
		// with what became of the operation.
		return s.current(ctx, lease.record)
	case errors.Is(err, ErrSetAside):
		s.log.ErrorContext(ctx, "keyed operation set aside for an operator (dead)", "err", err,
			"caller", rec.CallerID, "path", rec.RequestPath, "recovery_point", lease.record.RecoveryPoint, "attempt", rec.Attempt)
		buryCtx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		switch berr := lease.Bury(buryCtx); {
		case errors.Is(berr, ErrLeaseLost):
			return s.current(ctx, lease.record)
		case berr != nil:
			// Not set aside: left resumable, and the reconciler meets the
			// same answer again.
			s.release(lease, reconcileAfter)
			return nil, errors.Join(berr, err)
		}
		metrics.DeadLetters.WithLabelValues(metrics.DeadLetterOperation).Inc()
		return nil, dead()
	case IsRetryable(err):
		s.log.WarnContext(ctx, "keyed operation left resumable", "err", err,
			"caller", rec.CallerID, "path", rec.RequestPath, "recovery_point", lease.record.RecoveryPoint, "attempt", rec.Attempt)
		s.release(lease, reconcileAfter)
		return nil, err
	case !isProblem(err) && lease.RecoveryPoint() != RecoveryStarted:
		s.log.ErrorContext(ctx, "keyed operation failed after its first phase; left resumable, not final", "err", err,
			"caller", rec.CallerID, "path", rec.RequestPath, "recovery_point", lease.record.RecoveryPoint, "attempt", rec.Attempt)
		s.release(lease, reconcileAfter)
		p := problem.New(problem.ServiceUnavailable,
			"the operation could not be completed now; retry with the same Idempotency-Key and it resumes where it stopped")
		p.RetryAfter = 1
		return nil, errors.Join(p, err)
	}

	// A final outcome: store it, so that every retry gets the same answer.
	var p *problem.Error
	if !errors.As(err, &p) {
		s.log.ErrorContext(ctx, "keyed operation failed", "err", err,
			"caller", rec.CallerID, "method", rec.RequestMethod, "path", rec.RequestPath, "attempt", rec.Attempt)
		p = problem.New(problem.InternalError, "the request failed; it will not be retried under this Idempotency-Key")
	}
	resp := ProblemResponse(p)
	if err := s.complete(lease, resp); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return s.current(ctx, lease.record)
		}
		s.release(lease, reconcileAfter)
		return nil, err
	}
	return resp, nil
}

// current answers from what the record says now, for a request that could
// not drive it: an owner that was fenced out (its last phase rolled back),
// or a request that lost a race to take it over. Another owner may have
// finished (its response is the answer) or may still be working (409 for
// as long as its lease says); or the lease may simply have run out with
// nobody holding it since, and a retry resumes the operation at once.
//
// An answer read from the finished record is a replay, and the request's
// Idempotency-Outcome says so, whatever its own claim found.
func (s *Store) current(reqCtx context.Context, rec Record) (*Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	row, err := queries.GetIdempotencyKeyWithLease(ctx, s.pool, dbsqlc.GetIdempotencyKeyWithLeaseParams{CallerID: rec.CallerID, ID: rec.ID})
	switch {
	case postgres.IsNotFound(err):
		// The reconciler freed a key whose first phase never committed.
		return nil, resumable()
	case err != nil:
		return nil, fmt.Errorf("read idempotency key after losing its lease: %w", err)
	}
	switch cur := recordOf(row.IdempotencyKey); {
	case cur.Status == StatusCompleted:
		retell(reqCtx, metrics.OutcomeReplayed)
		return storedResponse(cur)
	case cur.Status == StatusDead:
		return nil, dead()
	case row.LeaseRemainingSeconds > 0:
		return nil, &busyError{rec: cur, leaseRemaining: row.LeaseRemainingSeconds}
	default:
		return nil, resumable()
	}
}

func isProblem(err error) bool {
	var p *problem.Error
	return errors.As(err, &p)
}

// runHandler runs h, turning a panic into an error. A panic is a bug, so it
// is treated like any unexpected error: stored as a 500 before the first
// phase committed; after it, left resumable for the reconciler to set
// aside, since an outside effect may be pending.
func runHandler(ctx context.Context, h Handler, l *Lease) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, l)
}

// claim takes the key for req, or answers from the existing record.
func (s *Store) claim(ctx context.Context, req Request) (*Lease, *Response, error) {
	// Detached: a claim cut off halfway could commit without this request
	// learning that it owns the key, leaving it leased to nobody.
	// The request's own span, not the claim's, is what a later resumption
	// links to: a reader lands on the whole request.
	traceparent := postgres.Traceparent(ctx)
	observed, span := startClaim(ctx, req)
	defer span.End()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(observed), cleanupTimeout)
	defer cancel()
	var row dbsqlc.ClaimIdempotencyKeyRow
	var err error
	// The claim returns no row only when a concurrent request committed the
	// key between this statement's snapshot and its insert; running it again
	// sees that row. Twice is enough; a third try is for safety, not need.
	sent := s.replays.clock()
	for range 3 {
		row, err = queries.ClaimIdempotencyKey(ctx, s.pool, dbsqlc.ClaimIdempotencyKeyParams{
			CallerID: req.CallerID, Key: req.Key, Operation: req.Operation, RequestMethod: req.Method, RequestPath: req.Path,
			RequestFingerprint: req.Fingerprint, LeaseSeconds: s.lease.Seconds(), Traceparent: traceparent,
		})
		if !postgres.IsNotFound(err) {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("claim idempotency key: %w", err)
	}
	rec := recordFromClaim(row)
	traceRecord(observed, rec)
	age := secondsOf(row.AgeSeconds)
	if row.Claimed {
		observe(observed, req.Operation, metrics.OutcomeNew)
		return &Lease{store: s, record: rec, claimed: sent, age: age}, nil, nil
	}

	// Someone else created this key. Is it the same request?
	if subtle.ConstantTimeCompare(rec.RequestFingerprint, req.Fingerprint) != 1 {
		observe(observed, req.Operation, metrics.OutcomeMismatch)
		return nil, nil, reused(rec.RequestMethod, rec.RequestPath)
	}
	switch {
	case rec.Status == StatusCompleted:
		observe(observed, req.Operation, metrics.OutcomeReplayed)
		resp, err := storedResponse(rec)
		if err == nil {
			s.replays.put(req, resp, sent, age)
		}
		return nil, resp, err
	case rec.Status == StatusInProgress && row.LeaseExpired:
		// No live owner holds it: its owner crashed, stalled past its
		// lease, or gave up after a transient failure. Take over and resume
		// from the recovery point, now, whatever the reconciler's schedule:
		// this request is the caller asking for the operation again.
		taken, err := queries.TakeOverIdempotencyKey(ctx, s.pool, dbsqlc.TakeOverIdempotencyKeyParams{
			CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt, LeaseSeconds: s.lease.Seconds(),
		})
		if postgres.IsNotFound(err) {
			// Another request (or the reconciler) took it over first.
			resp, err := s.current(observed, rec)
			if resp != nil {
				observe(observed, req.Operation, metrics.OutcomeReplayed)
			}
			return nil, resp, err
		}
		if err != nil {
			return nil, nil, fmt.Errorf("take over idempotency key: %w", err)
		}
		traceRecord(observed, recordOf(taken)) // the new attempt
		// A lease given up after a transient failure ends when it is
		// released, in the same statement that stamps updated_at; one that
		// ran out was set to end later than its last write, and belonged to
		// an owner that died or stalled.
		if rec.LockedUntil == nil || !rec.LockedUntil.After(rec.UpdatedAt) {
			observe(observed, req.Operation, metrics.OutcomeResumed)
		} else {
			observe(observed, req.Operation, metrics.OutcomeTakenOver)
		}
		return &Lease{store: s, record: recordOf(taken), claimed: sent, age: age}, nil, nil
	case rec.Status == StatusDead:
		observe(observed, req.Operation, metrics.OutcomeDead)
		return nil, nil, dead()
	default:
		// A live owner holds it: the caller waits, or answers 409 (and
		// counts the outcome then: waiting may still end in an answer).
		traceOutcome(observed, metrics.OutcomeInProgress)
		return nil, nil, &busyError{rec: rec, leaseRemaining: row.LeaseRemainingSeconds}
	}
}

// secondsOf is a number of seconds the database computed, as a Duration.
func secondsOf(seconds float64) time.Duration { return time.Duration(seconds * float64(time.Second)) }

// busyError is a record a live owner holds, for leaseRemaining seconds at
// most unless it renews its lease.
type busyError struct {
	rec            Record
	leaseRemaining float64
}

func (e *busyError) Error() string {
	return fmt.Sprintf("idempotency: record %d is in progress under a live lease (%.1fs left)", e.rec.ID, e.leaseRemaining)
}

// problem is the 409 for a busy record. Retry-After says when asking
// again is useful: soon, since the owner is working and an operation takes
// seconds (and a retry waits on the server again, for the owner's answer);
// and never later than the lease could lapse, for an owner that died (the
// retry then takes over). So a second or two, or less when the lease ends
// sooner. A client that asks sooner only gets another 409.
func (e *busyError) problem() *problem.Error {
	p := problem.New(problem.IdempotencyKeyInUse,
		"a request with this Idempotency-Key is still being processed; retry with the same key after the Retry-After delay to receive its result")
	p.RetryAfter = max(1, min(2, int(math.Ceil(e.leaseRemaining))))
	return p
}

// resumable is the answer for an operation that nobody holds any more
// after its owner ran out of time: nothing final was stored, and a retry
// with the same key resumes it at once.
func resumable() *problem.Error {
	p := problem.New(problem.ServiceUnavailable,
		"the operation could not be completed in time; retry with the same Idempotency-Key and it resumes where it stopped")
	p.RetryAfter = 1
	return p
}

func dead() *problem.Error {
	return problem.New(problem.IdempotencyKeyDead,
		"the operation under this Idempotency-Key was set aside for an operator (it failed too often, or the processor gave an answer no retry can change); do not retry it")
}

// cleanupTimeout bounds the writes that wrap up an execution after its
// handler failed. They get their own context because the execution's may be
// the very thing that expired.
const cleanupTimeout = 5 * time.Second

// complete stores a final response outside any phase (for outcomes that end
// an operation by failing).
func (s *Store) complete(l *Lease, resp *Response) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	err := postgres.Transact(ctx, s.pool, func(tx pgx.Tx) error { return l.writeResult(ctx, tx, resp) })
	if err == nil {
		l.record.Status, l.response = StatusCompleted, resp
	}
	return err
}

// release gives the lease up now, so that a client's retry can take over
// without waiting for the lease to run out, and schedules the reconciler's
// next try reconcileAfter from now. It is best effort: if it fails, the
// lease simply expires.
func (s *Store) release(l *Lease, reconcileAfter time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	rec := l.record
	if _, err := queries.ReleaseIdempotencyKey(ctx, s.pool, dbsqlc.ReleaseIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt, ReconcileAfterSeconds: reconcileAfter.Seconds(),
	}); err != nil {
		s.log.WarnContext(ctx, "release idempotency key", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}

// ClaimStale takes over up to n in-progress records that are due and that
// no live owner holds, for the reconciler: those that never passed their
// first phase, and those of the given operations (the ones it can resume).
// Several reconcilers may call it at once: each record goes to exactly one
// of them.
func (s *Store) ClaimStale(ctx context.Context, n int, operations []string) ([]*Lease, error) {
	recs, err := queries.ClaimStaleIdempotencyKeys(ctx, s.pool, dbsqlc.ClaimStaleIdempotencyKeysParams{
		LeaseSeconds: s.lease.Seconds(), MaxRecords: int32(n), Operations: operations, // #nosec G115 -- n is the reconciler's batch, a handful
	})
	if err != nil {
		return nil, err
	}
	leases := make([]*Lease, len(recs))
	for i, rec := range recs {
		leases[i] = &Lease{store: s, record: recordOf(rec)}
	}
	return leases, nil
}

// GiveBack gives a lease from ClaimStale up without doing any work, for a
// reconciler that is stopping: a client's retry may take the record over
// at once, a reconciler may try it at once too, and the try it did not
// make is not counted against it.
func (l *Lease) GiveBack() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	rec := l.record
	if _, err := queries.GiveBackIdempotencyKey(ctx, l.store.pool, dbsqlc.GiveBackIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
	}); err != nil {
		l.store.log.WarnContext(ctx, "give back idempotency key", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}

// Abandon deletes a record that never passed its first phase (nothing was
// done), freeing its key. It returns ErrLeaseLost if the record moved on.
func (l *Lease) Abandon(ctx context.Context) error {
	rec := l.record
	n, err := queries.AbandonIdempotencyKey(ctx, l.store.pool, dbsqlc.AbandonIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
	})
	if err == nil && n == 0 {
		err = ErrLeaseLost
	}
	return err
}

// Bury sets the record aside for an operator (status dead). It returns
// ErrLeaseLost if the record moved on.
func (l *Lease) Bury(ctx context.Context) error {
	rec := l.record
	n, err := queries.BuryIdempotencyKey(ctx, l.store.pool, dbsqlc.BuryIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
	})
	if err == nil && n == 0 {
		err = ErrLeaseLost
	}
	return err
}

// heartbeat renews l's lease every third of a lease until stop is called
// or ctx ends: a live owner keeps its lease however long it works (up to
// MaxRun), and a crashed one stops renewing and loses it within one lease.
// A renewal is fenced like every other write: when it matches no row, the
// lease is lost, lost is called, and the heartbeat stops. A renewal that
// fails for another reason (the database is away) is tried again a third
// of a lease later; meanwhile the lease may lapse, and then the next
// renewal finds it lost.
//
// Most operations end long before their first renewal is due, so the
// heartbeat is a timer, not a goroutine: nothing runs, and nothing has to
// be woken to stop it, unless the work outlasts a third of a lease. Each
// renewal runs in the timer's own goroutine and, when it is done, sets the
// timer for a third of a lease after it started (at once, if it took that
// long), so renewals never overlap and start on the ticker's cadence: one
// renewal is sent a third of a lease after the one before, which the
// database applied within a third (its timeout), so it lands at least a
// third of a lease before the lease it extended would lapse.
func (l *Lease) heartbeat(ctx context.Context, lost func()) (stop func()) {
	// The fields that name the lease never change while it is held; read
	// once, here, they are not shared with the phases that move the record.
	callerID, id, attempt := l.record.CallerID, l.record.ID, l.record.Attempt
	every := l.store.lease / 3
	var (
		// mu is held by a renewal for as long as it runs, and by stop:
		// once stop returns, no renewal is running and none will start,
		// so a renewal can never find the record completed after the
		// owner finished with it and call its lease lost.
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	renew := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || ctx.Err() != nil {
			return
		}
		started := time.Now()
		renewCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), every)
		n, err := queries.RenewIdempotencyKeyLease(renewCtx, l.store.pool, dbsqlc.RenewIdempotencyKeyLeaseParams{
			CallerID: callerID, ID: id, Attempt: attempt, LeaseSeconds: l.store.lease.Seconds(),
		})
		cancel()
		switch {
		case err != nil:
			l.store.log.WarnContext(ctx, "renew idempotency key lease", "err", err, "caller", callerID, "key_id", id)
		case n == 0:
			l.lost.Store(true)
			lost()
			return // no renewal after a lost one
		}
		timer.Reset(max(0, every-time.Since(started)))
	}
	mu.Lock() // a renewal due at once waits until timer is set
	timer = time.AfterFunc(every, renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
	}
}
