package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/payments/internal/faults"
	"github.com/retrysafe/payments/internal/processor"
)

// Config is the server's configuration, read from the environment.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string (DATABASE_URL).
	DatabaseURL string
	// HTTPAddr is the listen address (HTTP_ADDR).
	HTTPAddr string
	// The HTTP server's timeouts, so that a slow or idle client cannot hold
	// a connection for ever:
	//   - ReadHeaderTimeout (HTTP_READ_HEADER_TIMEOUT): the request line and
	//     headers must arrive within it.
	//   - ReadTimeout (HTTP_READ_TIMEOUT): the whole request, body included,
	//     counted afresh for every request on a connection. The default 10s
	//     lets the largest allowed body (MaxBodyBytes, 64 KiB) arrive at
	//     6.4 KiB/s, and cuts off a client that trickles it byte by byte; the
	//     body's reader then fails and the request is answered 408.
	//   - WriteTimeout (HTTP_WRITE_TIMEOUT): from the end of the headers to
	//     the end of the response. A keyed operation may run for up to its
	//     lease, so this must be longer than the lease, or a slow but
	//     healthy charge would lose its answer (the client's retry would
	//     still get it, as a replay).
	//   - IdleTimeout (HTTP_IDLE_TIMEOUT): how long a keep-alive connection
	//     may wait for its next request.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Lease is how long an execution holds an idempotency key before another
	// request may take it over (IDEMPOTENCY_LEASE).
	Lease time.Duration
	// Retention is how long idempotency keys are remembered
	// (IDEMPOTENCY_KEY_RETENTION); records show it as expires_at.
	Retention time.Duration
	// MaxBodyBytes is the largest request body accepted; larger is a 413
	// (MAX_BODY_BYTES).
	MaxBodyBytes int64
	// SeedDemoCallers creates the demo callers acme and globex at start-up
	// (SEED_DEMO_CALLERS).
	SeedDemoCallers bool
	// ShutdownTimeout bounds the graceful shutdown (SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// AuthCacheTTL is how long a known API key is trusted without asking the
	// database again (AUTH_CACHE_TTL).
	AuthCacheTTL time.Duration
	// ProcessorURL is the card processor's base URL (PROCESSOR_URL). Empty
	// means cmd/server starts the fake processor in-process.
	ProcessorURL string
	// ProcessorTimeout bounds one call to the processor (PROCESSOR_TIMEOUT).
	// It must be well below the lease.
	ProcessorTimeout time.Duration
	// CrashPoints are the test facility's crash points
	// (FAULT_CRASH_POINTS, comma-separated; see internal/faults). Off by
	// default; never set in production.
	CrashPoints faults.CrashPoints
	// ProcessorWebhookSecret verifies the processor's webhook signatures
	// (PROCESSOR_WEBHOOK_SECRET).
	ProcessorWebhookSecret []byte
	// Reconciler runs the background workers, the reconciler and the outbox
	// relay, in this process (RECONCILER_ENABLED), scanning every
	// ReconcilerInterval
	// (RECONCILER_INTERVAL) and setting aside records past
	// ReconcilerMaxAttempts (RECONCILER_MAX_ATTEMPTS) or ReconcilerMaxAge
	// (RECONCILER_MAX_AGE).
	Reconciler            bool
	ReconcilerInterval    time.Duration
	ReconcilerMaxAttempts int32
	ReconcilerMaxAge      time.Duration
}

// DefaultDatabaseURL is the local PostgreSQL of the README. pool_max_conns
// is pgx's pool size setting (its own default is 4 on a small machine).
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/payments?sslmode=disable&pool_max_conns=20"

// HTTPServer returns the http.Server that serves handler with the
// configured timeouts. Requests get base as their context, so that the
// signal which starts a graceful shutdown does not cancel them.
func (cfg Config) HTTPServer(base context.Context, handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
}

// LoadConfig reads the configuration through getenv, applying defaults,
// and reports every invalid variable at once.
func LoadConfig(getenv func(string) string) (Config, error) {
	var errs []error
	str := func(name, def string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		return def
	}
	duration := func(name string, def time.Duration) time.Duration {
		v := str(name, "")
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive Go duration such as 30s or 24h", name, v))
			return def
		}
		return d
	}
	cfg := Config{
		DatabaseURL:            str("DATABASE_URL", DefaultDatabaseURL),
		HTTPAddr:               str("HTTP_ADDR", ":8080"),
		ReadHeaderTimeout:      duration("HTTP_READ_HEADER_TIMEOUT", 5*time.Second),
		ReadTimeout:            duration("HTTP_READ_TIMEOUT", 10*time.Second),
		WriteTimeout:           duration("HTTP_WRITE_TIMEOUT", 45*time.Second),
		IdleTimeout:            duration("HTTP_IDLE_TIMEOUT", 60*time.Second),
		Lease:                  duration("IDEMPOTENCY_LEASE", 30*time.Second),
		Retention:              duration("IDEMPOTENCY_KEY_RETENTION", 24*time.Hour),
		ShutdownTimeout:        duration("SHUTDOWN_TIMEOUT", 15*time.Second),
		AuthCacheTTL:           duration("AUTH_CACHE_TTL", time.Minute),
		ProcessorURL:           str("PROCESSOR_URL", ""),
		ProcessorWebhookSecret: []byte(str("PROCESSOR_WEBHOOK_SECRET", processor.DefaultWebhookSecret)),
		ProcessorTimeout:       duration("PROCESSOR_TIMEOUT", 10*time.Second),
		MaxBodyBytes:           64 << 10,
		SeedDemoCallers:        true,
		Reconciler:             true,
		ReconcilerInterval:     duration("RECONCILER_INTERVAL", time.Second),
		ReconcilerMaxAttempts:  10,
		ReconcilerMaxAge:       duration("RECONCILER_MAX_AGE", time.Hour),
	}
	if v := str("MAX_BODY_BYTES", ""); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("MAX_BODY_BYTES=%q: want a positive number of bytes", v))
		} else {
			cfg.MaxBodyBytes = n
		}
	}
	if v := str("RECONCILER_ENABLED", ""); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("RECONCILER_ENABLED=%q: want true or false", v))
		} else {
			cfg.Reconciler = b
		}
	}
	if v := str("RECONCILER_MAX_ATTEMPTS", ""); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("RECONCILER_MAX_ATTEMPTS=%q: want a positive number", v))
		} else {
			cfg.ReconcilerMaxAttempts = int32(n)
		}
	}
	// A record must be set aside before the sweeper could consider it.
	if cfg.ReconcilerMaxAge >= cfg.Retention {
		errs = append(errs, fmt.Errorf("RECONCILER_MAX_AGE (%s) must be shorter than IDEMPOTENCY_KEY_RETENTION (%s)", cfg.ReconcilerMaxAge, cfg.Retention))
	}
	if v := str("SEED_DEMO_CALLERS", ""); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("SEED_DEMO_CALLERS=%q: want true or false", v))
		} else {
			cfg.SeedDemoCallers = b
		}
	}
	// A window shorter than the lease would let the sweeper forget an
	// operation that is still allowed to be running.
	if cfg.Retention <= cfg.Lease {
		errs = append(errs, fmt.Errorf("IDEMPOTENCY_KEY_RETENTION (%s) must be longer than IDEMPOTENCY_LEASE (%s)", cfg.Retention, cfg.Lease))
	}
	if v := str("FAULT_CRASH_POINTS", ""); v != "" {
		cp, err := faults.Parse(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("FAULT_CRASH_POINTS: %w", err))
		}
		cfg.CrashPoints = cp
	}
	// The lease covers a whole operation, processor call included: a lease
	// shorter than the call would let a retry take over a live charge.
	if cfg.ProcessorTimeout >= cfg.Lease {
		errs = append(errs, fmt.Errorf("PROCESSOR_TIMEOUT (%s) must be shorter than IDEMPOTENCY_LEASE (%s)", cfg.ProcessorTimeout, cfg.Lease))
	}
	if cfg.ReadHeaderTimeout > cfg.ReadTimeout {
		errs = append(errs, fmt.Errorf("HTTP_READ_HEADER_TIMEOUT (%s) must not be longer than HTTP_READ_TIMEOUT (%s), which covers the headers too", cfg.ReadHeaderTimeout, cfg.ReadTimeout))
	}
	if cfg.WriteTimeout <= cfg.Lease {
		errs = append(errs, fmt.Errorf("HTTP_WRITE_TIMEOUT (%s) must be longer than IDEMPOTENCY_LEASE (%s): an operation may run for its whole lease before it answers", cfg.WriteTimeout, cfg.Lease))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}
