package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// Lease is the right, held by one request (or worker) at a time, to drive
// one record forward from its recovery point.
type Lease struct {
	store    *Store
	record   Record
	response *Response
	// When the claim that gave this lease was sent (this process's clock)
	// and the record's age then (the database's): for the replay cache.
	claimed time.Time
	age     time.Duration
	// lost is set when a renewal matched no row: a newer attempt took the
	// record over, or the lease lapsed before the renewal came.
	lost atomic.Bool
}

// Record is the record as of the last phase this lease committed.
func (l *Lease) Record() Record { return l.record }

// RecoveryPoint is where the operation stands: where a Step resumes.
func (l *Lease) RecoveryPoint() RecoveryPoint { return l.record.RecoveryPoint }

// A PhaseFunc does one phase's work inside tx and says how it ended.
type PhaseFunc func(ctx context.Context, tx pgx.Tx) (Result, error)

// Result is how a phase ends: with the next RecoveryPoint, or the final *Response.
type Result interface{ isResult() }

func (RecoveryPoint) isResult() {}

func (*Response) isResult() {}

// Phase runs fn and the record's fenced update in one transaction, so the
// phase's effects and "this phase is done" commit together or not at all.
//
// The fenced update comes last and succeeds only while this attempt holds
// a live lease; otherwise it raises RS001 (migration 0023), which stops the
// COMMIT sent with it, and Phase returns ErrLeaseLost. A racing takeover
// waits on the update's row lock, then sees what this phase did: the
// record moves forward exactly once.
func (l *Lease) Phase(ctx context.Context, fn PhaseFunc) error {
	if l.lost.Load() {
		return ErrLeaseLost // a renewal found it lost: the write would be fenced out
	}
	ctx, span := startPhase(ctx, l.record)
	var result Result
	err := postgres.TransactPipelined(ctx, l.store.pool, func(tx *postgres.PipelinedTx) (err error) {
		result, err = l.write(ctx, tx, fn)
		return err
	})
	return l.committed(ctx, span, result, err)
}

// write runs fn in tx and writes its result to the record, fenced, with
// the COMMIT.
func (l *Lease) write(ctx context.Context, tx *postgres.PipelinedTx, fn PhaseFunc) (Result, error) {
	result, err := fn(ctx, tx)
	if err != nil {
		return nil, err
	}
	if _, final := result.(*Response); final && l.record.RecoveryPoint != RecoveryStarted && l.store.faults != nil {
		l.store.faults.BeforeFinalCommit(l.record)
	}
	return result, l.writeResult(ctx, tx, result) // held: it goes with the COMMIT
}

// committed ends a phase's span: with its error, or, once it committed,
// with the in-memory record moved on to its result (only now).
func (l *Lease) committed(ctx context.Context, span trace.Span, result Result, err error) error {
	if leaseLost(err) { // the fenced write, sent with the COMMIT
		err = ErrLeaseLost
	}
	if err != nil {
		endWithError(span, err)
		return err
	}
	switch r := result.(type) {
	case RecoveryPoint:
		l.record.RecoveryPoint = r
	case *Response:
		l.record.Status, l.record.RecoveryPoint, l.response = StatusCompleted, RecoveryFinished, r
	}
	annotate(ctx, attrReachedPoint.String(string(l.record.RecoveryPoint)))
	span.End()
	if l.store.faults != nil {
		l.store.faults.AfterPhase(l.record)
	}
	return nil
}

// writeResult writes a phase's result to the record, fenced on the
// attempt: ErrLeaseLost when this owner no longer holds a live lease.
func (l *Lease) writeResult(ctx context.Context, tx dbsqlc.DBTX, result Result) error {
	rec := l.record
	var err error
	switch r := result.(type) {
	case RecoveryPoint:
		err = queries.SetRecoveryPoint(ctx, tx, dbsqlc.SetRecoveryPointParams{
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
// its lease: idempotency_lease_lost()'s SQLSTATE (migration 0023).
func leaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RS001"
}

// heartbeat renews l's lease every third of a lease until stop is called
// or ctx ends: a live owner keeps it however long it works (up to MaxRun),
// a crashed one loses it within one lease. A renewal is fenced: when it
// matches no row, lost is called and the heartbeat stops. One that fails
// otherwise (the database is away) is tried again a third of a lease later.
//
// It is a timer, not a goroutine, since most operations end before their
// first renewal. Each renewal resets the timer for a third of a lease after
// it started, so renewals never overlap; applied within a third (its
// timeout), each lands at least a third of a lease before the lease it
// extends would lapse.
func (l *Lease) heartbeat(ctx context.Context, lost func()) (stop func()) {
	// Read once: not shared with the phases that move the record.
	callerID, id, attempt := l.record.CallerID, l.record.ID, l.record.Attempt
	every := l.store.lease / 3
	var (
		// mu is held by a renewal while it runs, and by stop: once stop
		// returns none is running or will start, so none can find the
		// record completed by its owner and call the lease lost.
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

// ClaimStale takes over, for the reconciler, up to n due in-progress
// records no live owner holds: those that never passed their first phase,
// and those of the given operations. Each goes to one reconciler only.
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

// unclaim gives a lease from ClaimStale up unused, for a reconciler that
// is stopping: anyone may take the record at once, and no try is counted.
func (l *Lease) unclaim() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	rec := l.record
	if _, err := queries.UnclaimIdempotencyKey(ctx, l.store.pool, dbsqlc.UnclaimIdempotencyKeyParams{
		CallerID: rec.CallerID, ID: rec.ID, Attempt: rec.Attempt,
	}); err != nil {
		l.store.log.WarnContext(ctx, "unclaim idempotency key", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}

// deleteUnstarted deletes a record that never passed its first phase (nothing was
// done), freeing its key. It returns ErrLeaseLost if the record moved on.
func (l *Lease) deleteUnstarted(ctx context.Context) error {
	return fenced(queries.DeleteUnstartedIdempotencyKey(ctx, l.store.pool, dbsqlc.DeleteUnstartedIdempotencyKeyParams{
		CallerID: l.record.CallerID, ID: l.record.ID, Attempt: l.record.Attempt,
	}))
}

// markDead marks the record dead, for an operator, or returns ErrLeaseLost if it moved on.
func (l *Lease) markDead(ctx context.Context) error {
	return fenced(queries.MarkIdempotencyKeyDead(ctx, l.store.pool, dbsqlc.MarkIdempotencyKeyDeadParams{
		CallerID: l.record.CallerID, ID: l.record.ID, Attempt: l.record.Attempt,
	}))
}

// fenced is a fenced write's error: ErrLeaseLost when it matched no row.
func fenced(n int64, err error) error {
	if err == nil && n == 0 {
		return ErrLeaseLost
	}
	return err
}
