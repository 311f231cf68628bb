package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// Execute runs the keyed request req, an operation with an outside effect:
// it claims the key and either answers from the record (replay, 409, 422)
// or runs h as the owner. An error is a problem that was not stored.
func (s *Store) Execute(ctx context.Context, req Request, h Handler) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// From here on, only waiting for another's answer heeds the client's cancellation.
	lease, resp, err := s.claim(ctx, req)
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
	// Detached: a claim cut off halfway could commit without this request
	// learning that it owns the key, leaving it leased to nobody. A later
	// resumption links to the request's span, not the claim's.
	traceparent := postgres.Traceparent(ctx)
	observed, span := startClaim(ctx, req)
	defer span.End()
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
		resp, err := s.replayStored(ctx, rec)
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
