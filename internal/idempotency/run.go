package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// A Step drives an owned operation from l.RecoveryPoint() to its final
// response, one l.Phase at a time. It runs for a fresh claim and for a
// takeover, so it must switch on the recovery point (the last owner's).
//
// Its error decides what is kept:
//   - nil: the last phase stored a response, which is returned.
//   - a transient error (IsRetryable): the lease is released, and the record
//     stays at its recovery point for a retry to resume. Nothing is stored:
//     a retry must not replay a failure that was not final.
//   - a *problem.Error: a final outcome (a business-rule conflict), stored
//     and replayed like a success.
//   - any other error (a bug, a panic) before the first phase committed:
//     nothing happened, so it is stored as a generic 500.
//   - any other error after it: an effect may be pending outside our
//     database (a charge at the processor), which a stored 500 would leave
//     unrecorded for ever. The record stays resumable (a 503), and the
//     reconciler marks it dead, for a person, if it keeps failing.
type Step func(ctx context.Context, l *Lease) error

// IsRetryable reports whether a Step's error leaves the operation resumable, not final.
func IsRetryable(err error) bool {
	var p *problem.Error
	if errors.As(err, &p) {
		return p.Status() == http.StatusServiceUnavailable
	}
	return postgres.IsTransient(err)
}

// Drive runs h on a lease already held (a claim's, or ClaimStale's) and
// settles the outcome as Step says. A retryable failure releases the lease
// at once, and the reconciler's next try is scheduled reconcileAfter later.
func (s *Store) Drive(ctx context.Context, lease *Lease, h Step, reconcileAfter time.Duration) (*Response, error) {
	// If a renewal finds the lease lost, the step's context is canceled
	// (a processor call in flight is abandoned: the new owner learns its
	// outcome, under the same downstream key) and its next phase refused.
	work, cancelWork := context.WithCancel(ctx)
	stopHeartbeat := lease.heartbeat(work, cancelWork)
	err := func() (err error) {
		defer recoverPanic("step", &err)
		return h(work, lease)
	}()
	stopHeartbeat()
	cancelWork()
	rec := lease.record
	log := func(level slog.Level, msg string, err error) {
		s.log.Log(ctx, level, msg, "err", err, "caller", rec.CallerID, "path", rec.RequestPath, "recovery_point", rec.RecoveryPoint, "attempt", rec.Attempt)
	}
	switch {
	case err == nil && lease.response != nil:
		return lease.response, nil
	case lease.lost.Load() || errors.Is(err, ErrLeaseLost):
		// Fenced out (its last phase rolled back), or a renewal found the
		// lease lost, whatever the step's error says about the call it
		// was cut off in. Rare, and a sign of a stalled owner: logged.
		log(slog.LevelWarn, "keyed operation's owner lost its lease", err)
		return s.current(ctx, lease.record)
	case err == nil:
		err = fmt.Errorf("idempotency: step for %s %s returned without a response", rec.RequestMethod, rec.RequestPath)
	case errors.Is(err, ErrDead):
		log(slog.LevelError, "keyed operation dead, left for an operator", err)
		deadCtx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		switch berr := lease.markDead(deadCtx); {
		case errors.Is(berr, ErrLeaseLost):
			return s.current(ctx, lease.record)
		case berr != nil:
			// Left resumable: the reconciler meets the same answer again.
			s.releaseForRetry(lease, reconcileAfter)
			return nil, errors.Join(berr, err)
		}
		metrics.DeadLetters.WithLabelValues(metrics.DeadLetterOperation).Inc()
		return nil, deadAnswer()
	case IsRetryable(err):
		log(slog.LevelWarn, "keyed operation left resumable", err)
		s.releaseForRetry(lease, reconcileAfter)
		return nil, err
	case !errors.As(err, new(*problem.Error)) && rec.RecoveryPoint != RecoveryStarted:
		log(slog.LevelError, "keyed operation failed after its first phase; left resumable, not final", err)
		s.releaseForRetry(lease, reconcileAfter)
		return nil, errors.Join(resumable("now"), err)
	}
	// A final outcome: store it, so that every retry gets the same answer.
	resp := s.finalAnswer(ctx, err, "caller", rec.CallerID, "method", rec.RequestMethod, "path", rec.RequestPath, "attempt", rec.Attempt)
	storeCtx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	err = postgres.Transact(storeCtx, s.pool, func(tx pgx.Tx) error { return lease.writeResult(storeCtx, tx, resp) })
	switch {
	case errors.Is(err, ErrLeaseLost):
		return s.current(ctx, lease.record)
	case err != nil:
		s.releaseForRetry(lease, reconcileAfter)
		return nil, err
	}
	return resp, nil
}

// finalAnswer is the response stored for err, a final failure: its
// problem, or a generic 500 for a bug (logged, with attrs).
func (s *Store) finalAnswer(ctx context.Context, err error, attrs ...any) *Response {
	var p *problem.Error
	if !errors.As(err, &p) {
		s.log.ErrorContext(ctx, "keyed operation failed", append([]any{"err", err}, attrs...)...)
		p = problem.New(problem.InternalError, "the request failed; it will not be retried under this Idempotency-Key")
	}
	return ProblemResponse(p)
}

// current answers from what the record says now, for a request that could
// not drive it (fenced out, or beaten to a takeover): another owner's stored
// response, a replay whatever this request's claim found; a 409 while another
// owner holds it; else (its lease ran out, nobody took it) a 503 to resume it.
func (s *Store) current(reqCtx context.Context, rec Record) (*Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	row, err := queries.GetIdempotencyKeyWithLease(ctx, s.pool, dbsqlc.GetIdempotencyKeyWithLeaseParams{CallerID: rec.CallerID, ID: rec.ID})
	switch {
	case postgres.IsNotFound(err):
		// The reconciler freed a key whose first phase never committed.
		return nil, resumable("in time")
	case err != nil:
		return nil, fmt.Errorf("read idempotency key after losing its lease: %w", err)
	}
	cur := recordOf(row.IdempotencyKey)
	switch decide(cur, rec.RequestFingerprint, row.LeaseRemainingSeconds) {
	case OutcomeReplayed:
		retell(reqCtx, OutcomeReplayed)
		return s.replayStored(ctx, cur)
	case OutcomeDead:
		return nil, deadAnswer()
	case OutcomeInProgress:
		return nil, &busyError{rec: cur, leaseRemaining: row.LeaseRemainingSeconds}
	default: // its lease lapsed: a retry takes it over (a mismatch cannot
		// be: the fingerprint is the record's own)
		return nil, resumable("in time")
	}
}

// recoverPanic, deferred, turns a panic into *err. A panic is a bug, so it
// is treated like any unexpected error (see Step and LocalFunc).
func recoverPanic(what string, err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%s panic: %v\n%s", what, r, debug.Stack())
	}
}

// releaseForRetry gives the lease up now, for a client's retry, and schedules the
// reconciler's next try. Best effort: if it fails, the lease expires.
func (s *Store) releaseForRetry(l *Lease, reconcileAfter time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	rec := l.record
	if _, err := queries.ReleaseIdempotencyKey(ctx, s.pool, dbsqlc.ReleaseIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt, ReconcileAfterSeconds: reconcileAfter.Seconds(),
	}); err != nil {
		s.log.WarnContext(ctx, "release idempotency key", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}
