// Package processor is a fake card processor: a stand-in for Stripe's
// charges API that the payments server calls over real HTTP.
//
// It makes the hard cases of a payment integration reproducible: it honours
// its own downstream Idempotency-Key (same key, same answer, one effect),
// its test payment methods fail in deterministic ways (503s, a 429, a
// withheld answer, a dropped connection), chaos injects the same faults at
// random, and it delivers signed webhooks at least once. Its ledger lists
// every effect, so a test can show that retries made exactly one charge.
//
// Its routes (routes, below): POST /v1/charges, /v1/refunds and /v1/payouts,
// each under an Idempotency-Key; GET /v1/payouts/{id}; GET /v1/ledger,
// every effect; GET and PUT /admin/chaos; GET /healthz.
//
// State lives in memory. Run it as its own process (cmd/processor) when the
// state must outlive restarts of the payments server.
package fakeprocessor

import (
	"cmp"
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

	"github.com/retrysafe/payments/internal/config"
)

// Config configures a Server. The zero value is usable: no webhooks, no
// chaos, the defaults below.
type Config struct {
	// Addr is where cmd/processor listens (read by LoadConfig; New ignores it).
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
	// HTTPClient sends the webhooks (default &http.Client{}; WebhookTimeout bounds each attempt).
	HTTPClient *http.Client

	// FlakyFailures is how many attempts on a key pm_card_flaky answers
	// with 503 before it succeeds (default 2).
	FlakyFailures int
	// PayoutDelay is how long a payout takes to arrive (default 2s).
	PayoutDelay time.Duration
	// TimeoutHold is how long a withheld answer (pm_card_timeout, chaos
	// timeouts) waits for the client to give up, then is sent (default 30s).
	TimeoutHold time.Duration
	// KeyRetention is how long a downstream key's answer is remembered
	// (default 24h, as Stripe); after it, the key is a new request. It must
	// not be shorter than the server's IDEMPOTENCY_KEY_RETENTION (keys.go).
	KeyRetention time.Duration

	// Chaos is the initial fault injection; PUT /admin/chaos replaces it.
	Chaos Chaos
	// NoAdmin hides /admin/chaos and GET /v1/ledger (in-process, outside the demo).
	NoAdmin bool
	// Rand is the source of every random choice, so a seeded one makes a
	// run repeatable (default: randomly seeded). The Server owns it.
	Rand *rand.Rand
	// Now is the clock for created times and signatures (default time.Now).
	Now func() time.Time
	// Logger receives operational logs, never bodies (default: discarded).
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.WebhookMaxAttempts = cmp.Or(cfg.WebhookMaxAttempts, 8)
	cfg.WebhookBackoffBase = cmp.Or(cfg.WebhookBackoffBase, 250*time.Millisecond)
	cfg.WebhookBackoffCap = cmp.Or(cfg.WebhookBackoffCap, 30*time.Second)
	cfg.WebhookTimeout = cmp.Or(cfg.WebhookTimeout, 5*time.Second)
	cfg.HTTPClient = cmp.Or(cfg.HTTPClient, &http.Client{})
	cfg.FlakyFailures = cmp.Or(cfg.FlakyFailures, 2)
	cfg.PayoutDelay = cmp.Or(cfg.PayoutDelay, 2*time.Second)
	cfg.TimeoutHold = cmp.Or(cfg.TimeoutHold, 30*time.Second)
	cfg.KeyRetention = cmp.Or(cfg.KeyRetention, 24*time.Hour)
	cfg.Rand = cmp.Or(cfg.Rand, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))) // #nosec G404 -- the fake's chaos draws, not secrets
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return cfg
}

func (cfg Config) validate() error {
	var p config.Problems
	u, err := url.Parse(cfg.WebhookURL)
	p.Check(cfg.WebhookURL == "" || err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
		"webhook URL %q: want an absolute http(s) URL", cfg.WebhookURL)
	p.Check(cfg.WebhookMaxAttempts >= 0 && cfg.FlakyFailures >= 0, "webhook max attempts and flaky failures must not be negative")
	p.Check(min(cfg.WebhookBackoffBase, cfg.WebhookBackoffCap, cfg.WebhookTimeout, cfg.TimeoutHold, cfg.PayoutDelay, cfg.KeyRetention) >= 0,
		"durations must not be negative")
	return errors.Join(p.Err("processor"), cfg.Chaos.validate())
}

func (c Chaos) validate() error {
	var p config.Problems
	p.Check(c.LatencyMS >= 0 && c.LatencyMS <= 600_000, "latency_ms %d: want 0..600000", c.LatencyMS)
	p.Check(c.ErrorRetryAfter >= 0 && c.ErrorRetryAfter <= 86_400, "error_retry_after %d: want 0..86400 seconds", c.ErrorRetryAfter)
	rate := func(name string, v float64) { p.Check(v >= 0 && v <= 1, "%s %v: want 0..1", name, v) } // written so that NaN fails too
	rate("error_rate", c.ErrorRate)
	rate("timeout_rate", c.TimeoutRate)
	rate("duplicate_webhook_rate", c.DuplicateWebhookRate)
	return p.Err("chaos")
}

// Server is the fake processor. It is an http.Handler; serve it with any
// http.Server (or httptest.Server) and call Close when done.
type Server struct {
	cfg     Config
	handler http.Handler // the routes, in a span (traced)

	// chaosMu guards the chaos settings and cfg.Rand (a *rand.Rand is not
	// safe for concurrent use).
	chaosMu sync.Mutex
	chaos   Chaos

	keysMu sync.Mutex           // guards keys
	keys   map[string]*keyEntry // one per (endpoint, key) ever seen

	// mu guards the ledger, the charges and the payouts. A key's turn is
	// never taken while holding it, so the two cannot deadlock.
	mu      sync.Mutex
	ledger  []LedgerEntry
	charges map[string]*chargeState
	payouts map[string]*payoutState

	webhooks *deliverer // nil without a WebhookURL

	closing   chan struct{} // closed by Close: releases withheld answers
	closeOnce sync.Once
}

// chargeState is a charge's ledger entry and how much of it is refunded.
type chargeState struct {
	LedgerEntry
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
		chaos:   cfg.Chaos,
		charges: make(map[string]*chargeState),
		payouts: make(map[string]*payoutState),
		keys:    make(map[string]*keyEntry),
		closing: make(chan struct{}),
	}
	if cfg.WebhookURL != "" {
		s.webhooks = newDeliverer(cfg, s.jitter)
	}
	s.handler = traced(s.routes())
	return s, nil
}

// routes is the API. Chaos latency is added before any other work to every
// /v1 call (not to /admin or /healthz, which must stay usable to switch
// chaos off).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", keyed(s, "charges", validCharge, s.executeCharge))
	mux.HandleFunc("POST /v1/refunds", keyed(s, "refunds", validRefund, s.executeRefund))
	mux.HandleFunc("POST /v1/payouts", keyed(s, "payouts", validPayout, s.executePayout))
	mux.HandleFunc("GET /v1/payouts/{id}", s.handleGetPayout)
	if !s.cfg.NoAdmin {
		mux.HandleFunc("GET /v1/ledger", s.handleLedger)
		mux.HandleFunc("GET /admin/chaos", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, mustJSON(s.Chaos()), nil)
		})
		mux.HandleFunc("PUT /admin/chaos", s.handlePutChaos)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`), nil)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms := s.Chaos().LatencyMS
		if strings.HasPrefix(r.URL.Path, "/v1/") && ms > 0 && !sleep(r.Context(), time.Duration(ms)*time.Millisecond, nil) {
			return // the client gave up during the latency; nobody to answer
		}
		mux.ServeHTTP(w, r)
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// traced serves h in a span that continues the caller's trace (W3C
// traceparent), so a charge's trace shows the processor's side of the call.
// Only /v1 calls are traced: the demo's polling of /admin is not a call.
func traced(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "processor",
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

// sleep waits d or until stop closes (true), or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
	case <-stop:
	}
	return true
}

// Close releases withheld answers, so a graceful shutdown is not held up,
// and stops the webhook deliverer, dropping undelivered events (nothing is
// kept on disk). It is idempotent: register it with RegisterOnShutdown.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		if s.webhooks != nil {
			s.webhooks.cancel()
			<-s.webhooks.done // run has returned
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
// and 1 are certain (Float64 is in [0, 1)), so chaos tests are
// deterministic even with concurrent draws.
func (s *Server) draw(rate func(Chaos) float64) bool {
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	return s.cfg.Rand.Float64() < rate(s.chaos)
}

// jitter returns a uniformly random duration in [0, d].
func (s *Server) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	s.chaosMu.Lock()
	defer s.chaosMu.Unlock()
	return time.Duration(s.cfg.Rand.Int64N(int64(d) + 1))
}
