// Package app builds the service from its configuration: the one place
// that knows which processor it talks to, which operations can be resumed,
// which processor events are applied and by whom, and which background
// workers run. cmd/server runs what it builds, and so do this package's
// end-to-end tests and the soak: an operation registered here is
// registered everywhere. The pool, the logger and the configuration are
// passed in, never reached for, so a test builds the same application on a
// database of its own.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/payouts"
	"github.com/retrysafe/payments/internal/server"
)

// Options are what a caller may set beyond the configuration.
type Options struct {
	// JobPollInterval is how often an idle payout worker looks for jobs come
	// due (snoozed, retried; new ones are announced at once); 0 is River's 1s.
	JobPollInterval time.Duration
	// DemoReceiverURL is the server's demo receiver (/demo/webhooks/), where the
	// relay delivers the events of callers without an endpoint (DEMO_MODE only).
	DemoReceiverURL string
	// Traces is the demo's store of recent traces (SetupTracing makes it
	// in DEMO_MODE), served at GET /demo/traces; nil serves none.
	Traces *RecentTraces
	// Tracing says spans are recorded (Tracing.Recording): the server then
	// starts a span for every request, not only those with a traceparent.
	Tracing bool
}

// App is the service, built: its HTTP handler (the API, the demo page and
// the docs), and the background work Start runs.
type App struct {
	Handler http.Handler
	// The idempotency store and the keyed operations: tests build
	// reconcilers of their own over them.
	Keys       *idempotency.Store
	Operations *idempotency.Registry

	cfg      config.Server
	log      *slog.Logger
	listener *idempotency.Listener
	jobs     *river.Client[pgx.Tx]
	workers  []func(context.Context)
	stop     context.CancelFunc
	running  sync.WaitGroup
}

// New builds the service over pool. cfg.ProcessorURL must name the card
// processor (cmd/server starts the fake one in-process when none is
// configured); the faults (cfg.CrashPoints, cfg.StallPoints) are checked here.
func New(cfg config.Server, pool *pgxpool.Pool, log *slog.Logger, opts Options) (*App, error) {
	a := &App{cfg: cfg, log: log}
	// One connection LISTENs for the records duplicates wait on.
	connConfig := pool.Config().ConnConfig
	a.listener = idempotency.NewListener(func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, connConfig.Copy())
	}, log.With("component", "listener"))
	var processor cardprocessor.Processor = cardprocessor.NewClient(cfg.ProcessorURL, cfg.ProcessorTimeout)

	// The test facility's faults (faults.go), when any is asked for; the
	// store gets none otherwise.
	var storeFaults idempotency.Faults
	f := &faults{log: log}
	var demo *server.Demo
	if cfg.CrashPoints != "" || cfg.DemoMode {
		crash, err := ParseCrashPoints(cfg.CrashPoints)
		if err != nil {
			return nil, fmt.Errorf("FAULT_CRASH_POINTS: %w", err)
		}
		crash.log = log
		f.crash, storeFaults = crash, f
		processor = crashingProcessor{processor, crash}
		if cfg.DemoMode {
			demo = &server.Demo{Crash: crash, ProcessorURL: cfg.ProcessorURL, StartedAt: time.Now()}
			if opts.Traces != nil {
				demo.Traces = opts.Traces.Trace
			}
			log.Warn("DEMO_MODE is on: /demo can crash this server and make its processor fail; never in production")
		}
	}
	if cfg.StallPoints != "" {
		stall, err := parseStalls(cfg.StallPoints, cfg.Lease)
		if err != nil {
			return nil, fmt.Errorf("FAULT_STALL_POINTS: %w", err)
		}
		f.stall, storeFaults = stall, f
		log.Warn("FAULT_STALL_POINTS is set: owners stall past their leases on purpose; never in production", "points", cfg.StallPoints)
	}
	if cfg.UnfencedCompletion {
		f.unfenced, storeFaults = true, f
		log.Warn("FAULT_UNFENCED_COMPLETION is set: completions are written WITHOUT their fence, a planted bug; never in production")
	}
	a.Keys = idempotency.NewStore(pool, idempotency.StoreConfig{Lease: cfg.Lease, MaxRun: cfg.MaxRun(),
		Wait: cfg.IdempotencyWait, Listener: a.listener, Faults: storeFaults}, log)
	a.Keys.CacheReplays(cfg.ReplayCacheSize, cfg.Retention)

	// Payouts run as River jobs: a request enqueues one in its own
	// transaction (payouts.Service); this process runs them if PAYOUT_WORKERS > 0.
	worker := payouts.NewWorker(pool, processor, cfg.PayoutJobTimeout(), cfg.PayoutGiveUpAfter, log.With("component", "payouts"))
	jobs, err := payouts.NewJobs(pool, worker, payouts.JobsConfig{Workers: cfg.PayoutWorkers, JobTimeout: cfg.PayoutJobTimeout(),
		RescueAfter: cfg.PayoutRescueAfter, FetchPollInterval: opts.JobPollInterval, Logger: log.With("component", "river")})
	if err != nil {
		return nil, fmt.Errorf("payout jobs: %w", err)
	}
	a.jobs = jobs

	// Every keyed operation, and every read declared, as its domain package
	// declares it: the server serves each from its declaration, and the
	// reconciler resumes the external ones with the very steps a client's
	// retry runs.
	chargeService := charges.NewService(pool, processor)
	a.Operations, err = idempotency.NewRegistry(
		orders.CreateOperation, orders.GetOperation,
		chargeService.ChargeOperation(),
		chargeService.RefundOperation(),
		payouts.NewService(jobs).Operation(),
	)
	if err != nil {
		return nil, err
	}

	// The processor's events, each applied by the package owning its object.
	inbox := events.NewInbox(pool, log)
	inbox.Handle(events.ProcessorChargeSucceeded, charges.ApplyChargeEvent)
	inbox.Handle(events.ProcessorChargeFailed, charges.ApplyChargeEvent)
	inbox.Handle(events.ProcessorRefundSucceeded, charges.ApplyRefundEvent)
	inbox.Handle(events.ProcessorPayoutPaid, payouts.ApplyPayoutEvent)
	inbox.Handle(events.ProcessorPayoutFailed, payouts.ApplyPayoutEvent)
	if err := a.addWorkers(pool, opts.DemoReceiverURL); err != nil {
		return nil, err
	}
	a.Handler, err = server.New(server.Deps{Config: cfg, Pool: pool, Log: log, Keys: a.Keys, Operations: a.Operations,
		Inbox: inbox, Demo: demo, Tracing: opts.Tracing})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// addWorkers builds the background workers the configuration turns on:
// the reconciler and the outbox relay.
func (a *App) addWorkers(pool *pgxpool.Pool, demoReceiverURL string) error {
	cfg := a.cfg
	if !cfg.DemoMode {
		demoReceiverURL = "" // it exists only in the demo (internal/server)
	}
	if cfg.Reconciler {
		r, err := a.Reconciler(time.Second)
		if err != nil {
			return err
		}
		a.workers = append(a.workers, r.Run)
	}
	if cfg.Relay {
		r, err := events.NewRelay(events.RelayConfig{
			Interval:     cfg.RelayInterval,
			Batch:        16,
			Lease:        30 * time.Second,
			Timeout:      5 * time.Second,
			DemoURL:      demoReceiverURL,
			AllowPrivate: cfg.WebhookAllowPrivate,
			BackoffBase:  time.Second,
			BackoffCap:   time.Hour,
		}, pool, a.log.With("component", "relay"))
		if err != nil {
			return err
		}
		a.workers = append(a.workers, r.Run)
	}
	return nil
}

// Reconciler is a reconciler configured as the service runs it, with the
// given backoff base (a second in the service; tests shorten it).
func (a *App) Reconciler(backoffBase time.Duration) (*idempotency.Reconciler, error) {
	return idempotency.NewReconciler(idempotency.ReconcilerConfig{
		Interval: a.cfg.ReconcilerInterval,
		// Up to 5 records at once (their leases start at the claim); the
		// loop runs again at once while it finds work, within the budget.
		Batch:       5,
		MaxRun:      a.cfg.MaxRun(),
		MaxTries:    a.cfg.ReconcilerMaxAttempts,
		MaxAge:      a.cfg.ReconcilerMaxAge,
		BackoffBase: backoffBase,
		BackoffCap:  5 * time.Minute,
		// At most 5 retries per interval (5/s by default), 20 saved up.
		RetriesPerInterval: 5,
		RetryBurst:         20,
	}, a.Keys, a.Operations, a.log.With("component", "reconciler"))
}

// Start runs the background work: the listener that wakes waiting
// duplicates, and the reconciler, relay and payout jobs the configuration
// turns on. New starts no goroutine, so a New that fails leaves nothing to
// stop. They run until Stop, on a context of their own: the caller's
// cancellation (a SIGTERM) does not cut off the record they are handling.
func (a *App) Start(ctx context.Context) error {
	ctx, a.stop = context.WithCancel(context.WithoutCancel(ctx))
	a.running.Go(func() { a.listener.Run(ctx) })
	for _, w := range a.workers {
		a.running.Go(func() { w(ctx) })
	}
	if a.cfg.PayoutWorkers > 0 {
		if err := a.jobs.Start(ctx); err != nil {
			a.stop()
			a.running.Wait()
			return fmt.Errorf("start payout jobs: %w", err)
		}
	}
	return nil
}

// Stop, called before the pool closes, stops the background work: the
// workers between two records, the payout jobs after their current step
// (past ctx's deadline they are canceled; a canceled step runs again
// later under the same downstream key).
func (a *App) Stop(ctx context.Context) error {
	if a.stop == nil {
		return nil
	}
	var err error
	if a.cfg.PayoutWorkers > 0 {
		if err = a.jobs.Stop(ctx); err != nil {
			err = errors.Join(err, a.jobs.StopAndCancel(context.WithoutCancel(ctx)))
		}
	}
	a.stop()
	a.running.Wait()
	return err
}
