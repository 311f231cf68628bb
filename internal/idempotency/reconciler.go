package idempotency

// The reconciler finishes operations that nobody is finishing: keyed
// requests whose owner crashed, or that stopped at a recovery point after a
// transient failure and whose client never came back. It takes such records
// over (a new attempt, fencing out the old owner) and drives them to
// completion from their recovery point, with backoff between tries, and
// sets aside for a person those that keep failing.
//
// Several reconcilers (one per server replica) can run at once: each claim
// uses FOR UPDATE SKIP LOCKED, so a record goes to one of them.
//
// It has no code of its own for any operation: it runs the steps the
// operation declared (External), the same ones a client's retry runs, so
// an operation's phases live in one place. It claims only what it can
// handle: records that never passed their first phase (which it
// abandons), and records of declared external operations.

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/retry"
)

// ReconcilerConfig tunes the reconciler.
type ReconcilerConfig struct {
	// Interval is the pause between scans that found nothing to do.
	Interval time.Duration
	// Batch is the most records claimed per scan.
	Batch int
	// MaxRun bounds one record's run, as for a request.
	MaxRun time.Duration
	// MaxAttempts and MaxAge decide when a record is set aside (status
	// dead) instead of tried again. MaxAttempts counts the reconciler's own
	// tries (reconciler_attempts), not a client's retries: a client
	// retrying through an outage must not use up the reconciler's patience.
	MaxAttempts int
	MaxAge      time.Duration
	// BackoffBase and BackoffCap shape the delay before the next try after
	// a transient failure: full jitter, random(0, min(cap, base·2^attempt)).
	BackoffBase, BackoffCap time.Duration
	// RetriesPerInterval and RetryBurst are the retry budget: every record
	// the reconciler takes is a retry, so it may take at most
	// RetriesPerInterval more per Interval of time, saved up to RetryBurst
	// (the budget starts full). During an outage of the processor this caps
	// the load the reconciler adds to it, however fast it loops.
	RetriesPerInterval, RetryBurst int
	// Clock tells the time for the budget; nil is time.Now. Tests pass a
	// clock they move by hand.
	Clock func() time.Time
}

func (c ReconcilerConfig) validate() error {
	var p config.Problems
	p.Check(c.Interval > 0, "Interval must be positive")
	p.Check(c.Batch >= 1, "Batch must be at least 1")
	p.Check(c.MaxRun > 0, "MaxRun must be positive")
	p.Check(c.MaxAttempts >= 1, "MaxAttempts must be at least 1")
	p.Check(c.MaxAge > 0, "MaxAge must be positive")
	p.Check(c.BackoffBase > 0 && c.BackoffCap >= c.BackoffBase, "BackoffBase must be positive and BackoffCap at least BackoffBase")
	p.Check(c.RetriesPerInterval >= 1 && c.RetryBurst >= c.RetriesPerInterval, "RetriesPerInterval must be at least 1 and RetryBurst at least RetriesPerInterval")
	return p.Err("reconciler")
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
// with the steps its operation declared in operations. It refuses an
// invalid configuration.
func NewReconciler(cfg ReconcilerConfig, store *Store, operations *Registry, log *slog.Logger) (*Reconciler, error) {
	if err := cfg.validate(); err != nil {
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
// last refill. The budget is refilled by time, not by scans: the loop runs
// again at once after a full batch, and a deposit per scan would let it
// retry without limit.
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

// RunOnce claims one batch of stale records and handles each; it returns
// how many it claimed.
func (r *Reconciler) RunOnce(ctx context.Context) (int, error) {
	r.refill()
	allowed := r.budget.SpendUpTo(r.cfg.Batch)
	if allowed == 0 {
		return 0, nil // out of budget: the records wait for a later scan
	}
	// A claim is never cut off halfway: canceled mid-statement, it could
	// commit without this reconciler learning what it took, leaving those
	// records leased to nobody (and clients told 409) until the leases ran
	// out. So the claim runs on a context detached from cancellation, and
	// every record it returns is handled or given back.
	if ctx.Err() != nil {
		r.budget.Deposit(allowed)
		return 0, nil
	}
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MaxRun)
	leases, err := r.store.ClaimStale(claimCtx, allowed, r.operations.resumable())
	cancel()
	if err != nil {
		r.budget.Deposit(allowed)
		return 0, err
	}
	r.budget.Deposit(allowed - len(leases)) // only what was used is spent
	for _, l := range leases {
		if ctx.Err() != nil {
			// Stopping: give the records not yet handled back at once, so
			// that a client's retry (or another reconciler) need not wait
			// for their leases to run out.
			l.GiveBack()
			continue
		}
		r.reconcile(ctx, l)
	}
	return len(leases), nil
}

func (r *Reconciler) reconcile(ctx context.Context, l *Lease) {
	rec := l.Record()
	log := r.log.With("caller", rec.CallerID, "key_id", rec.ID, "operation", rec.Operation, "path", rec.RequestPath,
		"recovery_point", rec.RecoveryPoint, "attempt", rec.Attempt)
	// A record started is finished even if the reconciler is told to stop
	// meanwhile (its writes must not be cut off halfway), bounded by the
	// longest run of an operation, like any request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MaxRun)
	defer cancel()
	metrics.ReconcilerTakeovers.Inc()
	// A trace of its own: the phases and the processor call the resumption
	// makes are its children. It may run an hour after the request, which
	// as its parent would stretch that request's trace over the hour;
	// instead it links to the request that started the operation (its
	// traceparent, stored by the claim), when that request was traced.
	ctx, span := tracer.Start(ctx, "reconciler resume", append(postgres.LinkTo(&rec.Traceparent),
		trace.WithNewRoot(), trace.WithAttributes(
			attrOperation.String(rec.Operation), attrKeyHash.String(KeyHash(rec.CallerID, rec.Key)),
			attrAttempt.Int64(int64(rec.Attempt)), attrRecoveryPoint.String(string(rec.RecoveryPoint))))...)
	defer span.End()

	if l.RecoveryPoint() == RecoveryStarted {
		// The first phase never committed, so nothing happened, locally or
		// downstream, whatever the operation. Free the key; a client retry
		// runs afresh. This comes before the check for giving up: there is
		// nothing for a person to look at, and setting the record aside
		// would only tell its client never to retry an operation that
		// never began.
		switch err := l.Abandon(ctx); {
		case errors.Is(err, ErrLeaseLost):
			log.InfoContext(ctx, "reconciler: the record moved on before it could be abandoned")
		case err != nil:
			log.WarnContext(ctx, "reconciler: abandon failed", "err", err)
		default:
			metrics.ReconcilerResumes.WithLabelValues("abandoned").Inc()
			log.InfoContext(ctx, "reconciler: abandoned an operation that never started")
		}
		return
	}
	// The age is judged on this process's clock; MaxAge is hours, so the
	// skew between replicas does not matter here (leases use the
	// database's clock).
	if int(rec.ReconcilerAttempts) > r.cfg.MaxAttempts || time.Since(rec.CreatedAt) > r.cfg.MaxAge {
		if err := l.Bury(ctx); err != nil {
			log.WarnContext(ctx, "reconciler: set aside failed", "err", err)
			return
		}
		metrics.ReconcilerDeadLetters.Inc()
		log.WarnContext(ctx, "reconciler: operation set aside for an operator (dead)")
		return
	}

	op, ok := r.operations.Lookup(rec.Operation)
	if !ok || op.Resume == nil {
		// ClaimStale claims only registered operations past 'started', so
		// this means the registry changed under a running reconciler: a
		// wiring bug. A person must look.
		if err := l.Bury(ctx); err != nil {
			log.WarnContext(ctx, "reconciler: set aside failed", "err", err)
			return
		}
		metrics.ReconcilerDeadLetters.Inc()
		log.ErrorContext(ctx, "reconciler: no handler registered for the operation; set aside")
		return
	}
	// After a transient failure the lease is released at once (a client's
	// retry may resume the record any time) and the reconciler's own next
	// try waits out its backoff.
	resp, err := r.store.Drive(ctx, l, op.Resume, r.backoff(rec.ReconcilerAttempts))
	if err != nil {
		metrics.ReconcilerResumes.WithLabelValues("not_finished").Inc()
		log.InfoContext(ctx, "reconciler: not finished, will try again", "err", err)
		return
	}
	metrics.ReconcilerResumes.WithLabelValues("finished").Inc()
	log.InfoContext(ctx, "reconciler: finished an operation", "status", resp.Status)
}

// backoff is the shared full-jitter policy.
func (r *Reconciler) backoff(attempt int32) time.Duration {
	return retry.FullJitter(r.cfg.BackoffBase, r.cfg.BackoffCap, int(attempt))
}
