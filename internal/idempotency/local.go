package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// A local operation touches only this database (creating an order). Its
// effect and its record can commit in one transaction, so it needs none of
// what an operation with an outside effect needs: no in-progress record,
// no lease, no heartbeat, no recovery point, nothing for the reconciler. A
// crash before the commit leaves nothing behind, and the retry runs it
// afresh; a crash after it leaves the completed record, and the retry is a
// replay. It is the article's own rule: an operation with no foreign state
// mutation is one atomic phase.
//
// A LocalFunc writes the effect inside tx and returns the answer to store.
// It may return a *problem.Error, a final answer that is stored (its
// writes roll back); a transient error, which stores nothing; or any other
// error, stored as a 500, since running it again would only fail again.
type LocalFunc func(ctx context.Context, tx pgx.Tx) (*Response, error)

// ExecuteLocal runs the keyed request req, a local operation:
//
//  1. Look the key up. A record is answered from: a replay, a 422 for a
//     different request, a 409 for one still in progress (written by an
//     older version that claimed local operations too).
//  2. Otherwise run fn and insert the completed record in one transaction.
//  3. If the insert finds the key taken, a concurrent request under the
//     same key committed first: this one's transaction rolls back, effect
//     and all, and it answers as in step 1 from the record now there. The
//     unique index made it wait for the other's commit, so it is a replay.
func (s *Store) ExecuteLocal(ctx context.Context, req Request, fn LocalFunc) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	if resp, err, found := s.lookup(ctx, req); found {
		return resp, err
	}
	// Detached, as an external operation's phases are: a client that hangs
	// up does not cut the transaction off halfway (it would roll back,
	// which is safe, but the work would be wasted on a retry).
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	sent := s.replays.clock()
	resp, err := s.commitLocal(run, req, fn)
	if err != nil && !errors.Is(err, errKeyTaken) && !IsRetryable(err) {
		// A final failure: its effect rolled back, and the answer alone is
		// stored, so that every retry gets it too.
		var p *problem.Error
		if !errors.As(err, &p) {
			s.log.ErrorContext(ctx, "keyed operation failed", "err", err,
				"caller", req.CallerID, "method", req.Method, "path", req.Path)
			p = problem.New(problem.InternalError, "the request failed; it will not be retried under this Idempotency-Key")
		}
		failed := ProblemResponse(p)
		resp, err = s.commitLocal(run, req, func(context.Context, pgx.Tx) (*Response, error) { return failed, nil })
	}
	switch {
	case errors.Is(err, errKeyTaken):
		if resp, err, found := s.lookup(ctx, req); found {
			return resp, err
		}
		return nil, resumable() // the record that was there is gone already: the retry runs it
	case err != nil:
		return nil, err
	}
	observe(ctx, req.Operation, metrics.OutcomeNew)
	s.replays.put(req, resp, sent, 0)
	return resp, nil
}

// errKeyTaken is commitLocal's answer when another request's record under
// the same key committed first.
var errKeyTaken = errors.New("idempotency: key taken by a concurrent request")

// commitLocal runs fn and inserts req's completed record, with fn's
// answer, in one transaction. BEGIN goes with fn's first statement and
// COMMIT with the insert (postgres.TransactPipelined); the insert fails on
// a taken key, and the COMMIT behind it then never runs.
func (s *Store) commitLocal(ctx context.Context, req Request, fn LocalFunc) (*Response, error) {
	ctx, span := startPhase(ctx, Record{RecoveryPoint: RecoveryStarted, Attempt: 1})
	var resp *Response
	err := postgres.TransactPipelined(ctx, s.pool, func(tx *postgres.PipelinedTx) (err error) {
		if resp, err = runLocal(ctx, fn, tx); err != nil {
			return err
		}
		headers, err := encodeHeaders(resp.Header)
		if err != nil {
			return err
		}
		status := int32(resp.Status) // #nosec G115 -- an HTTP status code
		err = queries.InsertCompletedIdempotencyKey(ctx, tx.ThenCommit(), dbsqlc.InsertCompletedIdempotencyKeyParams{
			CallerID: req.CallerID, Key: req.Key, Operation: req.Operation, RequestMethod: req.Method, RequestPath: req.Path,
			RequestFingerprint: req.Fingerprint, ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
			Traceparent: postgres.Traceparent(ctx),
		})
		if keyTaken(err) {
			return errKeyTaken
		}
		return err
	})
	if err != nil {
		endWithError(span, err)
		return nil, err
	}
	if span.IsRecording() {
		span.SetAttributes(attrReachedPoint.String(string(RecoveryFinished)))
	}
	span.End()
	return resp, nil
}

// keyTaken says whether err is the key's unique index refusing a second
// record for one (caller, key).
func keyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "idempotency_keys_caller_id_key_key"
}

// runLocal runs fn, turning a panic into an error (a bug: stored as a 500).
func runLocal(ctx context.Context, fn LocalFunc, tx pgx.Tx) (resp *Response, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("local operation panic: %v\n%s", r, debug.Stack())
		}
	}()
	return fn(ctx, tx)
}

// lookup answers req from its key's record, if there is one (found).
func (s *Store) lookup(ctx context.Context, req Request) (_ *Response, _ error, found bool) {
	observed, span := startClaim(ctx, req)
	defer span.End()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(observed), cleanupTimeout)
	defer cancel()
	sent := s.replays.clock()
	row, err := queries.FindIdempotencyKey(ctx, s.pool, dbsqlc.FindIdempotencyKeyParams{CallerID: req.CallerID, Key: req.Key})
	switch {
	case postgres.IsNotFound(err):
		// New to the database. The outcome is counted once the record has
		// committed; a lost race for the key is a second lookup, a replay.
		traceOutcome(observed, metrics.OutcomeNew)
		traceRecord(observed, Record{Attempt: 1, RecoveryPoint: RecoveryStarted})
		return nil, nil, false
	case err != nil:
		return nil, fmt.Errorf("look up idempotency key: %w", err), true
	}
	rec := recordOf(row.IdempotencyKey)
	traceRecord(observed, rec)
	switch {
	case subtle.ConstantTimeCompare(rec.RequestFingerprint, req.Fingerprint) != 1:
		observe(observed, req.Operation, metrics.OutcomeMismatch)
		return nil, reused(rec.RequestMethod, rec.RequestPath), true
	case rec.Status == StatusCompleted:
		observe(observed, req.Operation, metrics.OutcomeReplayed)
		resp, err := s.replayStored(ctx, rec)
		if err == nil {
			s.replays.put(req, resp, sent, secondsOf(row.AgeSeconds))
		}
		return resp, err, true
	case rec.Status == StatusDead:
		observe(observed, req.Operation, metrics.OutcomeDead)
		return nil, dead(), true
	case row.LeaseRemainingSeconds > 0:
		observe(observed, req.Operation, metrics.OutcomeInProgress)
		return nil, (&busyError{rec: rec, leaseRemaining: row.LeaseRemainingSeconds}).problem(), true
	default:
		// A record in progress that nobody holds, left by an older version
		// (which claimed local operations too) whose owner died: nothing
		// was done, since its one phase never committed. Delete it, fenced
		// on its attempt, as the reconciler would, and run the operation.
		n, err := queries.AbandonIdempotencyKey(ctx, s.pool, dbsqlc.AbandonIdempotencyKeyParams{
			CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
		})
		switch {
		case err != nil:
			return nil, fmt.Errorf("abandon idempotency key: %w", err), true
		case n == 0: // someone else took it over or deleted it first
			observe(observed, req.Operation, metrics.OutcomeInProgress)
			return nil, resumable(), true
		}
		return nil, nil, false
	}
}
