// Package config reads the programs' configuration from the environment.
//
// It is its own small package, importing nothing of the service, so that
// each binary links only what it runs: the sweeper reads the database URL
// and the retention windows here without linking the HTTP server, and
// without being refused over a setting that only the server uses.
//
// Every program reports every invalid variable at once, so that an
// operator fixes a deployment in one go (see Reader).
//
// The OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and the rest) are not read here:
// the OpenTelemetry SDK reads them itself, as every program using it does,
// when internal/app's SetupTracing installs it. The README's table lists
// them with the others.
package config

import (
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

// DemoProcessorWebhookSecret is the secret the fake card processor signs
// its webhooks with unless told otherwise. It is published (in this file,
// the README and every fork), so anyone could sign a webhook with it: the
// server accepts it only in DEMO_MODE.
const DemoProcessorWebhookSecret = "whsec_test_processor" // #nosec G101 -- published on purpose; refused outside DEMO_MODE

// Server is the configuration of cmd/server: the API and the background
// workers it runs.
type Server struct {
	// DatabaseURL is the PostgreSQL connection string (DATABASE_URL).
	DatabaseURL string
	// HTTPAddr is the listen address (HTTP_ADDR): every interface's port
	// 8080, or only loopback's in DEMO_MODE.
	HTTPAddr string
	// CORSAllowedOrigins are the browser origins, other than the server's
	// own, whose pages may call the API (CORS_ALLOWED_ORIGINS, separated
	// by commas, e.g. https://shop.example). None by default: a browser
	// page of any other origin is refused (403) before it can spend a key.
	CORSAllowedOrigins []string
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
	//     the end of the response. It covers reading the body (up to
	//     ReadTimeout), waiting for an original request's answer (up to
	//     IdempotencyWait), the operation (up to MaxRun) and the cleanup
	//     writes after a failure (CleanupAllowance), so it must exceed their
	//     sum, or a slow but healthy charge would lose its answer (the
	//     client's retry would still get it, as a replay).
	//   - IdleTimeout (HTTP_IDLE_TIMEOUT): how long a keep-alive connection
	//     may wait for its next request.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Lease is how long an owner holds an idempotency key without renewing
	// it (IDEMPOTENCY_LEASE). A live owner renews it every third of a lease,
	// so only a dead (or cut-off) owner loses it: a crash is noticed within
	// one lease, and then a retry or the reconciler takes the key over.
	Lease time.Duration
	// IdempotencyWait is how long a request that finds its key in progress
	// under a live lease waits on the server for the original's answer,
	// holding no database connection, before it answers 409
	// (IDEMPOTENCY_WAIT); 0 answers 409 at once.
	IdempotencyWait time.Duration
	// Retention is how long idempotency keys are remembered
	// (IDEMPOTENCY_KEY_RETENTION); records show it as expires_at.
	Retention time.Duration
	// ReplayCacheSize is how many completed records' answers each process
	// keeps in memory, to replay them without a database round trip
	// (IDEMPOTENCY_REPLAY_CACHE_SIZE); 0 turns the cache off. An answer is
	// kept for less than what is left of its record's retention window.
	ReplayCacheSize int
	// MaxBodyBytes is the largest request body accepted; larger is a 413
	// (MAX_BODY_BYTES).
	MaxBodyBytes int64
	// SeedDemoCallers creates the demo callers acme and globex at start-up
	// (SEED_DEMO_CALLERS). Their API keys are published, so it is on by
	// default only in DEMO_MODE; outside it they are refused even if an
	// earlier demo left them in the database, unless it is set explicitly.
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
	// The lease is renewed while a call runs; MaxRun bounds the whole run.
	ProcessorTimeout time.Duration
	// ProcessorWebhookSecret verifies the processor's webhook signatures
	// (PROCESSOR_WEBHOOK_SECRET). It must be set when ProcessorURL is, and
	// may be the published demo secret only in DemoMode. Left empty with
	// the in-process processor, cmd/server makes a random one at start-up
	// and gives it to both.
	ProcessorWebhookSecret []byte
	// DemoMode turns on the browser demo's powers (DEMO_MODE): the /demo
	// endpoints that change the processor's chaos settings, arm a crash
	// point and read the processor's ledger. `make run` turns it on; it is
	// off everywhere else, and must never be on in production: anyone who
	// can reach the server could crash it.
	DemoMode bool
	// CrashPoints names the test facility's crash points
	// (FAULT_CRASH_POINTS, comma-separated; see internal/app, which checks
	// the names). Off by default; never set in production.
	CrashPoints string
	// StallPoints names the test facility's stall points
	// (FAULT_STALL_POINTS, comma-separated; see internal/app): an owner
	// stops there past its lease. Off by default; never set in production.
	StallPoints string
	// UnfencedCompletion writes every completion without its fence
	// (FAULT_UNFENCED_COMPLETION): a planted bug, for the test that shows
	// the history check catches it. Off by default; never set in production.
	UnfencedCompletion bool
	// Reconciler runs the reconciler in this process (RECONCILER_ENABLED),
	// scanning every ReconcilerInterval (RECONCILER_INTERVAL) when idle and
	// setting aside records past ReconcilerMaxAttempts of its own tries
	// (RECONCILER_MAX_ATTEMPTS) or ReconcilerMaxAge (RECONCILER_MAX_AGE).
	Reconciler            bool
	ReconcilerInterval    time.Duration
	ReconcilerMaxAttempts int
	ReconcilerMaxAge      time.Duration
	// Relay runs the outbox relay in this process (RELAY_ENABLED), scanning
	// every RelayInterval (RELAY_INTERVAL) when idle.
	Relay         bool
	RelayInterval time.Duration
	// LogFormat is how logs are written (LOG_FORMAT): json, text, or
	// empty for text on a terminal and JSON otherwise.
	LogFormat string
	// PayoutWorkers is how many payout jobs this process runs at once
	// (PAYOUT_WORKERS); 0 makes it only enqueue them, for a replica that
	// serves the API while others do the jobs.
	PayoutWorkers int
	// PayoutGiveUpAfter bounds how long a payout job keeps asking a
	// processor that gives no definite answer (429s and 503s whose
	// Retry-After snoozes it, which uses up none of River's attempts), and
	// how long after its expected arrival a transfer may stay in transit,
	// before the job is set aside for an operator (PAYOUT_GIVE_UP_AFTER).
	PayoutGiveUpAfter time.Duration
	// RateLimit is how many requests per second each caller may send to
	// one server process, with bursts of up to RateBurst
	// (RATE_LIMIT_PER_SECOND, RATE_LIMIT_BURST); 0 turns the limit off.
	// It is a token bucket per caller and per replica: n replicas behind a
	// load balancer let a caller send up to n times as much.
	RateLimit float64
	RateBurst int
	// MaxHeaderBytes bounds the request line and headers
	// (HTTP_MAX_HEADER_BYTES; Go's server answers a larger one with 431
	// itself), and MaxHeaders the number of header lines
	// (HTTP_MAX_HEADERS; more is a 431 problem).
	MaxHeaderBytes int
	MaxHeaders     int
	// MaxConnections is the most connections the server holds open at
	// once (HTTP_MAX_CONNECTIONS); past it, new ones wait in the kernel's
	// queue until one closes. An idle keep-alive connection costs tens of
	// KiB for IdleTimeout, so without a cap one client could hold
	// thousands. It is per process, not per address: the load balancer in
	// front limits each address.
	MaxConnections int
	// WebhookAllowPrivate lets a caller's webhook endpoint be a loopback
	// or private address (WEBHOOK_ALLOW_PRIVATE; on in DEMO_MODE, and for
	// tests). Off, such an endpoint is refused when it is set and when
	// the relay connects: the relay must not be a way into the network.
	WebhookAllowPrivate bool
	// MetricsAddr, when set, serves /metrics on a listener of its own
	// (METRICS_ADDR, e.g. 127.0.0.1:9090), and not on HTTPAddr, so that
	// the business volume the metrics show is not open to whoever can
	// reach the API. Set it in production.
	MetricsAddr string
	// PayoutRescueAfter is how long a payout job may stay running before
	// River treats it as abandoned (its process died) and runs it again
	// (PAYOUT_RESCUE_AFTER). It must exceed PayoutJobTimeout, so that a live
	// job is never rescued; running one twice would still pay once (the
	// downstream key), but it would be work done twice.
	PayoutRescueAfter time.Duration
}

// MaxRun is the longest one execution of a keyed operation may take,
// however long its owner keeps its lease renewed: a processor call and the
// phases around it. A processor call that never returns must not hold the
// key for ever.
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
		DatabaseURL:       r.String("DATABASE_URL", DefaultDatabaseURL),
		ReadHeaderTimeout: r.Duration("HTTP_READ_HEADER_TIMEOUT", 5*time.Second),
		ReadTimeout:       r.Duration("HTTP_READ_TIMEOUT", 10*time.Second),
		WriteTimeout:      r.Duration("HTTP_WRITE_TIMEOUT", 60*time.Second),
		IdleTimeout:       r.Duration("HTTP_IDLE_TIMEOUT", 60*time.Second),
		Lease:             r.Duration("IDEMPOTENCY_LEASE", DefaultLease),
		IdempotencyWait:   r.NonNegativeDuration("IDEMPOTENCY_WAIT", 5*time.Second),
		Retention:         r.Duration("IDEMPOTENCY_KEY_RETENTION", DefaultRetention),
		ReplayCacheSize:   r.Int("IDEMPOTENCY_REPLAY_CACHE_SIZE", 10_000, 0),
		MaxBodyBytes:      int64(r.Int("MAX_BODY_BYTES", 64<<10, 1)),

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
	// The demo callers' keys are published: seeded by default only for
	// the demo.
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
	// The lease is renewed every third of it; shorter than a second, the
	// renewals would be most of the owner's work.
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

// CleanupAllowance is how long an operation's wrap-up writes may take
// after its handler failed, counted in the write timeout. It is the
// idempotency store's cleanupTimeout (config imports nothing of the
// service, so the figure is repeated; keep them equal).
const CleanupAllowance = 5 * time.Second

// checkRetention holds the rules that keep the retention window safe,
// checked by every program that reads it: the sweeper deletes by the same
// window the server promises its clients.
func checkRetention(r *Reader, retention, lease, reconcilerMaxAge time.Duration) {
	// A window shorter than the lease would let the sweeper forget an
	// operation that is still allowed to be running (and a late retry
	// would run it again).
	r.Check(retention > lease,
		"IDEMPOTENCY_KEY_RETENTION (%s) must be longer than IDEMPOTENCY_LEASE (%s)", retention, lease)
	// A record must be set aside before the sweeper could consider it.
	r.Check(reconcilerMaxAge < retention,
		"RECONCILER_MAX_AGE (%s) must be shorter than IDEMPOTENCY_KEY_RETENTION (%s)", reconcilerMaxAge, retention)
}

// Sweeper is the configuration of cmd/sweeper: the database and the
// retention windows, read exactly as the server reads them and held to
// the same rules (so it also reads IDEMPOTENCY_LEASE and
// RECONCILER_MAX_AGE, which the window must outlast).
type Sweeper struct {
	DatabaseURL string // DATABASE_URL
	// KeyRetention is IDEMPOTENCY_KEY_RETENTION, the server's window.
	KeyRetention time.Duration
	// EventRetention (OUTBOX_EVENT_RETENTION) and WebhookRetention
	// (WEBHOOK_EVENT_RETENTION) keep delivered events and processed
	// webhook ids; 30 days each by default.
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

// Reader reads environment variables and collects what is wrong with
// them, instead of stopping at the first: each method returns the default
// for an invalid value and notes the error; Err reports them all.
type Reader struct {
	getenv func(string) string
	errs   []error
}

// NewReader returns a Reader over getenv (os.Getenv, or a map in tests).
func NewReader(getenv func(string) string) *Reader { return &Reader{getenv: getenv} }

// String is the variable name, trimmed, or def when it is unset or blank.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return def
}

// Duration is a positive Go duration such as 30s or 24h.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a positive Go duration such as 30s or 24h", name, v))
		return def
	}
	return d
}

// NonNegativeDuration is a Go duration of 0 or more, such as 0 or 5s.
func (r *Reader) NonNegativeDuration(name string, def time.Duration) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a Go duration of 0 or more, such as 0 or 5s", name, v))
		return def
	}
	return d
}

// Int is an integer of at least least.
func (r *Reader) Int(name string, def, least int) int {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want an integer of at least %d", name, v, least))
		return def
	}
	return n
}

// Float is a number of at least 0.
func (r *Reader) Float(name string, def float64) float64 {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a number of at least 0", name, v))
		return def
	}
	return f
}

// Bool is true or false (strconv.ParseBool's spellings).
func (r *Reader) Bool(name string, def bool) bool {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want true or false", name, v))
		return def
	}
	return b
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
