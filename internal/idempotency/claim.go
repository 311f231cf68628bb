package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// Execute runs the keyed request req, an operation with an outside effect:
// it claims the key with the operation's first phase, start, in one
// transaction (Store.start), or finds the key taken and answers from the
// record (replay, 409, 422) or takes it over; then, as the owner, it runs
// h from the recovery point reached. An error is a problem that was not
// stored.
func (s *Store) Execute(ctx context.Context, req Request, start StartFunc, h Handler) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// From here on, only waiting for another's answer heeds the client's cancellation.
	observed, span := startClaim(ctx, req)
	lease, resp, err := s.start(ctx, observed, req, start)
	if errors.Is(err, errKeyTaken) {
		lease, resp, err = s.claimAs(observed, req)
	}
	span.End() // a no-op if start ended it, before its first phase
	if lease != nil {
		resp, err = s.run(ctx, req, lease, h)
	}
	// A live owner holds the key (found by the claim, or by an owner that
	// lost its lease to it): wait for its answer, or say when to retry.
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

// fromCache answers req from the replay cache, if its key is there (ok),
// without the database (replays.go says why that is safe).
func (s *Store) fromCache(ctx context.Context, req Request) (_ *Response, _ error, ok bool) {
	cached, ok := s.replays.get(req.CallerID, req.Key)
	if !ok {
		return nil, nil, false
	}
	ctx, span := startClaim(ctx, req)
	defer span.End()
	annotate(ctx, attrReplayCache.Bool(true))
	resp, err := replayCached(ctx, req, cached)
	return resp, err, true
}

// replayCached answers req from the cache as the claim would from the record: a 422, or the response.
func replayCached(ctx context.Context, req Request, cached *cachedReplay) (*Response, error) {
	if subtle.ConstantTimeCompare(cached.fingerprint, req.Fingerprint) != 1 {
		observe(ctx, req.Operation, metrics.OutcomeMismatch)
		return nil, reused(cached.method, cached.path)
	}
	observe(ctx, req.Operation, metrics.OutcomeReplayed)
	metrics.ReplayCacheHits.Inc()
	return cached.response(), nil
}

// claim takes the key for req, or answers from the existing record.
func (s *Store) claim(ctx context.Context, req Request) (*Lease, *Response, error) {
	observed, span := startClaim(ctx, req)
	defer span.End()
	return s.claimAs(observed, req)
}

// claimAs is claim under the claim's span, observed.
func (s *Store) claimAs(observed context.Context, req Request) (*Lease, *Response, error) {
	// Detached: a claim cut off halfway could commit without this request
	// learning that it owns the key, leaving it leased to nobody. A later
	// resumption links to the request's span, not the claim's.
	traceparent := postgres.Traceparent(observed)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(observed), cleanupTimeout)
	defer cancel()
	var row dbsqlc.ClaimIdempotencyKeyRow
	var err error
	// No row only when a concurrent request committed the key between this
	// statement's snapshot and its insert; running it again sees that row.
	// Twice is enough; a third try is for safety, not need.
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
	if subtle.ConstantTimeCompare(rec.RequestFingerprint, req.Fingerprint) != 1 {
		observe(observed, req.Operation, metrics.OutcomeMismatch)
		return nil, nil, reused(rec.RequestMethod, rec.RequestPath)
	}
	switch {
	case rec.Status == StatusCompleted:
		observe(observed, req.Operation, metrics.OutcomeReplayed)
		resp, err := storedResponse(rec) // confirmed replicated by the claim
		if err == nil {
			s.replays.put(req, resp, sent, age)
		}
		return nil, resp, err
	case rec.Status == StatusInProgress && row.LeaseExpired:
		// Its owner crashed, stalled past its lease, or gave up after a
		// transient failure. Take over and resume now, whatever the
		// reconciler's schedule: this is the caller asking again.
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
		newer := recordOf(taken)
		traceRecord(observed, newer)
		// A lease released after a transient failure ends in the statement
		// that stamps updated_at; one that ran out ended later than its last
		// write, and belonged to an owner that died or stalled.
		if rec.LockedUntil == nil || !rec.LockedUntil.After(rec.UpdatedAt) {
			observe(observed, req.Operation, metrics.OutcomeResumed)
		} else {
			observe(observed, req.Operation, metrics.OutcomeTakenOver)
		}
		return &Lease{store: s, record: newer, claimed: sent, age: age}, nil, nil
	case rec.Status == StatusDead:
		observe(observed, req.Operation, metrics.OutcomeDead)
		return nil, nil, dead()
	default:
		// A live owner holds it. Counted by the caller if it answers 409: waiting may yet answer.
		annotate(observed, attrOutcome.String(metrics.OutcomeInProgress))
		return nil, nil, &busyError{rec: rec, leaseRemaining: row.LeaseRemainingSeconds}
	}
}

// A StartFunc is an external operation's first phase: it runs in the
// transaction that claims the key, with the record just inserted, and
// returns the recovery point it reached, or a final answer.
type StartFunc func(ctx context.Context, tx pgx.Tx, rec Record) (Result, error)

// start claims req's key and runs the first phase in one transaction, so
// that a charge's claim and its create commit together: one commit, and
// round trips fewer. The key's check and the record's insert go first, so
// that a duplicate waits on the key's index before it locks anything.
//
// How the phase's error is kept differs from a later phase's (Handler),
// because here it rolls the claim back with it: a 404 (the request names
// nothing that exists) or a transient error stores nothing, and the key
// stays free for a corrected request or a retry; any other problem, or a
// bug's 500, is stored as the final answer in a transaction of its own.
// errKeyTaken means the key has a record: Execute claims it as a retry.
func (s *Store) start(ctx, observed context.Context, req Request, start StartFunc) (*Lease, *Response, error) {
	traceparent := postgres.Traceparent(ctx)
	// Detached, and bounded by MaxRun, as run is: a client hanging up must
	// not cut a transaction whose claim may commit. The phase's span is the
	// claim's sibling, as a later phase's is.
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	sent := s.replays.clock()
	var lease *Lease
	var result Result
	err := postgres.TransactPipelined(run, s.pool, func(tx *postgres.PipelinedTx) (err error) {
		defer recoverPanic("first phase", &err)
		err = queries.CheckIdempotencyKeyFree(run, tx, dbsqlc.CheckIdempotencyKeyFreeParams{CallerID: req.CallerID, Key: req.Key})
		if err != nil {
			return err
		}
		row, err := queries.InsertIdempotencyKey(run, tx, dbsqlc.InsertIdempotencyKeyParams{
			CallerID: req.CallerID, Key: req.Key, Operation: req.Operation, RequestMethod: req.Method, RequestPath: req.Path,
			RequestFingerprint: req.Fingerprint, LeaseSeconds: s.lease.Seconds(), Traceparent: traceparent,
		})
		if err != nil {
			return err
		}
		lease = &Lease{store: s, record: recordOf(row), claimed: sent}
		traceRecord(observed, lease.record)
		observe(observed, req.Operation, metrics.OutcomeNew)
		trace.SpanFromContext(observed).End() // the claim is made; the phase follows
		ctx, span := startPhase(run, lease.record)
		defer span.End()
		if result, err = start(ctx, tx, lease.record); err == nil {
			err = lease.writeResult(ctx, tx.ThenCommit(), result)
		}
		if err != nil {
			endWithError(span, err)
			return err
		}
		if p, ok := result.(RecoveryPoint); ok {
			annotate(ctx, attrReachedPoint.String(string(p)))
		} else {
			annotate(ctx, attrReachedPoint.String(string(RecoveryFinished)))
		}
		return nil
	})
	var p *problem.Error
	switch {
	case keyTaken(err):
		return nil, nil, errKeyTaken
	case err == nil:
		switch r := result.(type) {
		case RecoveryPoint:
			lease.record.RecoveryPoint = r
		case *Response:
			lease.record.Status, lease.record.RecoveryPoint, lease.response = StatusCompleted, RecoveryFinished, r
		}
		if s.faults != nil {
			s.faults.AfterPhase(lease.record)
		}
		return lease, nil, nil
	case errors.As(err, &p) && p.Status() == http.StatusNotFound, IsRetryable(err):
		return nil, nil, err
	case errors.Is(err, ErrLeaseLost):
		// The phase outlasted its lease (nobody could take it: the claim
		// was not committed); all of it rolled back. A retry starts anew.
		return nil, nil, resumable("now")
	}
	// A final failure: its effect and its claim rolled back, its answer alone is stored.
	failed := s.finalAnswer(observed, err, "caller", req.CallerID, "method", req.Method, "path", req.Path)
	resp, err := s.commitLocal(run, req, func(context.Context, pgx.Tx) (*Response, error) { return failed, nil })
	if errors.Is(err, errKeyTaken) { // a duplicate claimed it meanwhile
		return nil, nil, err
	}
	return nil, resp, err
}

// busyError is a record a live owner holds, for leaseRemaining seconds.
type busyError struct {
	rec            Record
	leaseRemaining float64
}

func (e *busyError) Error() string {
	return fmt.Sprintf("idempotency: record %d is in progress under a live lease (%.1fs left)", e.rec.ID, e.leaseRemaining)
}

// problem is the 409 for a busy record. Retry-After is a second or two
// (an operation takes seconds, and a retry waits on the server again), and
// no later than the lease could lapse, to take over from a dead owner.
func (e *busyError) problem() *problem.Error {
	p := problem.New(problem.IdempotencyKeyInUse,
		"a request with this Idempotency-Key is still being processed; retry with the same key after the Retry-After delay to receive its result")
	p.RetryAfter = max(1, min(2, int(math.Ceil(e.leaseRemaining))))
	return p
}
