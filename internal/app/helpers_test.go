package app

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/api"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/server"
	"github.com/retrysafe/payments/internal/testdb"
)

// testServer is the real service (handler, contract middleware,
// idempotency layer) over HTTP, on its own freshly migrated database.
type testServer struct {
	URL string
	cfg config.Server
	// db is the test's own connection to the database, separate from the
	// server's pool, for arranging and inspecting rows.
	db *pgxpool.Pool
	// processorURL is the fake card processor the server charges through.
	processorURL string
	// service is the application the server serves, for building a
	// reconciler that resumes exactly as cmd/server's does.
	service *App
	// webhookSecret is what the processor signs its webhooks with.
	webhookSecret string
	// handler is the server's handler, for benchmarks that call it without
	// a network hop.
	handler http.Handler
}

type serverOptions struct {
	demo bool
	// logs, if set, receives the server's log as JSON lines from Info up
	// (otherwise warnings and errors go to the test's output).
	logs   io.Writer
	config func(*config.Server)
	wrap   func(http.Handler) http.Handler
	pool   func(*pgxpool.Config)
	// noWebhooks: the processor sends no webhooks, so every outcome is
	// recorded by the operation's own final phase, never first by a
	// webhook (charges.ApplyChargeEvent: whichever comes first records it).
	noWebhooks bool
}

func newTestServer(t testing.TB, opts ...func(*serverOptions)) *testServer {
	t.Helper()
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	dbURL := testdb.New(t)
	cfg, err := config.Load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	cfg.DatabaseURL = dbURL
	// The server's URL must exist before the processor, which sends its
	// webhooks there; the handler is filled in once built.
	var handler http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	// The real fake processor, over HTTP, one per test, sharing a secret
	// made for the test with the server (as cmd/server does).
	webhookSecret := "whsec_" + rand.Text()
	procCfg := fakeprocessor.Config{
		WebhookURL:    srv.URL + "/webhooks/processor",
		WebhookSecret: []byte(webhookSecret),
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Payouts arrive quickly in tests; ba_test_slow takes ten times as long.
		PayoutDelay: 300 * time.Millisecond,
	}
	if o.noWebhooks {
		procCfg.WebhookURL = ""
	}
	proc, err := fakeprocessor.New(procCfg)
	if err != nil {
		t.Fatal(err)
	}
	procServer := httptest.NewServer(proc)
	t.Cleanup(func() {
		proc.Close()
		procServer.Close()
	})
	cfg.ProcessorURL = procServer.URL
	cfg.ProcessorWebhookSecret = []byte(webhookSecret)
	// The tests' callers are the demo callers, seeded below.
	cfg.SeedDemoCallers = true
	// The tests run the reconciler and the relay by hand, when they want
	// them (ts.reconciler, ts.relay), so that a stalled record stays
	// stalled until a test says otherwise.
	cfg.Reconciler, cfg.Relay = false, false
	cfg.DemoMode = o.demo
	if o.config != nil {
		o.config(&cfg)
	}
	var poolOptions []func(*pgxpool.Config)
	if o.pool != nil {
		poolOptions = append(poolOptions, o.pool)
	}
	serverPool := testdb.Pool(t, dbURL, poolOptions...)
	// Cleanups run last-registered first: stop serving (waiting for the
	// requests in flight, webhooks included) before the pool closes.
	t.Cleanup(srv.Close)
	if err := auth.SeedDemoCallers(context.Background(), serverPool); err != nil {
		t.Fatal(err)
	}
	var logHandler slog.Handler = slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})
	if o.logs != nil {
		logHandler = slog.NewJSONHandler(o.logs, nil)
	}
	// Every line, at every level, also goes to the whole suite's log,
	// which TestMain searches for secrets once every test has run.
	log := slog.New(server.LogHandler(slog.NewMultiHandler(logHandler, slog.NewJSONHandler(&suiteLogs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	// Built as cmd/server builds it: the same constructor.
	opts2 := Options{JobPollInterval: 100 * time.Millisecond, DemoReceiverURL: srv.URL + "/demo/webhooks/"}
	if o.demo {
		// The demo's store of recent traces, as cmd/server makes it in
		// DEMO_MODE (the process's tracing is set up once, for every test).
		opts2.Traces = testTracing(t).Recent
	}
	// Spans are recorded once any test has set tracing up; a test that
	// traces sends traceparent, which is traced either way.
	opts2.Tracing = tracingInstalled.Load()
	service, err := New(cfg, serverPool, log, opts2)
	if err != nil {
		t.Fatal(err)
	}
	if err := service.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The payout jobs stop (after their current step) before the pool
	// closes.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := service.Stop(ctx); err != nil {
			t.Errorf("stop the background work: %v", err)
		}
	})
	h := service.Handler
	if o.wrap != nil {
		h = o.wrap(h)
	}
	handler = h
	return &testServer{URL: srv.URL, cfg: cfg, db: testdb.Pool(t, dbURL), processorURL: procServer.URL, service: service, webhookSecret: webhookSecret, handler: h}
}

// reconciler is a reconciler over the test server's database, configured
// as the service configures it, with the backoff given.
func (ts *testServer) reconciler(t testing.TB, backoffBase time.Duration) *idempotency.Reconciler {
	t.Helper()
	r, err := ts.service.Reconciler(backoffBase)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// withDemo turns the demo's own endpoints on, as DEMO_MODE does.
func withDemo(o *serverOptions) { o.demo = true }

func withConfig(f func(*config.Server)) func(*serverOptions) {
	return func(o *serverOptions) { o.config = f }
}

// response is what came back, body read in full.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) problem(t testing.TB) map[string]any {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q; want application/problem+json. Body: %s", r.Status, ct, r.Body)
	}
	var p map[string]any
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, r.Body)
	}
	return p
}

// wantProblem checks r is the problem of that status and code.
func (r response) wantProblem(t testing.TB, status int, code string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d. Body: %s", r.Status, status, r.Body)
	}
	p := r.problem(t)
	if p["code"] != code || p["status"] != float64(status) || p["type"] == "" || p["title"] == "" {
		t.Fatalf("problem %v; want code %q, status %d, a type and a title", p, code, status)
	}
	return p
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// request is one HTTP request to the test server.
type request struct {
	method, path string
	apiKey       string      // "" for none; defaults are set by the helpers
	header       http.Header // extra headers, e.g. several Idempotency-Key lines
	body         string
}

func (ts *testServer) send(t testing.TB, ctx context.Context, r request) (response, error) {
	var body io.Reader
	if r.body != "" {
		body = bytes.NewBufferString(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, ts.URL+r.path, body)
	if err != nil {
		return response{}, err
	}
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		req.Header[k] = v
		if k == "Host" {
			req.Host = v[0]
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	if err := conformsToContract(req, res, b); err != nil {
		t.Errorf("%s %s answered %d outside the contract: %v\n%s", r.method, r.path, res.StatusCode, err, b)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

var (
	contractOnce   sync.Once
	contractRouter routers.Router
	contractErr    error
)

// conformsToContract checks a response against api/openapi.yaml: its status
// is declared for the operation, and its headers and body match the
// declared schemas. Every response of every HTTP test passes through it, so
// the tests keep the contract honest about what the server does.
func conformsToContract(req *http.Request, res *http.Response, body []byte) error {
	contractOnce.Do(func() {
		spec, err := api.Load()
		if err != nil {
			contractErr = err
			return
		}
		spec.Servers = nil
		contractRouter, contractErr = gorillamux.NewRouter(spec)
	})
	if contractErr != nil {
		return contractErr
	}
	route, pathParams, err := contractRouter.FindRoute(req)
	if err != nil {
		return nil // not an operation of the contract (a 404 or 405 for an undeclared path or method)
	}
	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: pathParams, Route: route},
		Status:                 res.StatusCode,
		Header:                 res.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

func (ts *testServer) do(t testing.TB, r request) response {
	t.Helper()
	res, err := ts.send(t, context.Background(), r)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	return res
}

// createOrder posts body to /v1/orders as acme under key.
func (ts *testServer) createOrder(t testing.TB, key, body string) response {
	t.Helper()
	return ts.do(t, ordersRequest(key, body))
}

func ordersRequest(key, body string) request {
	return request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {key}}, body: body}
}

func (ts *testServer) get(t testing.TB, path string) response {
	t.Helper()
	return ts.do(t, request{method: "GET", path: path, apiKey: "sk_test_acme"})
}

// count returns the number of rows in table (a constant in the test).
func (ts *testServer) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := ts.db.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// blockInserts makes every INSERT INTO table wait, by holding a lock that
// conflicts with it in an open transaction, until release is called. It is
// how a test holds a request in the middle of its execution, at a known
// place, without sleeping: an order create inside its one transaction, a
// charge inside its first phase (its record claimed, its lease held).
func (ts *testServer) blockInserts(t *testing.T, table string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := ts.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// waitForBlockedInserts waits until n server connections are waiting on
// the lock of blockInserts(table).
func (ts *testServer) waitForBlockedInserts(t *testing.T, table string, n int) {
	t.Helper()
	waitForInsertsWaiting(t, ts.db, table, n)
}

// waitFor polls cond until it holds, failing the test after timeout. It
// waits for a state of the system to be reached (something another
// process or goroutine does), never for time itself to pass.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %s: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keyStatus is the status of the caller acme's record for key.
func keyStatus(t testing.TB, db *pgxpool.Pool, key string) string {
	t.Helper()
	var status string
	if err := db.QueryRow(context.Background(), `SELECT status FROM idempotency_keys WHERE key = $1`, key).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// outcomeHeader is the contract's header that says what the idempotency
// layer did with a keyed request.
const outcomeHeader = "Idempotency-Outcome"
