package idempotency

// The lease: the right of one owner to drive a record forward, its phases
// (each one transaction, fenced on the attempt), the heartbeat that keeps
// it, and what the reconciler does with the leases it takes.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

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

func (*Response) isResult() {}

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
