package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// A LocalFunc writes the effect inside tx and returns the answer to store.
// A *problem.Error is a final answer, stored (its writes roll back); a
// transient error stores nothing; any other error is stored as a 500. It
// runs again (and rolls back) for a retry the replay cache does not hold,
// so it must do nothing outside tx.
type LocalFunc func(ctx context.Context, tx pgx.Tx) (*Response, error)

// serveLocal runs req, a local operation: fn's effect and the key's
// completed record commit in one transaction, with no look-up first. If
// the key has a record already (a concurrent copy's too: the unique index
// made this insert wait for its commit), it all rolls back, and found
// answers from the record.
func (s *Store) serveLocal(ctx context.Context, req Request, fn LocalFunc) (*Response, error) {
	if resp, err, ok := s.fromCache(ctx, req); ok {
		return resp, err
	}
	// Detached, as an external operation's phases are (a client hanging up
	// would waste the work), and its span is the claim's sibling, as theirs.
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.maxRun)
	defer cancel()
	ctx, span := startClaim(ctx, req)
	defer span.End()
	// Again only if the record in the way is gone when read (swept, or deleted below).
	for range 2 {
		sent := s.replays.clock()
		resp, err := s.commitLocal(run, req, fn)
		if err != nil && !errors.Is(err, errKeyTaken) && !IsRetryable(err) {
			// A final failure: its effect rolled back, its answer alone is stored.
			failed := s.finalAnswer(ctx, err, "caller", req.CallerID, "method", req.Method, "path", req.Path)
			resp, err = s.commitLocal(run, req, func(context.Context, pgx.Tx) (*Response, error) { return failed, nil })
		}
		switch {
		case err == nil:
			observe(ctx, req.Operation, OutcomeNew)
			traceRecord(ctx, Record{Attempt: 1, RecoveryPoint: RecoveryStarted})
			s.replays.put(req, resp, sent, 0)
			return resp, nil
		case !errors.Is(err, errKeyTaken):
			return nil, err
		}
		lease, resp, err := s.found(ctx, req)
		var busy *busyError
		switch {
		case errors.As(err, &busy):
			observe(ctx, req.Operation, OutcomeInProgress)
			return nil, busy.problem()
		case lease != nil:
			// Left in progress by an older version (which claimed local
			// operations too) whose owner died: its one phase never
			// committed. Delete it, as the reconciler would, and run again.
			if err := lease.deleteUnstarted(ctx); err != nil && !errors.Is(err, ErrLeaseLost) {
				return nil, fmt.Errorf("delete unstarted idempotency key: %w", err)
			}
		case !errors.Is(err, errNoRecord):
			return resp, err
		}
	}
	return nil, resumable("in time")
}

// errKeyTaken is commitLocal's answer when the key has a record already.
var errKeyTaken = errors.New("idempotency: the key has a record already")

// commitLocal runs fn and inserts req's completed record in one
// transaction, after a check that the key is free.
func (s *Store) commitLocal(ctx context.Context, req Request, fn LocalFunc) (*Response, error) {
	ctx, span := startPhase(ctx, Record{RecoveryPoint: RecoveryStarted, Attempt: 1})
	var resp *Response
	err := postgres.TransactPipelined(ctx, s.pool, func(tx *postgres.PipelinedTx) (err error) {
		defer recoverPanic("local operation", &err)
		// A retry whose key has a record stops here, having written nothing.
		if err = queries.CheckIdempotencyKeyFree(ctx, tx, dbsqlc.CheckIdempotencyKeyFreeParams{CallerID: req.CallerID, Key: req.Key}); err != nil {
			return err
		}
		if resp, err = fn(ctx, tx); err != nil {
			return err
		}
		headers, err := encodeHeaders(resp.Header)
		if err != nil {
			return err
		}
		status := int32(resp.Status) // #nosec G115 -- an HTTP status code
		return queries.InsertCompletedIdempotencyKey(ctx, tx, dbsqlc.InsertCompletedIdempotencyKeyParams{
			CallerID: req.CallerID, Key: req.Key, Operation: req.Operation, RequestMethod: req.Method, RequestPath: req.Path,
			RequestFingerprint: req.Fingerprint, ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
			Traceparent: postgres.Traceparent(ctx),
		})
	})
	switch {
	case keyTaken(err): // not a failure: the answer is the record's
		span.End()
		return nil, errKeyTaken
	case err != nil:
		endWithError(span, err)
		return nil, err
	}
	annotate(ctx, attrReachedPoint.String(string(RecoveryFinished)))
	span.End()
	return resp, nil
}

// keyTaken says whether err says the key has a record: the check's
// RS003, or (when two requests found it free at once) the unique index on
// (caller, key). Either may surface from fn's statements, sent with them.
func keyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "RS003" ||
		pgErr.Code == "23505" && pgErr.ConstraintName == "idempotency_keys_caller_id_key_key")
}
