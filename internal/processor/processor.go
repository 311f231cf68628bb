// Package processor is a fake card processor: a stand-in for Stripe's
// charges API that the payments server calls over real HTTP.
//
// It exists to make the hard cases of a payment integration reproducible:
// it honours its own downstream Idempotency-Key (same key, same answer, one
// effect), its test payment methods fail in deterministic ways (503s, a 429,
// a withheld answer, a dropped connection), chaos settings inject the same
// faults at random, and it delivers signed webhooks at least once. Its
// ledger (GET /v1/ledger) lists every effect it performed, so a test can
// show from outside that retries produced exactly one charge.
//
// Routes:
//
//	POST /v1/charges       create a charge (Idempotency-Key required)
//	POST /v1/refunds       refund part or all of a charge (Idempotency-Key required)
//	POST /v1/payouts       start a payout to a test bank account (Idempotency-Key required)
//	GET  /v1/payouts/{id}  a payout as it is now (in_transit, then paid or failed)
//	GET  /v1/ledger        every effect, in order (?idempotency_key= filters)
//	GET  /admin/chaos      the chaos settings
//	PUT  /admin/chaos      replace the chaos settings
//	GET  /healthz          200 while serving
//
// State lives in memory. Run it as its own process (cmd/processor) when the
// state must outlive restarts of the payments server.
package processor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// Config configures a Server. The zero value is usable: no webhooks, no
// chaos, the defaults below.
type Config struct {
	// Addr is where cmd/processor listens (PROCESSOR_ADDR); New ignores
	// it. It is here so that every setting of the processor is read in
	// one place, LoadConfig.
	Addr string
	// WebhookURL receives the signed events; empty means no webhooks.
	WebhookURL string
	// WebhookSecret signs the events (DefaultWebhookSecret if empty).
	WebhookSecret []byte
	// WebhookMaxAttempts bounds the deliveries of one event (default 8).
	WebhookMaxAttempts int
	// WebhookBackoffBase and WebhookBackoffCap shape the retry backoff:
	// before retry n the deliverer waits random(0, min(cap, base·2^(n-1)))
	// ("full jitter"). Defaults 250ms and 30s.
	WebhookBackoffBase time.Duration
	WebhookBackoffCap  time.Duration
	// WebhookTimeout bounds one delivery attempt (default 5s).
	WebhookTimeout time.Duration
	// HTTPClient sends the webhooks (default: a client with no timeout of
	// its own; WebhookTimeout applies per attempt).
	HTTPClient *http.Client

	// FlakyFailures is how many attempts on a downstream key
	// pm_card_flaky answers with 503 before it succeeds (default 2).
	FlakyFailures int
	// PayoutDelay is how long a payout's transfer takes to arrive (ten
	// times as long to ba_test_slow). Default 2s.
	PayoutDelay time.Duration
	// TimeoutHold is the longest a withheld answer (pm_card_timeout, chaos
	// timeouts) is held if the client does not give up first (default 30s).
	// After it, the answer is sent late.
	TimeoutHold time.Duration

	// KeyRetention is how long the processor remembers a downstream key's
	// answer (default 24h, as Stripe). After it, the same key is a new
	// request. It must not be longer than the payments server's own
	// IDEMPOTENCY_KEY_RETENTION (see keys.go).
	KeyRetention time.Duration

	// Chaos is the initial fault injection; PUT /admin/chaos replaces it.
	Chaos Chaos
	// Rand is the source of every random choice (chaos draws, backoff
	// jitter), so a seeded one makes a run repeatable. Default: randomly
	// seeded. The Server takes ownership: do not use it elsewhere.
	Rand *rand.Rand

	// Now is the clock for created times and signature timestamps
	// (default time.Now).
	Now func() time.Time
	// Logger receives operational logs (default: discarded). Request
	// bodies are never logged.
	Logger *slog.Logger
}

// DefaultWebhookSecret is the demo's shared webhook secret.
const DefaultWebhookSecret = "whsec_test_processor" // #nosec G101 -- the fake processor's published default; the server refuses it outside DEMO_MODE

// maxBodyBytes bounds a request body; the API's bodies are tiny.
const maxBodyBytes = 64 << 10

func (cfg Config) withDefaults() Config {
	if len(cfg.WebhookSecret) == 0 {
		cfg.WebhookSecret = []byte(DefaultWebhookSecret)
	}
	if cfg.WebhookMaxAttempts == 0 {
		cfg.WebhookMaxAttempts = 8
	}
	if cfg.WebhookBackoffBase == 0 {
		cfg.WebhookBackoffBase = 250 * time.Millisecond
	}
	if cfg.WebhookBackoffCap == 0 {
		cfg.WebhookBackoffCap = 30 * time.Second
	}
	if cfg.WebhookTimeout == 0 {
		cfg.WebhookTimeout = 5 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.FlakyFailures == 0 {
		cfg.FlakyFailures = 2
	}
	if cfg.PayoutDelay == 0 {
		cfg.PayoutDelay = 2 * time.Second
	}
	if cfg.TimeoutHold == 0 {
		cfg.TimeoutHold = 30 * time.Second
	}
	if cfg.KeyRetention == 0 {
		cfg.KeyRetention = 24 * time.Hour
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) // #nosec G404 -- the fake's chaos draws, not secrets
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg
}

func (cfg Config) validate() error {
	var errs []error
	if cfg.WebhookURL != "" {
		u, err := url.Parse(cfg.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("webhook URL %q: want an absolute http(s) URL", cfg.WebhookURL))
		}
	}
	if cfg.WebhookMaxAttempts < 0 || cfg.FlakyFailures < 0 {
		errs = append(errs, errors.New("webhook max attempts and flaky failures must not be negative"))
	}
	if cfg.WebhookBackoffBase < 0 || cfg.WebhookBackoffCap < 0 || cfg.WebhookTimeout < 0 || cfg.TimeoutHold < 0 || cfg.PayoutDelay < 0 || cfg.KeyRetention < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if err := cfg.Chaos.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c Chaos) validate() error {
	var errs []error
	if c.LatencyMS < 0 || c.LatencyMS > 600_000 {
		errs = append(errs, fmt.Errorf("latency_ms %d: want 0..600000", c.LatencyMS))
	}
	if c.ErrorRetryAfter < 0 || c.ErrorRetryAfter > 86_400 {
		errs = append(errs, fmt.Errorf("error_retry_after %d: want 0..86400 seconds", c.ErrorRetryAfter))
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"error_rate", c.ErrorRate}, {"timeout_rate", c.TimeoutRate}, {"duplicate_webhook_rate", c.DuplicateWebhookRate}} {
		// Written so that NaN fails too.
		if !(r.v >= 0 && r.v <= 1) {
			errs = append(errs, fmt.Errorf("%s %v: want 0..1", r.name, r.v))
		}
	}
	return errors.Join(errs...)
}

// Server is the fake processor. It is an http.Handler; serve it with any
// http.Server (or httptest.Server) and call Close when done.
type Server struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux
	// traced is the mux with chaos latency, in a span (tracedHandler).
	traced http.Handler

	// chaosMu guards the chaos settings and the random source (a
	// *rand.Rand is not safe for concurrent use).
	chaosMu sync.Mutex
	chaos   Chaos
	rand    *rand.Rand

	keys keyStore

	// mu guards the ledger, the charges and the payouts. It is only ever taken while
	// holding a key's turn, never the other way round, so the two cannot
	// deadlock.
	mu      sync.Mutex
	ledger  []LedgerEntry
	charges map[string]*chargeState
	payouts map[string]*payoutState

	webhooks *deliverer // nil without a WebhookURL

	// closing is closed by Close: it releases withheld answers and stops
	// the webhook deliverer.
	closing   chan struct{}
	closeOnce sync.Once
}

// chargeState is what refunds need to know about a charge.
type chargeState struct {
	amount   int64
	currency string
	status   string
	refunded int64
}

// New returns a Server with cfg's defaults applied, and starts its webhook
// deliverer if cfg.WebhookURL is set.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("processor: invalid configuration: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		chaos:   cfg.Chaos,
		rand:    cfg.Rand,
		charges: make(map[string]*chargeState),
		payouts: make(map[string]*payoutState),
		closing: make(chan struct{}),
	}
	s.keys.entries = make(map[string]*keyEntry)
	if cfg.WebhookURL != "" {
		s.webhooks = newDeliverer(cfg, s.jitter)
	}
	s.routes()
	s.traced = s.tracedHandler()
	return s, nil
}

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("POST /v1/refunds", s.handleCreateRefund)
	s.mux.HandleFunc("POST /v1/payouts", s.handleCreatePayout)
	s.mux.HandleFunc("GET /v1/payouts/{id}", s.handleGetPayout)
	s.mux.HandleFunc("GET /v1/ledger", s.handleLedger)
	s.mux.HandleFunc("GET /admin/chaos", s.handleGetChaos)
	s.mux.HandleFunc("PUT /admin/chaos", s.handlePutChaos)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`), nil)
	})
}

// ServeHTTP implements http.Handler. Chaos latency is added here, before
// any other work, to every /v1 call (not to /admin or /healthz, which must
// stay usable to switch chaos off).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.traced.ServeHTTP(w, r)
}

// traced is serve in a span that continues the caller's trace (its W3C
// traceparent), as a real processor's would: the payment service's trace
// of a charge then shows the processor's side of the call, and how long
// it took there. Only /v1 calls are traced: the demo's polling of
// /admin and /healthz is not a processor call.
func (s *Server) tracedHandler() http.Handler {
	return otelhttp.NewHandler(http.HandlerFunc(s.serve), "processor",
		otelhttp.WithFilter(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/v1/") }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			// The route, never the path: a path carries ids.
			path := r.URL.Path
			switch {
			case path == "/v1/charges" || path == "/v1/refunds" || path == "/v1/payouts" || path == "/v1/ledger":
			case strings.HasPrefix(path, "/v1/payouts/"):
				path = "/v1/payouts/{id}"
			default:
				path = "/v1/(other)"
			}
			method := r.Method
			if method != http.MethodGet && method != http.MethodPost {
				method = "OTHER"
			}
			return "fake processor " + method + " " + path
		}))
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/") && !s.chaosLatency(r.Context()) {
		return // the client gave up during the latency; nobody to answer
	}
	s.mux.ServeHTTP(w, r)
}

// chaosLatency sleeps the configured latency; false if ctx ended first.
func (s *Server) chaosLatency(ctx context.Context) bool {
	ms := s.Chaos().LatencyMS
	if ms <= 0 {
		return true
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Close releases any withheld answers (so an http.Server's graceful
// shutdown is not held up by them) and stops the webhook deliverer,
// waiting for it to return. Events not yet delivered are dropped: unlike a
// real processor, this one keeps nothing on disk. Close is safe to call more
// than once; register it with http.Server.RegisterOnShutdown.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		if s.webhooks != nil {
			s.webhooks.close()
		}
	})
}

// Chaos returns the current chaos settings.
func (s *Server) Chaos() Chaos {
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	return s.chaos
}

// SetChaos replaces the chaos settings, as PUT /admin/chaos does.
func (s *Server) SetChaos(c Chaos) error {
	if err := c.validate(); err != nil {
		return err
	}
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	s.chaos = c
	return nil
}

// draw reports whether an event of probability rate happens. Rates of 0
// and 1 are certain either way (Float64 is in [0, 1)), which is what makes
// chaos tests deterministic even with concurrent draws.
func (s *Server) draw(rate func(Chaos) float64) bool {
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	return s.rand.Float64() < rate(s.chaos)
}

// jitter returns a uniformly random duration in [0, d].
func (s *Server) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	return time.Duration(s.rand.Int64N(int64(d) + 1))
}
