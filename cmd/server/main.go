// Command server runs the payments API.
//
//	server               migrate the database, seed the demo callers, serve
//	server demo          the demo (make run): the fake processor here, the server as a
//	                     child process with DEMO_MODE on, restarted whenever it crashes
//	server migrate       migrate the database and exit
//	server dead-letters  list the operations set aside for an operator (JSON lines)
//	server callers add ID [--name NAME]
//	                     create a caller and print its API key, once
//	server callers list  list the callers (never a key: only hashes are stored)
//
// Configuration comes from the environment; see internal/config and the
// README.
//
// The service itself is built by internal/app, which the end-to-end tests
// use too; this command adds what belongs to a process: the environment,
// the logger, the database pool and its migrations, the listening socket,
// the in-process fake processor when no other is configured, the demo's
// supervisor, and the signals.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/net/netutil"

	"github.com/retrysafe/payments/internal/app"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/payouts"
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

// newWebhookSecret is a random webhook secret, for a processor started by
// this program: 256 bits from the operating system's generator.
func newWebhookSecret() []byte {
	return []byte("whsec_" + rand.Text() + rand.Text())
}

// listDeadLetters writes one JSON line per thing set aside for an operator:
// every payout job given up on (kind "payout_job": discarded by River, or
// cancelled by the job with its reason), every operation
// the reconciler gave up on (kind "operation", status
// dead; whether its external effect happened is on the processor's ledger
// under the charge's or refund's downstream key), and every processor
// event that contradicted a recorded final state and was not applied (kind
// "processor_event").
func listDeadLetters(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	enc := json.NewEncoder(out)
	// Payout jobs given up on: the payout's state at the processor is GET
	// /v1/payouts/{id} there, under the payout's downstream key.
	jobs, err := payouts.ListGivenUpJobs(ctx, pool)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := enc.Encode(map[string]any{
			"kind": "payout_job", "caller": j.CallerID, "payout_id": j.PayoutID,
			"job_id": j.JobID, "attempts": j.Attempts, "state": j.State, "reason": j.Reason, "finalized_at": j.FinalizedAt,
		}); err != nil {
			return err
		}
	}
	callers, err := auth.ListCallers(ctx, pool)
	if err != nil {
		return err
	}
	for _, c := range callers {
		// One caller at a time: every query on tenant data names its caller.
		dead, err := idempotency.ListDead(ctx, pool, c.ID)
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
		setAside, err := events.ListSetAside(ctx, pool, c.ID)
		if err != nil {
			return err
		}
		for _, ev := range setAside {
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

// newLogger writes JSON lines, for a log collector, unless format says
// text or (format unset) stdout is a terminal, where a person reads it.
// Every line logged with a context carrying a request id has it. Each line
// is written as it is logged: batching them saved one write per request,
// under 5% of a create in make bench (docs/performance.md), and would lose
// the last lines of a killed process.
func newLogger(stdout io.Writer, format string) *slog.Logger {
	if format == "" {
		format = "json"
		if f, ok := stdout.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	var h slog.Handler = slog.NewJSONHandler(stdout, nil)
	if format == "text" {
		h = slog.NewTextHandler(stdout, nil)
	}
	return slog.New(server.LogHandler(h))
}

// newHTTPServer returns the http.Server that serves handler with the
// configured timeouts; requests get base as their context.
func newHTTPServer(cfg config.Server, handler http.Handler, base context.Context) *http.Server {
	srv := &http.Server{
		Handler:           handler,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	if cfg.DemoMode {
		// The demo crashes the server on purpose, and must show it. A
		// browser (and Go's client) silently sends a POST again when a
		// kept-alive connection breaks before any answer, and the new
		// server would then answer it after waiting out the dead owner's
		// lease: the crash would never be seen. Without keep-alive every
		// request has a connection of its own, and a crash is a lost
		// connection that the page can show.
		srv.SetKeepAlivesEnabled(false)
	}
	return srv
}

// run is the whole program, with its inputs passed in so tests can drive it.
// It returns when ctx is canceled (after a graceful shutdown) or on error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	command := "serve"
	if len(args) > 0 {
		command = args[0]
	}
	if command != "serve" && command != "demo" && command != "migrate" && command != "dead-letters" && command != "callers" {
		return fmt.Errorf("unknown command %q (want serve, demo, migrate, dead-letters or callers)", command)
	}
	if command == "demo" {
		// The supervisor's settings are read as its server will read them:
		// in DEMO_MODE (which allows the published webhook secret).
		outer := getenv
		getenv = func(name string) string {
			if name == "DEMO_MODE" {
				return "true"
			}
			return outer(name)
		}
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := newLogger(stdout, cfg.LogFormat)
	if command == "demo" {
		return runDemo(ctx, cfg, log, stdout)
	}

	pool, err := postgres.Open(ctx, cfg.DatabaseURL, true)
	if errors.Is(err, postgres.ErrUnreachable) {
		return fmt.Errorf("%w\n\nThe service needs PostgreSQL (DATABASE_URL names %s). Start a local one, e.g.\n"+
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
	case "callers":
		return runCallers(ctx, pool, args[1:], cfg.WebhookAllowPrivate, stdout)
	}
	if cfg.SeedDemoCallers {
		if err := auth.SeedDemoCallers(ctx, pool); err != nil {
			return fmt.Errorf("seed demo callers: %w", err)
		}
		if !cfg.DemoMode {
			// Their keys are published: anyone can be acme or globex here.
			log.Warn("SEED_DEMO_CALLERS is on outside the demo: the demo callers' published API keys work on this server; never in production")
		}
	}

	// Tracing first, so that the in-process processor's spans, too, go
	// where the service's go (nowhere, unless OTEL_EXPORTER_OTLP_ENDPOINT
	// is set or this is the demo).
	tracing, err := app.SetupTracing(ctx, cfg.DemoMode)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tracing.Shutdown(ctx); err != nil {
			log.Warn("flushing the last spans", "err", err)
		}
	}()
	if tracing.Exporting {
		log.Info("exporting traces over OTLP")
	}

	// Listen first: the in-process processor needs our address for its
	// webhooks. Under the demo's supervisor the socket is inherited (see
	// runDemo), so that it outlives a crash of this process.
	ln, err := listen(cfg.HTTPAddr, getenv(listenFDVar))
	if err != nil {
		return err
	}
	defer ln.Close()
	if cfg.ProcessorURL == "" {
		// The demo needs a card processor: run the fake one in this process,
		// behind a real HTTP listener, so the server talks to it exactly as
		// it would to a separate one (cmd/processor). Unless told one, the
		// two share a secret made now, which nobody else ever sees.
		if len(cfg.ProcessorWebhookSecret) == 0 {
			cfg.ProcessorWebhookSecret = newWebhookSecret()
		}
		webhookURL := fmt.Sprintf("http://127.0.0.1:%d/webhooks/processor", ln.Addr().(*net.TCPAddr).Port)
		stopProcessor, url, err := startProcessor(log, webhookURL, cfg.ProcessorWebhookSecret)
		if err != nil {
			return err
		}
		defer stopProcessor()
		cfg.ProcessorURL = url
	}

	// The service, built in one place (internal/app): the same
	// constructor the end-to-end tests use.
	port := ln.Addr().(*net.TCPAddr).Port
	service, err := app.New(cfg, pool, log, app.Options{
		DemoReceiverURL: fmt.Sprintf("http://127.0.0.1:%d/demo/webhooks/", port),
		Traces:          tracing.Recent,
		Tracing:         tracing.Recording(),
	})
	if err != nil {
		return err
	}
	if err := service.Start(ctx); err != nil {
		return err
	}
	// Stop the background work (the workers between records, the payout
	// jobs after their step, within the shutdown timeout) before the pool
	// closes.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		if err := service.Stop(ctx); err != nil {
			log.Warn("stopping the background work", "err", err)
		}
	}()
	handler := service.Handler
	// Requests must not be canceled by SIGTERM: graceful shutdown lets them
	// finish. ctx is canceled by the signal, so requests get a base context
	// detached from it.
	srv := newHTTPServer(cfg, handler, context.WithoutCancel(ctx))
	if cfg.DemoMode {
		// Every answer closes its connection, so a browser never sends a
		// request on a kept-alive one. When the demo kills this server
		// mid-request, Chromium resends a request that died on a reused
		// connection, silently, to the restarted server: the page would
		// see that copy's 409, never the attempt the crash killed. On a
		// fresh connection the attempt fails where the page can see it.
		srv.SetKeepAlivesEnabled(false)
	}
	serveErr := make(chan error, 2)
	if cfg.MetricsAddr != "" {
		metricsLn, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("METRICS_ADDR: %w", err)
		}
		metricsSrv := &http.Server{Handler: metrics.Handler(), ReadHeaderTimeout: cfg.ReadHeaderTimeout}
		defer metricsSrv.Close()
		log.Info("serving metrics", "addr", metricsLn.Addr().String())
		go func() { serveErr <- metricsSrv.Serve(metricsLn) }()
	}
	log.Info("listening", "addr", ln.Addr().String(), "url", openURL(ln.Addr()))
	// At most MaxConnections open at once; the rest wait to be accepted.
	go func() { serveErr <- srv.Serve(netutil.LimitListener(ln, cfg.MaxConnections)) }()
	// Under the demo's supervisor: say we are serving (so that a crash from
	// now on is the demo's, not a failure to start), and stop if the
	// supervisor is gone.
	if fd := getenv(readyFDVar); fd != "" {
		if err := signalReady(fd); err != nil {
			return err
		}
		var stopWithParent context.CancelFunc
		ctx, stopWithParent = context.WithCancel(ctx)
		defer stopWithParent()
		go stopWhenOrphaned(ctx, stopWithParent)
	}
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
