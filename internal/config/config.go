// Package config reads the programs' configuration from the environment.
//
// It is its own small package, importing nothing of the service, so that
// each binary links only what it runs: the sweeper reads the database URL
// and the retention windows here without linking the HTTP server, and
// without being refused over a setting that only the server uses.
//
// The OpenTelemetry variables (OTEL_*) are not read here: the SDK reads
// them itself when internal/app's SetupTracing installs it.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// DefaultDatabaseURL is the local PostgreSQL of the README. pool_max_conns
// is pgx's pool size setting (its own default is 4 on a small machine).
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/payments?sslmode=disable&pool_max_conns=20"

// The defaults of the settings that more than one program reads.
const (
	DefaultLease            = 10 * time.Second
	DefaultRetention        = 24 * time.Hour
	DefaultReconcilerMaxAge = time.Hour
)

// DemoProcessorWebhookSecret is the fake card processor's default webhook
// secret. It is published, so anyone could sign a webhook with it: the
// server accepts it only in DEMO_MODE.
const DemoProcessorWebhookSecret = "whsec_test_processor" // #nosec G101 -- published on purpose; refused outside DEMO_MODE

// Server is the configuration of cmd/server: the API and the background
// workers it runs. Each field names its variable; docs/operations.md's
// table gives the defaults.
type Server struct {
	DatabaseURL string // DATABASE_URL
	HTTPAddr    string // HTTP_ADDR; loopback only by default in DEMO_MODE
	// CORSAllowedOrigins (CORS_ALLOWED_ORIGINS, comma-separated) are the
	// other origins whose pages may call the API; any other origin's page
	// is refused (403) before it can spend a key.
	CORSAllowedOrigins []string
	// The HTTP server's timeouts, so that a slow or idle client cannot hold
	// a connection for ever: HTTP_READ_HEADER_TIMEOUT, HTTP_READ_TIMEOUT
	// (the whole request, else a 408; the default 10s lets the largest body
	// arrive at 6.4 KiB/s), HTTP_WRITE_TIMEOUT and HTTP_IDLE_TIMEOUT. The
	// write timeout runs from the end of the headers to the end of the
	// response, so it must exceed ReadTimeout + IdempotencyWait + MaxRun +
	// CleanupAllowance, or a slow but healthy charge would lose its answer
	// (the client's retry would still get it, as a replay).
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Lease (IDEMPOTENCY_LEASE) is an owner's hold on a key. A live owner
	// renews it every third of a lease, so only a dead (or cut-off) owner
	// loses it, and a retry or the reconciler takes the key over.
	Lease time.Duration
	// IdempotencyWait (IDEMPOTENCY_WAIT) is how long a duplicate waits,
	// holding no connection, for the original's answer; 0 answers 409 at once.
	IdempotencyWait time.Duration
	Retention       time.Duration // IDEMPOTENCY_KEY_RETENTION; records show it as expires_at
	// ReplayCacheSize (IDEMPOTENCY_REPLAY_CACHE_SIZE) is how many answers each
	// process replays from memory (0: none), each within its record's window.
	ReplayCacheSize int
	MaxBodyBytes    int64 // MAX_BODY_BYTES; larger is a 413
	// SeedDemoCallers (SEED_DEMO_CALLERS) creates the demo callers acme and
	// globex. Their keys are published, so it defaults to on only in
	// DEMO_MODE; off, their keys are refused even if left in the database.
	SeedDemoCallers  bool
	ShutdownTimeout  time.Duration // SHUTDOWN_TIMEOUT
	AuthCacheTTL     time.Duration // AUTH_CACHE_TTL: how long a known API key is trusted
	ProcessorURL     string        // PROCESSOR_URL; empty runs the fake one in-process
	ProcessorTimeout time.Duration // PROCESSOR_TIMEOUT: one call; MaxRun bounds the run
	// ProcessorWebhookSecret (PROCESSOR_WEBHOOK_SECRET) verifies the
	// processor's webhooks: required with ProcessorURL, the published demo
	// secret only in DemoMode, random (made by cmd/server) if left empty.
	ProcessorWebhookSecret []byte
	// DemoMode (DEMO_MODE) turns on the /demo endpoints: chaos settings, a
	// crash point, the processor's ledger. Only `make run` sets it, never
	// production: anyone who can reach the server could crash it.
	DemoMode bool
	// The test faults, never set in production (internal/app checks the
	// names): FAULT_CRASH_POINTS, FAULT_STALL_POINTS (an owner stops past
	// its lease), both comma-separated, and FAULT_UNFENCED_COMPLETION, a
	// planted bug the history check must catch.
	CrashPoints, StallPoints string
	UnfencedCompletion       bool
	// The reconciler and the outbox relay run in this process when enabled,
	// scanning every interval when idle; the reconciler marks a record dead
	// past ReconcilerMaxAttempts of its own tries or ReconcilerMaxAge.
	Reconciler            bool          // RECONCILER_ENABLED
	ReconcilerInterval    time.Duration // RECONCILER_INTERVAL
	ReconcilerMaxAttempts int           // RECONCILER_MAX_ATTEMPTS
	ReconcilerMaxAge      time.Duration // RECONCILER_MAX_AGE
	Relay                 bool          // RELAY_ENABLED
	RelayInterval         time.Duration // RELAY_INTERVAL
	LogFormat             string        // LOG_FORMAT: json, text, or empty for text on a terminal
	PayoutWorkers         int           // PAYOUT_WORKERS: payout jobs run at once here; 0 only enqueues them
	// PayoutGiveUpAfter (PAYOUT_GIVE_UP_AFTER) is how long a payout may go
	// without a definite answer (429s and 503s snooze it, using none of
	// River's attempts), or stay in transit, before it is set aside.
	PayoutGiveUpAfter time.Duration
	// RateLimit (RATE_LIMIT_PER_SECOND; 0: off) and RateBurst
	// (RATE_LIMIT_BURST) are each caller's token bucket per replica: n
	// replicas behind a load balancer let a caller send n times as much.
	RateLimit      float64
	RateBurst      int
	MaxHeaderBytes int // HTTP_MAX_HEADER_BYTES; Go's server answers more with a 431
	MaxHeaders     int // HTTP_MAX_HEADERS; more is a 431 problem
	// MaxConnections (HTTP_MAX_CONNECTIONS) caps this process's open
	// connections (an idle one costs tens of KiB), closing the one idle
	// longest at the cap; one address holds at most MaxConnectionsPerAddress
	// (HTTP_MAX_CONNECTIONS_PER_ADDRESS: a quarter; the cap behind a proxy).
	MaxConnections, MaxConnectionsPerAddress int
	// WebhookAllowPrivate (WEBHOOK_ALLOW_PRIVATE; on in DEMO_MODE) allows
	// loopback and private webhook endpoints. Off, they are refused when
	// set and when the relay connects: it must not be a way into the network.
	WebhookAllowPrivate bool
	// MetricsAddr (METRICS_ADDR) serves /metrics on a listener of its own, so
	// the business volume it shows is not open to the API's callers.
	MetricsAddr string
	// PayoutRescueAfter (PAYOUT_RESCUE_AFTER) is how long a payout job may
	// run before River runs it again. It must exceed PayoutJobTimeout, so a
	// live job is never rescued (it would still pay once, but work twice).
	PayoutRescueAfter time.Duration
}

// MaxRun is the longest one execution of a keyed operation may take,
// however long its owner renews its lease (a processor call and the phases
// around it): a call that never returns must not hold the key for ever.
func (c Server) MaxRun() time.Duration { return c.ProcessorTimeout + 2*CleanupAllowance }

// PayoutJobTimeout is the longest one run of a payout job may take: one
// processor call and two short transactions. River cancels a run that
// takes longer, and retries it.
func (c Server) PayoutJobTimeout() time.Duration { return c.ProcessorTimeout + CleanupAllowance }

// Load reads the server's configuration through getenv, applying
// defaults, and reports every invalid variable at once.
func Load(getenv func(string) string) (Server, error) {
	r := NewReader(getenv)
	cfg := Server{
		DatabaseURL:            r.String("DATABASE_URL", DefaultDatabaseURL),
		ReadHeaderTimeout:      r.Duration("HTTP_READ_HEADER_TIMEOUT", 5*time.Second),
		ReadTimeout:            r.Duration("HTTP_READ_TIMEOUT", 10*time.Second),
		WriteTimeout:           r.Duration("HTTP_WRITE_TIMEOUT", 60*time.Second),
		IdleTimeout:            r.Duration("HTTP_IDLE_TIMEOUT", 60*time.Second),
		Lease:                  r.Duration("IDEMPOTENCY_LEASE", DefaultLease),
		IdempotencyWait:        r.NonNegativeDuration("IDEMPOTENCY_WAIT", 5*time.Second),
		Retention:              r.Duration("IDEMPOTENCY_KEY_RETENTION", DefaultRetention),
		ReplayCacheSize:        r.Int("IDEMPOTENCY_REPLAY_CACHE_SIZE", 10_000, 0),
		MaxBodyBytes:           int64(r.Int("MAX_BODY_BYTES", 64<<10, 1)),
		ShutdownTimeout:        r.Duration("SHUTDOWN_TIMEOUT", 15*time.Second),
		AuthCacheTTL:           r.Duration("AUTH_CACHE_TTL", time.Minute),
		ProcessorURL:           r.String("PROCESSOR_URL", ""),
		ProcessorTimeout:       r.Duration("PROCESSOR_TIMEOUT", 10*time.Second),
		ProcessorWebhookSecret: []byte(r.String("PROCESSOR_WEBHOOK_SECRET", "")),
		Reconciler:             r.Bool("RECONCILER_ENABLED", true),
		ReconcilerInterval:     r.Duration("RECONCILER_INTERVAL", time.Second),
		ReconcilerMaxAttempts:  r.Int("RECONCILER_MAX_ATTEMPTS", 10, 1),
		ReconcilerMaxAge:       r.Duration("RECONCILER_MAX_AGE", DefaultReconcilerMaxAge),
		Relay:                  r.Bool("RELAY_ENABLED", true),
		RelayInterval:          r.Duration("RELAY_INTERVAL", time.Second),
		DemoMode:               r.Bool("DEMO_MODE", false),
		PayoutWorkers:          r.Int("PAYOUT_WORKERS", 4, 0),
		LogFormat:              r.String("LOG_FORMAT", ""),
		PayoutRescueAfter:      r.Duration("PAYOUT_RESCUE_AFTER", time.Minute),
		PayoutGiveUpAfter:      r.Duration("PAYOUT_GIVE_UP_AFTER", 24*time.Hour),
		RateLimit:              r.Float("RATE_LIMIT_PER_SECOND", 100),
		RateBurst:              r.Int("RATE_LIMIT_BURST", 200, 1),
		MaxHeaderBytes:         r.Int("HTTP_MAX_HEADER_BYTES", 16<<10, 1<<10),
		MaxHeaders:             r.Int("HTTP_MAX_HEADERS", 64, 8),
		MaxConnections:         r.Int("HTTP_MAX_CONNECTIONS", 1000, 1),
		MetricsAddr:            r.String("METRICS_ADDR", ""),
	}
	cfg.MaxConnectionsPerAddress = r.Int("HTTP_MAX_CONNECTIONS_PER_ADDRESS", max(1, cfg.MaxConnections/4), 1)
	// The demo crashes and moves money for whoever reaches it: it listens
	// on loopback unless told otherwise.
	addr := ":8080"
	if cfg.DemoMode {
		addr = "127.0.0.1:8080"
	}
	cfg.HTTPAddr = r.String("HTTP_ADDR", addr)
	for o := range strings.SplitSeq(r.String("CORS_ALLOWED_ORIGINS", ""), ",") {
		if o = strings.TrimSpace(o); o != "" {
			cfg.CORSAllowedOrigins = append(cfg.CORSAllowedOrigins, o)
		}
	}
	cfg.WebhookAllowPrivate = r.Bool("WEBHOOK_ALLOW_PRIVATE", cfg.DemoMode)
	cfg.SeedDemoCallers = r.Bool("SEED_DEMO_CALLERS", cfg.DemoMode)
	cfg.CrashPoints = r.String("FAULT_CRASH_POINTS", "")
	cfg.StallPoints = r.String("FAULT_STALL_POINTS", "")
	cfg.UnfencedCompletion = r.Bool("FAULT_UNFENCED_COMPLETION", false)

	// No published secret outside the demo: anyone holding the processor's
	// webhook secret can tell the service that money moved.
	secret := string(cfg.ProcessorWebhookSecret)
	r.Check(cfg.ProcessorURL == "" || secret != "",
		"PROCESSOR_WEBHOOK_SECRET is not set: with PROCESSOR_URL set, the server must know the secret that processor signs its webhooks with (your processor's dashboard shows it)")
	r.Check(secret != DemoProcessorWebhookSecret || cfg.DemoMode,
		"PROCESSOR_WEBHOOK_SECRET is the published test secret %q: anyone could sign a webhook with it. Set the processor's own secret (it is accepted only with DEMO_MODE=true)", DemoProcessorWebhookSecret)

	// The rules between settings.
	checkRetention(r, cfg.Retention, cfg.Lease, cfg.ReconcilerMaxAge)
	// Renewed every third of a lease, a shorter one would be mostly renewals.
	r.Check(cfg.Lease >= time.Second,
		"IDEMPOTENCY_LEASE (%s) must be at least 1s: a live owner renews it every third of a lease", cfg.Lease)
	r.Check(cfg.ReadHeaderTimeout <= cfg.ReadTimeout,
		"HTTP_READ_HEADER_TIMEOUT (%s) must not be longer than HTTP_READ_TIMEOUT (%s), which covers the headers too", cfg.ReadHeaderTimeout, cfg.ReadTimeout)
	r.Check(cfg.WriteTimeout > cfg.ReadTimeout+cfg.IdempotencyWait+cfg.MaxRun()+CleanupAllowance,
		"HTTP_WRITE_TIMEOUT (%s) must be longer than HTTP_READ_TIMEOUT (%s) + IDEMPOTENCY_WAIT (%s) + the longest run of an operation, PROCESSOR_TIMEOUT + %s (%s), + %s: a request may read its body, wait for the original, run the operation and clean up before it answers",
		cfg.WriteTimeout, cfg.ReadTimeout, cfg.IdempotencyWait, 2*CleanupAllowance, cfg.MaxRun(), CleanupAllowance)
	r.Check(cfg.LogFormat == "" || cfg.LogFormat == "json" || cfg.LogFormat == "text",
		"LOG_FORMAT=%q: want json or text (or leave it unset: text on a terminal, JSON otherwise)", cfg.LogFormat)
	r.Check(cfg.PayoutRescueAfter > cfg.PayoutJobTimeout(),
		"PAYOUT_RESCUE_AFTER (%s) must be longer than a payout job's timeout, PROCESSOR_TIMEOUT + %s (%s): a job still running must not be rescued",
		cfg.PayoutRescueAfter, CleanupAllowance, cfg.PayoutJobTimeout())
	return cfg, r.Err()
}

// CleanupAllowance is how long an operation's wrap-up writes may take after
// its handler failed. It repeats the idempotency store's cleanupTimeout
// (config imports nothing of the service): keep them equal.
const CleanupAllowance = 5 * time.Second

// checkRetention holds the rules that keep the retention window safe,
// checked by every program that reads it: the sweeper deletes by the same
// window the server promises its clients.
func checkRetention(r *Reader, retention, lease, reconcilerMaxAge time.Duration) {
	// A shorter window would let the sweeper forget an operation that may
	// still be running (and a late retry would run it again).
	r.Check(retention > lease,
		"IDEMPOTENCY_KEY_RETENTION (%s) must be longer than IDEMPOTENCY_LEASE (%s)", retention, lease)
	// A record must be dead before the sweeper could consider it.
	r.Check(reconcilerMaxAge < retention,
		"RECONCILER_MAX_AGE (%s) must be shorter than IDEMPOTENCY_KEY_RETENTION (%s)", reconcilerMaxAge, retention)
}

// Sweeper is the configuration of cmd/sweeper: the retention windows, read
// as the server reads them and held to the same rules (so it also reads
// IDEMPOTENCY_LEASE and RECONCILER_MAX_AGE, which the window must outlast).
type Sweeper struct {
	DatabaseURL  string        // DATABASE_URL
	KeyRetention time.Duration // IDEMPOTENCY_KEY_RETENTION, the server's window
	// EventRetention (OUTBOX_EVENT_RETENTION) and WebhookRetention
	// (WEBHOOK_EVENT_RETENTION) keep delivered events and webhook ids.
	EventRetention, WebhookRetention time.Duration
}

// LoadSweeper reads the sweeper's configuration through getenv.
func LoadSweeper(getenv func(string) string) (Sweeper, error) {
	r := NewReader(getenv)
	cfg := Sweeper{
		DatabaseURL:      r.String("DATABASE_URL", DefaultDatabaseURL),
		KeyRetention:     r.Duration("IDEMPOTENCY_KEY_RETENTION", DefaultRetention),
		EventRetention:   r.Duration("OUTBOX_EVENT_RETENTION", 30*24*time.Hour),
		WebhookRetention: r.Duration("WEBHOOK_EVENT_RETENTION", 30*24*time.Hour),
	}
	checkRetention(r, cfg.KeyRetention, r.Duration("IDEMPOTENCY_LEASE", DefaultLease), r.Duration("RECONCILER_MAX_AGE", DefaultReconcilerMaxAge))
	return cfg, r.Err()
}

// Reader reads environment variables and collects what is wrong with them,
// instead of stopping at the first, so that an operator fixes a deployment
// in one go: each method returns the default for an invalid value and
// notes the error; Err reports them all.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// NewReader returns a Reader over getenv (os.Getenv, or a map in tests).
func NewReader(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// String is the variable name, trimmed, or def when it is unset or blank.
func (r *Reader) String(name, def string) string {
	return cmp.Or(strings.TrimSpace(r.getenv(name)), def)
}

// read is the variable name as parse reads it, or def when it is unset; a
// value parse refuses is noted (the variable wants what want says): def.
func read[T any](r *Reader, name string, def T, want string, parse func(string) (T, bool)) T {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	if x, ok := parse(v); ok {
		return x
	}
	r.errs = append(r.errs, fmt.Errorf("%s=%q: want %s", name, v, want))
	return def
}

// Duration is a positive Go duration such as 30s or 24h.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	return read(r, name, def, "a positive Go duration such as 30s or 24h", func(v string) (time.Duration, bool) {
		d, err := time.ParseDuration(v)
		return d, err == nil && d > 0
	})
}

// NonNegativeDuration is a Go duration of 0 or more, such as 0 or 5s.
func (r *Reader) NonNegativeDuration(name string, def time.Duration) time.Duration {
	return read(r, name, def, "a Go duration of 0 or more, such as 0 or 5s", func(v string) (time.Duration, bool) {
		d, err := time.ParseDuration(v)
		return d, err == nil && d >= 0
	})
}

// Int is an integer of at least least.
func (r *Reader) Int(name string, def, least int) int {
	return read(r, name, def, fmt.Sprintf("an integer of at least %d", least), func(v string) (int, bool) {
		n, err := strconv.Atoi(v)
		return n, err == nil && n >= least
	})
}

// Float is a number of at least 0.
func (r *Reader) Float(name string, def float64) float64 {
	return read(r, name, def, "a number of at least 0", func(v string) (float64, bool) {
		f, err := strconv.ParseFloat(v, 64)
		return f, err == nil && f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f)
	})
}

// Bool is true or false (strconv.ParseBool's spellings).
func (r *Reader) Bool(name string, def bool) bool {
	return read(r, name, def, "true or false", func(v string) (bool, bool) {
		b, err := strconv.ParseBool(v)
		return b, err == nil
	})
}

// Check notes a rule between settings that does not hold.
func (r *Reader) Check(ok bool, format string, args ...any) {
	if !ok {
		r.errs = append(r.errs, fmt.Errorf(format, args...))
	}
}

// Err reports every problem found, or nil.
func (r *Reader) Err() error {
	if err := errors.Join(r.errs...); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	return nil
}
