// Command server runs the payments API.
//
//	server               migrate the database, seed the demo callers, serve
//	server demo          the demo (make run): the fake processor here, the server as a
//	                     child process with DEMO_MODE on, restarted whenever it crashes
//	server migrate       migrate the database and exit
//	server dead-letters  list the operations set aside for an operator (JSON lines)
//	server callers ...   create and manage callers (see callersUsage)
//
// The service is built by internal/app, as the end-to-end tests build it;
// this command adds what belongs to a process: the configuration (from the
// environment), logger, database pool and migrations, socket, in-process
// fake processor, demo supervisor and signals.
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

	"github.com/retrysafe/payments/internal/app"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/payouts"
	"github.com/retrysafe/payments/internal/postgres"
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

// startProcessor serves the fake card processor on a loopback port. It
// signs its webhooks to the server on serverPort with secret or, if that is
// empty, a random one (256 bits) that nobody else sees, which it returns.
// Only the demo gets its admin and ledger routes.
func startProcessor(log *slog.Logger, serverPort int, secret []byte, demo bool) (stop func(), url string, _ []byte, err error) {
	if len(secret) == 0 {
		secret = []byte("whsec_" + rand.Text() + rand.Text())
	}
	p, err := fakeprocessor.New(fakeprocessor.Config{WebhookURL: fmt.Sprintf("http://127.0.0.1:%d/webhooks/processor", serverPort),
		WebhookSecret: secret, Logger: log.With("component", "processor"), NoAdmin: !demo})
	if err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	// Close releases answers the fake is withholding (pm_card_timeout), so
	// they do not hold up the shutdown.
	srv.RegisterOnShutdown(p.Close)
	go srv.Serve(ln)
	url = "http://" + ln.Addr().String()
	log.Info("in-process card processor", "url", url)
	return func() { _ = within(context.Background(), 5*time.Second, srv.Shutdown) }, url, secret, nil
}

// within calls stop with d to finish, even if ctx is already canceled (as
// it is at shutdown).
func within(ctx context.Context, d time.Duration, stop func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return stop(ctx)
}

// listDeadLetters writes a JSON line per thing set aside for an operator:
// each payout job given up on (discarded by River, or cancelled by itself),
// each operation the reconciler gave up on (whether its effect happened is
// on the processor's ledger, under its downstream key), and each processor
// event that contradicted a recorded final state.
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

// newLogger writes JSON lines unless format says text or (unset) stdout is
// a terminal; a line logged with a request's context has its request id.
// Lines are not batched: that saved under 5% of a create in make bench
// (docs/performance.md), and would lose a killed process's last lines.
func newLogger(stdout io.Writer, format string) *slog.Logger {
	if f, ok := stdout.(*os.File); ok && format == "" {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			format = "text"
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
	srv := &http.Server{Handler: handler, MaxHeaderBytes: cfg.MaxHeaderBytes, ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return base }}
	if cfg.DemoMode {
		// The demo's crashes must be seen: a browser (and Go's client)
		// silently resends a request that died on a kept-alive connection,
		// and the restarted server would answer that copy (a 409, or a
		// replay after the dead owner's lease). A fresh connection shows it.
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
		if err := within(ctx, 5*time.Second, tracing.Shutdown); err != nil {
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
	port := ln.Addr().(*net.TCPAddr).Port
	if cfg.ProcessorURL == "" {
		// The fake processor, behind a real HTTP listener: the server talks
		// to it exactly as to a separate one (cmd/processor).
		stopProcessor, url, secret, err := startProcessor(log, port, cfg.ProcessorWebhookSecret, cfg.DemoMode)
		if err != nil {
			return err
		}
		defer stopProcessor()
		cfg.ProcessorURL, cfg.ProcessorWebhookSecret = url, secret
	}

	service, err := app.New(cfg, pool, log, app.Options{DemoReceiverURL: fmt.Sprintf("http://127.0.0.1:%d/demo/webhooks/", port),
		Traces: tracing.Recent, Tracing: tracing.Recording()})
	if err != nil {
		return err
	}
	if err := service.Start(ctx); err != nil {
		return err
	}
	// Deferred after pool.Close, so it runs first: the work stops, then the pool.
	defer func() {
		if err := within(ctx, cfg.ShutdownTimeout, service.Stop); err != nil {
			log.Warn("stopping the background work", "err", err)
		}
	}()
	// Requests must not be canceled by SIGTERM (ctx): graceful shutdown
	// lets them finish.
	srv := newHTTPServer(cfg, service.Handler, context.WithoutCancel(ctx))
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
	// At most MaxConnections open at once, idle ones closed to make room.
	slots := newSlots(ln, cfg.MaxConnections, cfg.MaxConnectionsPerAddress)
	srv.ConnState = slots.track
	go func() { serveErr <- srv.Serve(slots) }()
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

	// Graceful shutdown: stop accepting, let in-flight requests finish
	// (record writes included), then close the pool.
	log.Info("shutting down")
	if err := within(ctx, cfg.ShutdownTimeout, srv.Shutdown); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
