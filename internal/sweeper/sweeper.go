// Package sweeper keeps the retention promises: it deletes completed
// idempotency records past their window (after which a reused key is a new
// operation), outbox events delivered (or, for a caller without a webhook,
// left to be pulled) and what the demo's receiver got, and processed
// webhook event ids past theirs. It deletes in bounded batches (no long locks, no table scans) and
// is safe with several sweepers at once. It never deletes an in-progress
// record, whose external effect may be unresolved: those are counted and
// left to the reconciler.
package sweeper

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/dbsqlc"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// Config is what to keep, and how much to delete per statement.
type Config struct {
	// KeyRetention is IDEMPOTENCY_KEY_RETENTION, shared with the server.
	KeyRetention time.Duration
	// EventRetention is how long outbox events are kept once delivered
	// (or, with nowhere to push them, once written).
	EventRetention time.Duration
	// WebhookRetention is how long processed webhook event ids are kept;
	// it must exceed how long the processor may redeliver an event.
	WebhookRetention time.Duration
	// Batch is the most rows one DELETE removes.
	Batch int
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
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

// New returns a sweeper. It refuses a configuration that could not work: a
// batch under one row, or a window that is not positive (which would delete
// records the moment they complete).
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
	// Each DELETE runs to its end even when ctx is canceled (a SIGTERM):
	// the sweep stops between batches, as promised, not in the middle of
	// one. The statement is short (one bounded batch); the timeout only
	// guards against a stuck connection.
	stmt := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	}
	for _, table := range []struct {
		count *int64
		sweep func() (int64, error)
	}{
		{&r.Keys, func() (int64, error) {
			ctx, cancel := stmt()
			defer cancel()
			return queries.SweepIdempotencyKeys(ctx, s.pool, dbsqlc.SweepIdempotencyKeysParams{RetentionSeconds: keys, Batch: batch})
		}},
		{&r.Events, func() (int64, error) {
			ctx, cancel := stmt()
			defer cancel()
			return queries.SweepDeliveredEvents(ctx, s.pool, dbsqlc.SweepDeliveredEventsParams{RetentionSeconds: events, Batch: batch})
		}},
		{&r.Events, func() (int64, error) {
			ctx, cancel := stmt()
			defer cancel()
			return queries.SweepParkedEvents(ctx, s.pool, dbsqlc.SweepParkedEventsParams{RetentionSeconds: events, Batch: batch})
		}},
		{&r.Events, func() (int64, error) {
			ctx, cancel := stmt()
			defer cancel()
			return queries.SweepDemoReceivedEvents(ctx, s.pool, dbsqlc.SweepDemoReceivedEventsParams{RetentionSeconds: events, Batch: batch})
		}},
		{&r.WebhookEvents, func() (int64, error) {
			ctx, cancel := stmt()
			defer cancel()
			return queries.SweepProcessorEvents(ctx, s.pool, dbsqlc.SweepProcessorEventsParams{RetentionSeconds: hooks, Batch: batch})
		}},
	} {
		// Batch after batch until a short one: then nothing (visible to us)
		// is left. Rows another sweeper holds are skipped, not waited for.
		for ctx.Err() == nil {
			n, err := table.sweep()
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
