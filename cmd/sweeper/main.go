// Command sweeper deletes what is past its retention window: completed
// idempotency records (IDEMPOTENCY_KEY_RETENTION, shared with the server),
// delivered outbox events (OUTBOX_EVENT_RETENTION) and processed webhook
// event ids (WEBHOOK_EVENT_RETENTION). See internal/sweeper.
//
//	sweeper --once                 one sweep, then exit (cron, a Kubernetes CronJob)
//	sweeper --interval 5m          sweep every 5 minutes until SIGTERM
//	sweeper --once --dry-run       count what would be deleted
//
// Each sweep logs one JSON line with what it did; --metrics-file writes the
// same figures in the Prometheus text format (for node_exporter's textfile
// collector when run as a one-shot job).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/sweeper"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sweeper:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	flags := flag.NewFlagSet("sweeper", flag.ContinueOnError)
	once := flags.Bool("once", false, "sweep once and exit")
	interval := flags.Duration("interval", 0, "sweep repeatedly, this long apart (instead of --once)")
	dryRun := flags.Bool("dry-run", false, "count what would be deleted; delete nothing")
	batch := flags.Int("batch", 1000, "rows deleted per statement")
	metricsFile := flags.String("metrics-file", "", "write Prometheus text-format metrics to this file after each sweep")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *once == (*interval > 0) {
		return errors.New("give exactly one of --once and --interval")
	}
	if *batch < 1 {
		return errors.New("--batch must be positive")
	}
	cfg, err := config.LoadSweeper(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	pool, err := postgres.Open(ctx, cfg.DatabaseURL, false)
	if err != nil {
		return err
	}
	defer pool.Close()

	s, err := sweeper.New(sweeper.Config{KeyRetention: cfg.KeyRetention, EventRetention: cfg.EventRetention,
		WebhookRetention: cfg.WebhookRetention, Batch: *batch, DryRun: *dryRun}, pool)
	if err != nil {
		return err
	}
	for {
		r, err := s.Sweep(ctx)
		log.Info("sweep",
			"dry_run", r.DryRun, "deleted_idempotency_keys", r.Keys, "deleted_events", r.Events,
			"deleted_webhook_events", r.WebhookEvents, "batches", r.Batches,
			"stale_in_progress", r.StaleInProgress, "duration", r.Duration.String(), "err", err)
		if r.StaleInProgress > 0 {
			log.Warn("in-progress idempotency records older than the retention window were left for the reconciler",
				"count", r.StaleInProgress)
		}
		if *metricsFile != "" {
			if err := writeMetrics(*metricsFile, r); err != nil {
				return err
			}
		}
		if errors.Is(err, context.Canceled) {
			return nil // SIGTERM between batches: a clean stop
		}
		if *once {
			return err
		}
		// Looping: a failed sweep (a database blip) was logged above; the
		// next one tries again.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// writeMetrics writes the sweep's figures in the Prometheus text format.
func writeMetrics(path string, r sweeper.Report) error {
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(v)
		reg.MustRegister(g)
	}
	deleted := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "payments_sweeper_deleted_rows",
		Help: "Rows deleted by the last sweep (deletable, on a dry run)."}, []string{"table"})
	deleted.WithLabelValues("idempotency_keys").Set(float64(r.Keys))
	deleted.WithLabelValues("events").Set(float64(r.Events))
	deleted.WithLabelValues("processor_events").Set(float64(r.WebhookEvents))
	reg.MustRegister(deleted)
	gauge("payments_sweeper_batches", "Batches run by the last sweep.", float64(r.Batches))
	gauge("payments_sweeper_stale_in_progress", "In-progress idempotency records past the window, left for the reconciler.", float64(r.StaleInProgress))
	gauge("payments_sweeper_duration_seconds", "How long the last sweep took.", r.Duration.Seconds())
	gauge("payments_sweeper_last_run_timestamp_seconds", "When the last sweep finished.", float64(time.Now().Unix()))
	// WriteToTextfile writes a temporary file and renames it into place:
	// the collector never reads half a file.
	return prometheus.WriteToTextfile(path, reg)
}
