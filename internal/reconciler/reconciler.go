// Package reconciler finishes operations that nobody is finishing: keyed
// requests whose owner crashed, or that stopped at a recovery point after a
// transient failure and whose client never came back. It takes such records
// over (a new attempt, fencing out the old owner) and drives them to
// completion from their recovery point, with backoff between tries, and
// sets aside for a person those that keep failing.
//
// Several reconcilers (one per server replica) can run at once: each claim
// uses FOR UPDATE SKIP LOCKED, so a record goes to one of them.
package reconciler

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/retry"
)

// Config tunes the reconciler.
type Config struct {
	// Interval is the pause between scans that found nothing to do.
	Interval time.Duration
	// Batch is the most records claimed per scan.
	Batch int
	// Lease bounds one record's run, as for a request.
	Lease time.Duration
	// MaxAttempts and MaxAge decide when a record is set aside (status
	// dead) instead of tried again. MaxAttempts counts the reconciler's own
	// tries (reconciler_attempts), not a client's retries: a client
	// retrying through an outage must not use up the reconciler's patience.
	MaxAttempts int32
	MaxAge      time.Duration
	// BackoffBase and BackoffCap shape the delay before the next try after
	// a transient failure: full jitter, random(0, min(cap, base·2^attempt)).
	BackoffBase, BackoffCap time.Duration
	// RetriesPerScan and RetryBurst are the retry budget: every record the
	// reconciler takes is a retry, so it may take at most RetriesPerScan
	// more per scan, saved up to RetryBurst. During an outage of the
	// processor this caps the load the reconciler adds to it.
	RetriesPerScan, RetryBurst int
}

// Reconciler is the background worker.
type Reconciler struct {
	cfg     Config
	budget  *retry.Budget
	store   *idempotency.Store
	charges charges.Deps
	log     *slog.Logger
}

// New returns a reconciler over store, resuming charges with deps.
func New(cfg Config, store *idempotency.Store, deps charges.Deps, log *slog.Logger) *Reconciler {
	return &Reconciler{cfg: cfg, budget: retry.NewBudget(0, cfg.RetryBurst), store: store, charges: deps, log: log}
}

// Run scans until ctx is done.
func (r *Reconciler) Run(ctx context.Context) {
	for {
		n, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "reconciler scan failed", "err", err)
		}
		if n == r.cfg.Batch && err == nil {
			continue // a full batch: there may be more (the budget still applies)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Interval):
		}
	}
}

// RunOnce claims one batch of stale records and handles each; it returns
// how many it claimed.
func (r *Reconciler) RunOnce(ctx context.Context) (int, error) {
	r.budget.Deposit(r.cfg.RetriesPerScan)
	allowed := r.budget.SpendUpTo(r.cfg.Batch)
	if allowed == 0 {
		return 0, nil // out of budget: the records wait for a later scan
	}
	leases, err := r.store.ClaimStale(ctx, allowed)
	if err != nil {
		r.budget.Deposit(allowed)
		return 0, err
	}
	r.budget.Deposit(allowed - len(leases)) // only what was used is spent
	for _, l := range leases {
		if ctx.Err() != nil {
			// Stopping: the claimed records not yet handled keep their
			// lease and are taken over once it runs out.
			break
		}
		r.reconcile(ctx, l)
	}
	return len(leases), nil
}

func (r *Reconciler) reconcile(ctx context.Context, l *idempotency.Lease) {
	rec := l.Record()
	log := r.log.With("caller", rec.CallerID, "key_id", rec.ID, "path", rec.RequestPath,
		"recovery_point", rec.RecoveryPoint, "attempt", rec.Attempt)
	// A record started is finished even if the reconciler is told to stop
	// meanwhile (its writes must not be cut off halfway), bounded by the
	// lease like any request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Lease)
	defer cancel()

	// The age is judged on this process's clock; MaxAge is hours, so the
	// skew between replicas does not matter here (leases use the
	// database's clock).
	if rec.ReconcilerAttempts > r.cfg.MaxAttempts || time.Since(rec.CreatedAt) > r.cfg.MaxAge {
		if err := l.Bury(ctx); err != nil {
			log.WarnContext(ctx, "reconciler: set aside failed", "err", err)
			return
		}
		log.WarnContext(ctx, "reconciler: operation set aside for an operator (dead)")
		return
	}

	// Past their first phase, charges and refunds carry everything a resume
	// needs in their own rows, so the handler needs only the caller.
	var resume idempotency.Handler
	switch l.RecoveryPoint() {
	case idempotency.RecoveryStarted:
		// The first phase never committed, so nothing happened, locally or
		// at the processor. Free the key; a client retry runs afresh.
		if err := l.Abandon(ctx); err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
			log.WarnContext(ctx, "reconciler: abandon failed", "err", err)
			return
		}
		log.InfoContext(ctx, "reconciler: abandoned an operation that never started")
		return
	case charges.RecoveryChargeCreated:
		resume = func(ctx context.Context, l *idempotency.Lease) error {
			return charges.Run(ctx, r.charges, l, charges.Request{CallerID: rec.CallerID})
		}
	case charges.RecoveryRefundCreated:
		resume = func(ctx context.Context, l *idempotency.Lease) error {
			return charges.RunRefund(ctx, r.charges, l, charges.RefundRequest{CallerID: rec.CallerID})
		}
	}
	if resume != nil {
		// After a transient failure the lease is released at once (a
		// client's retry may resume the record any time) and the
		// reconciler's own next try waits out its backoff.
		resp, err := r.store.Drive(ctx, l, resume, r.backoff(rec.ReconcilerAttempts))
		if err != nil {
			log.InfoContext(ctx, "reconciler: not finished, will try again", "err", err)
			return
		}
		log.InfoContext(ctx, "reconciler: finished an operation", "status", resp.Status)
		return
	}
	// A recovery point this code does not know: a person must look.
	if err := l.Bury(ctx); err != nil {
		log.WarnContext(ctx, "reconciler: set aside failed", "err", err)
		return
	}
	log.ErrorContext(ctx, "reconciler: unknown recovery point; operation set aside")
}

// backoff is the shared full-jitter policy.
func (r *Reconciler) backoff(attempt int32) time.Duration {
	return retry.FullJitter(r.cfg.BackoffBase, r.cfg.BackoffCap, attempt)
}
