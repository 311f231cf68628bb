// Package sweeper keeps the retention promises: it deletes, past their
// windows, completed idempotency records (a reused key is then a new
// operation), outbox events delivered (or parked for a caller without a
// webhook) and what the demo's receiver got, and processed webhook event
// ids. It deletes in bounded batches (no long locks, no table scans), safely
// with several sweepers at once, and never an in-progress record, whose
// effect may be unresolved: those are counted, left to the reconciler.
package sweeper

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/dbsqlc"
)

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

// Config is what to keep, and how much to delete per statement.
type Config struct {
	KeyRetention time.Duration // IDEMPOTENCY_KEY_RETENTION, shared with the server
	// EventRetention is how long outbox events are kept once delivered
	// (or, with nowhere to push them, once written).
	EventRetention time.Duration
	// WebhookRetention is how long processed webhook event ids are kept;
	// it must exceed how long the processor may redeliver an event.
	WebhookRetention time.Duration
	Batch            int  // the most rows one DELETE removes
	DryRun           bool // count what would be deleted, delete nothing
}

// Report is what one sweep did.
type Report struct {
	Keys, Events, WebhookEvents int64 // deleted (or, on a dry run, deletable)
	Batches                     int
	StaleInProgress             int64 // in-progress records past the window, left alone
	Duration                    time.Duration
	DryRun                      bool
}

// Sweeper runs sweeps.
type Sweeper struct {
	cfg  Config
	pool *pgxpool.Pool
}

// New returns a sweeper. It refuses a batch under one row, or a window that
// is not positive (which would delete records the moment they complete).
func New(cfg Config, pool *pgxpool.Pool) (*Sweeper, error) {
	var p config.Problems
	p.Check(cfg.Batch >= 1, "Batch must be at least 1")
	p.Check(cfg.KeyRetention > 0 && cfg.EventRetention > 0 && cfg.WebhookRetention > 0, "KeyRetention, EventRetention and WebhookRetention must be positive")
	if err := p.Err("sweeper"); err != nil {
		return nil, err
	}
	return &Sweeper{cfg: cfg, pool: pool}, nil
}

// Sweep runs one sweep over every table. It stops between batches when ctx
// is done (a SIGTERM): every batch is its own statement, so stopping never
// leaves anything half done.
func (s *Sweeper) Sweep(ctx context.Context) (Report, error) {
	start := time.Now()
	r := Report{DryRun: s.cfg.DryRun}
	keys, events, hooks := s.cfg.KeyRetention.Seconds(), s.cfg.EventRetention.Seconds(), s.cfg.WebhookRetention.Seconds()
	var err error
	if r.StaleInProgress, err = queries.CountStaleInProgressKeys(ctx, s.pool, keys); err != nil {
		return r, err
	}
	if s.cfg.DryRun {
		if r.Keys, err = queries.CountSweepableIdempotencyKeys(ctx, s.pool, keys); err != nil {
			return r, err
		}
		if r.Events, err = queries.CountSweepableEvents(ctx, s.pool, events); err != nil {
			return r, err
		}
		r.WebhookEvents, err = queries.CountSweepableProcessorEvents(ctx, s.pool, hooks)
		r.Duration = time.Since(start)
		return r, err
	}

	batch := int32(s.cfg.Batch) // #nosec G115 -- the batch size is checked at start: at most 10,000
	for _, table := range []struct {
		count *int64
		sweep func(context.Context) (int64, error)
	}{
		{&r.Keys, statement(s.pool, queries.SweepIdempotencyKeys, dbsqlc.SweepIdempotencyKeysParams{RetentionSeconds: keys, Batch: batch})},
		{&r.Events, statement(s.pool, queries.SweepDeliveredEvents, dbsqlc.SweepDeliveredEventsParams{RetentionSeconds: events, Batch: batch})},
		{&r.Events, statement(s.pool, queries.SweepParkedEvents, dbsqlc.SweepParkedEventsParams{RetentionSeconds: events, Batch: batch})},
		{&r.Events, statement(s.pool, queries.SweepDemoReceivedEvents, dbsqlc.SweepDemoReceivedEventsParams{RetentionSeconds: events, Batch: batch})},
		{&r.WebhookEvents, statement(s.pool, queries.SweepProcessorEvents, dbsqlc.SweepProcessorEventsParams{RetentionSeconds: hooks, Batch: batch})},
	} {
		// Batch after batch until a short one: then nothing (visible to us)
		// is left. Rows another sweeper holds are skipped, not waited for.
		for ctx.Err() == nil {
			// Each DELETE runs to its end even when ctx is canceled (a
			// SIGTERM): the sweep stops between batches, as promised. The
			// timeout only guards against a stuck connection.
			stmtCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			n, err := table.sweep(stmtCtx)
			cancel()
			if err != nil {
				return r, err
			}
			r.Batches++
			*table.count += n
			if n < int64(batch) {
				break
			}
		}
	}
	r.Duration = time.Since(start)
	return r, ctx.Err()
}

// statement is one batch of a sweep: query run on pool with params.
func statement[P any](pool *pgxpool.Pool, query func(context.Context, dbsqlc.DBTX, P) (int64, error), params P) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) { return query(ctx, pool, params) }
}
