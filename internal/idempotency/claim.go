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

// serveExternal runs the keyed request req, an operation with an outside effect:
// it claims the key with the operation's first phase, start, in one
// transaction (Store.start), or finds the key taken and answers from the
// record (replay, 409, 422) or takes it over; then, as the owner, it runs
// h from the recovery point reached. An error is a problem that was not
// stored.
func (s *Store) serveExternal(ctx context.Context, req Request, start StartFunc, h Step) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// From here on, only waiting for another's answer heeds the client's cancellation.
	observed, span := startClaim(ctx, req)
	lease, resp, err := s.start(ctx, observed, req, start)
	// Again only if the record in the way is gone when read (swept).
	for try := 0; errors.Is(err, errKeyTaken) && try < 2; try++ {
		if lease, resp, err = s.found(observed, req); errors.Is(err, errNoRecord) {
			lease, resp, err = s.start(ctx, observed, req, start)
		}
	}
	if errors.Is(err, errKeyTaken) || errors.Is(err, errNoRecord) {
		err = resumable("in time")
	}
	span.End() // a no-op if start ended it, before its first phase
	if lease != nil {
		resp, err = s.driveFor(ctx, req, lease, h)
	}
	// A live owner holds the key (found by the claim, or by an owner that
	// lost its lease to it): wait for its answer, or say when to retry.
	var busy *busyError
	if errors.As(err, &busy) && s.wait > 0 {
		resp, err = s.waitForOriginal(ctx, req, h, busy)
	}
	if errors.As(err, &busy) {
		observe(ctx, req.Operation, OutcomeInProgress)
		return nil, busy.problem()
	}
	return resp, err
}

// driveFor drives the operation lease holds to its answer, for req: detached
// from the client's cancellation and bounded by MaxRun however long it
// renews. A retryable failure releases the lease at once, so the client's
// retry finds the record free; the reconciler waits a lease before it steps in.
func (s *Store) driveFor(ctx context.Context, req Request, lease *Lease, h Step) (*Response, error) {
	if s.faults != nil {
		s.faults.AfterClaim(lease.record)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	resp, err := s.Drive(ctx, lease, h, s.lease)
	if err == nil { // a completed record: this lease's, or its fencer's
		s.replays.put(req, resp, lease.claimed, lease.age)
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

// replayCached answers req from the cache as found would from the
// record (a completed one): a 422, or the response.
func replayCached(ctx context.Context, req Request, cached *cachedReplay) (*Response, error) {
	if decide(Record{Status: StatusCompleted, RequestFingerprint: cached.fingerprint}, req.Fingerprint, 0) == OutcomeMismatch {
		observe(ctx, req.Operation, OutcomeMismatch)
		return nil, reused(cached.method, cached.path)
	}
	observe(ctx, req.Operation, OutcomeReplayed)
	metrics.ReplayCacheHits.Inc()
	return cached.response(), nil
}

// What a keyed request met, as counted (payments_idempotency_outcomes_total)
// and answered (the Idempotency-Outcome header).
const (
	OutcomeNew        = "new"         // the first request with this key: it runs the operation
	OutcomeReplayed   = "replayed"    // the stored response, replayed
	OutcomeInProgress = "in_progress" // a live owner holds it: wait, or 409 with Retry-After
	OutcomeMismatch   = "mismatch"    // the key was used for another request: 422
	OutcomeResumed    = "resumed"     // nobody held it (released after a transient failure): resumed at once
	OutcomeTakenOver  = "taken_over"  // its owner's lease ran out (a crash, a stall): taken over and resumed
	OutcomeDead       = "dead"        // dead, left for an operator: 409
)

// decide is what rec, its lease with leaseRemaining seconds left, means to
// a request with fingerprint: the one decision, which every path that
// meets a record takes (found, current, the replay cache).
func decide(rec Record, fingerprint []byte, leaseRemaining float64) string {
	switch {
	case subtle.ConstantTimeCompare(rec.RequestFingerprint, fingerprint) != 1:
		return OutcomeMismatch
	case rec.Status == StatusCompleted:
		return OutcomeReplayed
	case rec.Status == StatusDead:
		return OutcomeDead
	case leaseRemaining > 0:
		return OutcomeInProgress
	case rec.LockedUntil == nil || !rec.LockedUntil.After(rec.UpdatedAt):
		// Released (a transient failure) by its last write, which stamped
		// updated_at; else it ran out: its owner died or stalled.
		return OutcomeResumed
	}
	return OutcomeTakenOver
}

// found looks up req's record and answers as decide says: a *busyError is
// waited on, or a 409; a lease, taken over, is the caller's to drive (a
// local operation's caller deletes it). errNoRecord: there is none.
func (s *Store) found(observed context.Context, req Request) (*Lease, *Response, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(observed), cleanupTimeout)
	defer cancel()
	sent := s.replays.clock()
	row, err := queries.FindIdempotencyKey(ctx, s.pool, dbsqlc.FindIdempotencyKeyParams{CallerID: req.CallerID, Key: req.Key})
	switch {
	case postgres.IsNotFound(err):
		return nil, nil, errNoRecord
	case err != nil:
		return nil, nil, fmt.Errorf("look up idempotency key: %w", err)
	}
	rec, age := recordOf(row.IdempotencyKey), secondsOf(row.AgeSeconds)
	traceRecord(observed, rec)
	outcome := decide(rec, req.Fingerprint, row.LeaseRemainingSeconds)
	switch outcome {
	case OutcomeMismatch:
		observe(observed, req.Operation, outcome)
		return nil, nil, reused(rec.RequestMethod, rec.RequestPath)
	case OutcomeReplayed:
		observe(observed, req.Operation, outcome)
		resp, err := storedResponse(rec)
		if err == nil {
			s.replays.put(req, resp, sent, age)
		}
		return nil, resp, err
	case OutcomeDead:
		observe(observed, req.Operation, outcome)
		return nil, nil, deadAnswer()
	case OutcomeInProgress:
		// Counted by the caller if it answers 409 (waiting may answer).
		annotate(observed, attrOutcome.String(outcome))
		return nil, nil, &busyError{rec: rec, leaseRemaining: row.LeaseRemainingSeconds}
	}
	// Take over now, whatever the reconciler's schedule: a caller asks.
	taken, err := queries.TakeOverIdempotencyKey(ctx, s.pool, dbsqlc.TakeOverIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt, LeaseSeconds: s.lease.Seconds(),
	})
	if postgres.IsNotFound(err) {
		// Another request, or the reconciler, took it first.
		resp, err := s.current(observed, rec)
		if resp != nil {
			observe(observed, req.Operation, OutcomeReplayed)
		}
		return nil, resp, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("take over idempotency key: %w", err)
	}
	newer := recordOf(taken)
	traceRecord(observed, newer)
	observe(observed, req.Operation, outcome) // resumed, or taken over
	return &Lease{store: s, record: newer, claimed: sent, age: age}, nil, nil
}

// errNoRecord is found's answer when the key has no record (any more).
var errNoRecord = errors.New("idempotency: the key has no record")

// A StartFunc is an external operation's first phase: it runs in the
// transaction that claims the key, with the record just inserted, and
// returns the recovery point it reached, or a final answer.
type StartFunc func(ctx context.Context, tx pgx.Tx, rec Record) (Result, error)

// start claims req's key and runs the first phase in one transaction, so
// that a charge's claim and its create commit together: one commit, and
// round trips fewer. The key's check and the record's insert go first, so
// that a duplicate waits on the key's index before it locks anything.
//
// How the phase's error is kept differs from a later phase's (Step),
// because here it rolls the claim back with it: a 404 (the request names
// nothing that exists) or a transient error stores nothing, and the key
// stays free for a corrected request or a retry; any other problem, or a
// bug's 500, is stored as the final answer in a transaction of its own.
// errKeyTaken means the key has a record: serveExternal claims it as a retry.
func (s *Store) start(ctx, observed context.Context, req Request, start StartFunc) (*Lease, *Response, error) {
	traceparent := postgres.Traceparent(ctx)
	// Detached, and bounded by MaxRun, as driveFor is: a client hanging up must
	// not cut a transaction whose claim may commit. The phase's span is the
	// claim's sibling, as a later phase's is.
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	sent := s.replays.clock()
	var (
		lease  *Lease
		result Result
		span   trace.Span
		phase  context.Context
	)
	err := postgres.TransactPipelined(run, s.pool, func(tx *postgres.PipelinedTx) (err error) {
		defer recoverPanic("first phase", &err)
		if err = queries.CheckIdempotencyKeyFree(run, tx, dbsqlc.CheckIdempotencyKeyFreeParams{CallerID: req.CallerID, Key: req.Key}); err != nil {
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
		observe(observed, req.Operation, OutcomeNew)
		trace.SpanFromContext(observed).End() // the claim is made; the phase follows
		phase, span = startPhase(run, lease.record)
		result, err = lease.write(phase, tx, func(ctx context.Context, tx pgx.Tx) (Result, error) { return start(ctx, tx, lease.record) })
		return err
	})
	if span != nil && lease.committed(phase, span, result, err) == nil {
		return lease, nil, nil
	}
	var p *problem.Error
	switch {
	case keyTaken(err):
		return nil, nil, errKeyTaken
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
