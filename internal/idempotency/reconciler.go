package idempotency

// The reconciler finishes operations nobody is finishing (their owner
// crashed, or their client never retried a transient failure): it takes
// them over, drives them on from their recovery point with backoff between
// tries, and marks dead, for a person, those that keep failing. One runs per
// replica; FOR UPDATE SKIP LOCKED gives each record to one of them.
//
// It runs the steps the operation declared (External), as a client's retry
// does, so an operation's phases live in one place.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/retry"
)

// ReconcilerConfig tunes the reconciler.
type ReconcilerConfig struct {
	Interval time.Duration // the pause between scans that found nothing to do
	Batch    int           // the most records claimed per scan
	MaxRun   time.Duration // bounds one record's run, as for a request
	// MaxTries and MaxAge decide when a record is dead.
	// MaxTries counts the reconciler's own tries, not a client's: a
	// client retrying through an outage must not use up its patience.
	MaxTries int
	MaxAge   time.Duration
	// BackoffBase and BackoffCap shape the delay before the next try after
	// a transient failure: full jitter, random(0, min(cap, base·2^attempt)).
	BackoffBase, BackoffCap time.Duration
	// RetriesPerInterval and RetryBurst are the retry budget (full at start):
	// at most RetriesPerInterval records taken per Interval, saved up to
	// RetryBurst. It caps the reconciler's load on a processor in an outage.
	RetriesPerInterval, RetryBurst int
	// Clock tells the time for the budget; nil is time.Now.
	Clock func() time.Time
}

// Reconciler is the background worker.
type Reconciler struct {
	cfg        ReconcilerConfig
	budget     *retry.Budget
	lastRefill time.Time
	store      *Store
	operations *Registry
	log        *slog.Logger
}

// NewReconciler returns a reconciler over store that resumes each record
// with the steps declared in operations, or refuses an invalid cfg.
func NewReconciler(cfg ReconcilerConfig, store *Store, operations *Registry, log *slog.Logger) (*Reconciler, error) {
	var p config.Problems
	p.Check(cfg.Interval > 0, "Interval must be positive")
	p.Check(cfg.Batch >= 1, "Batch must be at least 1")
	p.Check(cfg.MaxRun > 0, "MaxRun must be positive")
	p.Check(cfg.MaxTries >= 1, "MaxTries must be at least 1")
	p.Check(cfg.MaxAge > 0, "MaxAge must be positive")
	p.Check(cfg.BackoffBase > 0 && cfg.BackoffCap >= cfg.BackoffBase, "BackoffBase must be positive and BackoffCap at least BackoffBase")
	p.Check(cfg.RetriesPerInterval >= 1 && cfg.RetryBurst >= cfg.RetriesPerInterval,
		"RetriesPerInterval must be at least 1 and RetryBurst at least RetriesPerInterval")
	if err := p.Err("reconciler"); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Reconciler{cfg: cfg, budget: retry.NewBudget(0, cfg.RetryBurst), store: store, operations: operations, log: log}, nil
}

// Run scans until ctx is done.
func (r *Reconciler) Run(ctx context.Context) {
	postgres.Poll(ctx, "reconciler", r.cfg.Interval, r.cfg.Batch, r.log, r.RunOnce)
}

// refill deposits RetriesPerInterval for every whole Interval since the
// last refill: by time, not by scan, since the loop runs again at once
// after a full batch and would then retry without limit.
func (r *Reconciler) refill() {
	now := r.cfg.Clock()
	if r.lastRefill.IsZero() {
		r.lastRefill = now // the budget starts full
		return
	}
	if periods := int(now.Sub(r.lastRefill) / r.cfg.Interval); periods > 0 {
		r.budget.Deposit(periods * r.cfg.RetriesPerInterval)
		r.lastRefill = r.lastRefill.Add(time.Duration(periods) * r.cfg.Interval)
	}
}

// RunOnce claims one batch of stale records, handles each, and says how many.
func (r *Reconciler) RunOnce(ctx context.Context) (int, error) {
	r.refill()
	if ctx.Err() != nil {
		return 0, nil
	}
	allowed := r.budget.SpendUpTo(r.cfg.Batch)
	if allowed == 0 {
		return 0, nil // out of budget: the records wait for a later scan
	}
	// Detached: a claim canceled mid-statement could commit unseen, leaving
	// its records leased to nobody (clients told 409) until the leases ran
	// out. Every record it returns is handled or given back.
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MaxRun)
	leases, err := r.store.ClaimStale(claimCtx, allowed, r.operations.resumable())
	cancel()
	r.budget.Deposit(allowed - len(leases)) // only what was used is spent
	if err != nil {
		return 0, err
	}
	// At once: each lease started at the claim; a hang holds up only itself.
	var wg sync.WaitGroup
	for _, l := range leases {
		if ctx.Err() != nil {
			// Stopping: unclaim it, so nobody waits for its lease to run out.
			l.unclaim()
			continue
		}
		wg.Go(func() { r.reconcile(ctx, l) })
	}
	wg.Wait()
	return len(leases), nil
}

func (r *Reconciler) reconcile(ctx context.Context, l *Lease) {
	rec := l.Record()
	log := r.log.With("caller", rec.CallerID, "key_id", rec.ID, "operation", rec.Operation, "path", rec.RequestPath,
		"recovery_point", rec.RecoveryPoint, "attempt", rec.Attempt)
	// Finished even if the reconciler is told to stop meanwhile (its writes
	// must not be cut off halfway), bounded like any request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MaxRun)
	defer cancel()
	metrics.ReconcilerTakeovers.Inc()
	ctx, span := startResume(ctx, rec)
	defer span.End()

	if l.RecoveryPoint() == RecoveryStarted {
		// Nothing happened anywhere: free the key for a retry. Before the
		// give-up check: a dead answer would tell its client never to retry
		// an operation that never began.
		switch err := l.deleteUnstarted(ctx); {
		case errors.Is(err, ErrLeaseLost):
			log.InfoContext(ctx, "reconciler: the record moved on before it could be deleted")
		case err != nil:
			log.WarnContext(ctx, "reconciler: delete failed", "err", err)
		default:
			metrics.ReconcilerResumes.WithLabelValues("abandoned").Inc()
			log.InfoContext(ctx, "reconciler: deleted an operation that never started")
		}
		return
	}
	op, ok := r.operations.Lookup(rec.Operation)
	switch {
	case int(rec.ReconcilerTries) > r.cfg.MaxTries || time.Since(rec.CreatedAt) > r.cfg.MaxAge:
		// (On this process's clock: MaxAge is hours, so skew does not matter.)
		markDeadAndLog(ctx, l, log, slog.LevelWarn, "reconciler: operation dead, left for an operator")
		return
	case !ok || op.Resume == nil:
		// ClaimStale claims only registered operations past 'started': the
		// registry changed under a running reconciler, a wiring bug.
		markDeadAndLog(ctx, l, log, slog.LevelError, "reconciler: no step declared for the operation; dead")
		return
	}
	// After a transient failure Drive releases the lease at once, for a
	// client's retry; the reconciler's own next try waits out its backoff.
	backoff := retry.FullJitter(r.cfg.BackoffBase, r.cfg.BackoffCap, int(rec.ReconcilerTries))
	resp, err := r.store.Drive(ctx, l, op.Resume, backoff)
	if err != nil {
		metrics.ReconcilerResumes.WithLabelValues("not_finished").Inc()
		log.InfoContext(ctx, "reconciler: not finished, will try again", "err", err)
		return
	}
	metrics.ReconcilerResumes.WithLabelValues("finished").Inc()
	log.InfoContext(ctx, "reconciler: finished an operation", "status", resp.Status)
}

// markDeadAndLog marks l's record dead, for a person, and logs msg at level.
func markDeadAndLog(ctx context.Context, l *Lease, log *slog.Logger, level slog.Level, msg string) {
	if err := l.markDead(ctx); err != nil {
		log.WarnContext(ctx, "reconciler: marking dead failed", "err", err)
		return
	}
	metrics.ReconcilerDeadLetters.Inc()
	log.Log(ctx, level, msg)
}
