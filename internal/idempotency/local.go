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
// It runs again for a retry the replay cache does not hold (and rolls
// back), so it must do nothing outside tx.
type LocalFunc func(ctx context.Context, tx pgx.Tx) (*Response, error)

// ExecuteLocal runs the keyed request req, a local operation:
//
//  1. Run fn and insert the key's completed record in one transaction.
//  2. If the insert finds the key taken, the key has a record already: the
//     transaction rolls back, effect and all, and the request is answered
//     from that record: a replay, a 422 for a different request, a 409 for
//     an external operation's record still in progress. If the record was
//     a concurrent request's, the unique index made this insert wait for
//     its commit, so that one is a replay too.
//
// There is no look-up first: a new key, the common case, costs one round
// trip for a create (postgres.Later), and a replay the cache does not hold
// pays for the effect it rolls back.
func (s *Store) ExecuteLocal(ctx context.Context, req Request, fn LocalFunc) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// Detached, as an external operation's phases are: a client that hangs
	// up does not cut the transaction off halfway (it would roll back,
	// which is safe, but the work would be wasted on a retry). The phase's
	// span is the claim's sibling, as an external operation's phases are.
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	ctx, span := startClaim(ctx, req)
	defer span.End()
	// A second time only if the record in the way is gone by the time it
	// is read (swept, or deleted as abandoned, below).
	for range 2 {
		sent := s.replays.clock()
		resp, err := s.commitLocal(run, req, fn)
		if err != nil && !errors.Is(err, errKeyTaken) && !IsRetryable(err) {
			// A final failure: its effect rolled back, and the answer alone
			// is stored, so that every retry gets it too.
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
		case err == nil:
			observe(ctx, req.Operation, metrics.OutcomeNew)
			traceRecord(ctx, Record{Attempt: 1, RecoveryPoint: RecoveryStarted})
			s.replays.put(req, resp, sent, 0)
			return resp, nil
		case !errors.Is(err, errKeyTaken):
			return nil, err
		}
		if resp, err, found := s.answerFromRecord(ctx, req); found {
			return resp, err
		}
	}
	return nil, resumable()
}

// errKeyTaken is commitLocal's answer when the key has a record already.
var errKeyTaken = errors.New("idempotency: the key has a record already")

// commitLocal runs fn and inserts req's completed record, with fn's
// answer, in one transaction (postgres.TransactPipelined): the statements
// fn held for later (postgres.Later) go with the insert, and if fn sent
// none itself, that is the whole transaction in one round trip. The insert
// fails on a taken key, and nothing before it commits.
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
	switch {
	case errors.Is(err, errKeyTaken): // not a failure: the answer is the record's
		span.End()
		return nil, err
	case err != nil:
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

// answerFromRecord answers req from its key's record, if there is one
// (found). observed carries the claim's span.
func (s *Store) answerFromRecord(observed context.Context, req Request) (_ *Response, _ error, found bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(observed), cleanupTimeout)
	defer cancel()
	sent := s.replays.clock()
	row, err := queries.FindIdempotencyKey(ctx, s.pool, dbsqlc.FindIdempotencyKeyParams{CallerID: req.CallerID, Key: req.Key})
	switch {
	case postgres.IsNotFound(err):
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
