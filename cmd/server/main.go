// Command server runs the payments API.
//
//	server               migrate the database, seed the demo callers, serve
//	server migrate       migrate the database and exit
//	server dead-letters  list the operations set aside for an operator (JSON lines)
//
// Configuration comes from the environment; see internal/server.Config and
// the README.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/processor"
	"github.com/retrysafe/payments/internal/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// startProcessor serves the fake card processor on a loopback port.
func startProcessor(log *slog.Logger, webhookURL string, webhookSecret []byte) (stop func(), url string, err error) {
	p, err := processor.New(processor.Config{
		WebhookURL:    webhookURL,
		WebhookSecret: webhookSecret,
		Logger:        log.With("component", "processor"),
	})
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	// Close releases answers the fake is withholding (pm_card_timeout), so
	// they do not hold up the shutdown.
	srv.RegisterOnShutdown(p.Close)
	go srv.Serve(ln)
	url = "http://" + ln.Addr().String()
	log.Info("in-process card processor", "url", url)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, url, nil
}

// listDeadLetters writes one JSON line per thing set aside for an operator:
// every operation the reconciler gave up on (kind "operation", status
// dead; whether its external effect happened is on the processor's ledger
// under the charge's or refund's downstream key), and every processor
// event that contradicted a recorded final state and was not applied (kind
// "processor_event").
func listDeadLetters(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	q := dbsqlc.New()
	callers, err := q.ListCallers(ctx, pool)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	for _, c := range callers {
		// One caller at a time: every query on tenant data names its caller.
		dead, err := q.ListDeadIdempotencyKeys(ctx, pool, c.ID)
		if err != nil {
			return err
		}
		for _, rec := range dead {
			if err := enc.Encode(map[string]any{
				"kind":   "operation",
				"caller": rec.CallerID, "key": rec.Key, "key_id": rec.ID,
				"request_method": rec.RequestMethod, "request_path": rec.RequestPath,
				"recovery_point": rec.RecoveryPoint, "attempt": rec.Attempt,
				"created_at": rec.CreatedAt, "updated_at": rec.UpdatedAt,
			}); err != nil {
				return err
			}
		}
		contradicting, err := q.ListContradictingProcessorEvents(ctx, pool, c.ID)
		if err != nil {
			return err
		}
		for _, ev := range contradicting {
			if err := enc.Encode(map[string]any{
				"kind":   "processor_event",
				"caller": ev.CallerID, "event_id": ev.EventID, "type": ev.Type,
				"contradiction": ev.Contradiction, "received_at": ev.ReceivedAt,
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// run is the whole program, with its inputs passed in so tests can drive it.
// It returns when ctx is canceled (after a graceful shutdown) or on error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	command := "serve"
	if len(args) > 0 {
		command = args[0]
	}
	if command != "serve" && command != "migrate" && command != "dead-letters" {
		return fmt.Errorf("unknown command %q (want serve, migrate or dead-letters)", command)
	}
	cfg, err := server.LoadConfig(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))

	pool, err := postgres.Open(ctx, cfg.DatabaseURL, true)
	if errors.Is(err, postgres.ErrUnreachable) {
		return fmt.Errorf("%w\n\nThe service needs PostgreSQL (DATABASE_URL=%s). Start a local one, e.g.\n"+
			"  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start   (Debian)\n"+
			"or run one in a container:\n"+
			"  docker compose up -d db", err, postgres.Redact(cfg.DatabaseURL))
	}
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(pool); err != nil {
		return err
	}
	log.Info("database migrated", "database", postgres.Redact(cfg.DatabaseURL))
	switch command {
	case "migrate":
		return nil
	case "dead-letters":
		return listDeadLetters(ctx, pool, stdout)
	}
	if cfg.SeedDemoCallers {
		if err := auth.SeedDemoCallers(ctx, pool); err != nil {
			return fmt.Errorf("seed demo callers: %w", err)
		}
	}

	// Listen first: the in-process processor needs our address for its
	// webhooks.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if cfg.ProcessorURL == "" {
		// The demo needs a card processor: run the fake one in this process,
		// behind a real HTTP listener, so the server talks to it exactly as
		// it would to a separate one (cmd/processor).
		webhookURL := fmt.Sprintf("http://127.0.0.1:%d/webhooks/processor", ln.Addr().(*net.TCPAddr).Port)
		stopProcessor, url, err := startProcessor(log, webhookURL, cfg.ProcessorWebhookSecret)
		if err != nil {
			return err
		}
		defer stopProcessor()
		cfg.ProcessorURL = url
	}

	if cfg.Reconciler {
		// The background workers: the reconciler, and the outbox relay
		// (delivering to the built-in demo receiver of this server for
		// callers without their own endpoint).
		demoURL := fmt.Sprintf("http://127.0.0.1:%d/demo/webhooks/", ln.Addr().(*net.TCPAddr).Port)
		workersCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
		var workers sync.WaitGroup
		workers.Go(func() { server.NewReconciler(cfg, pool, log).Run(workersCtx) })
		workers.Go(func() { server.NewRelay(cfg, pool, log, demoURL).Run(workersCtx) })
		// Stop them (between records) before the pool closes.
		defer func() { stopWorkers(); workers.Wait() }()
	}

	handler, err := server.New(cfg, pool, log)
	if err != nil {
		return err
	}
	// Requests must not be canceled by SIGTERM: graceful shutdown lets them
	// finish. ctx is canceled by the signal, so requests get a base context
	// detached from it.
	srv := cfg.HTTPServer(context.WithoutCancel(ctx), handler)
	log.Info("listening", "addr", ln.Addr().String())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}

	// Graceful shutdown: stop accepting, let in-flight requests finish (their
	// record writes included), then close the pool.
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
