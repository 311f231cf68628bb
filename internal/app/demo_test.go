package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/testdb"
)

// Without DEMO_MODE the demo's powers do not exist: nobody can crash the
// server or make its processor fail through it.
func TestDemoEndpointsExistOnlyInDemoMode(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for _, r := range []request{
		{method: "GET", path: "/demo/chaos"},
		{method: "PUT", path: "/demo/chaos", body: `{"error_rate":1}`},
		{method: "PUT", path: "/demo/crash", body: `{"point":"after_processor_call"}`},
		{method: "GET", path: "/demo/ledger"},
	} {
		if res := ts.do(t, r); res.Status != http.StatusNotFound && res.Status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s without demo mode: %d %s", r.method, r.path, res.Status, res.Body)
		}
	}
}

// In demo mode the endpoints reach the processor and the crash points.
func TestDemoEndpoints(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	if res := ts.do(t, request{method: "PUT", path: "/demo/chaos", body: `{"error_rate":0.5,"latency_ms":20}`}); res.Status != http.StatusOK {
		t.Fatalf("set chaos: %d %s", res.Status, res.Body)
	}
	var chaos fakeprocessor.Chaos
	ts.do(t, request{method: "GET", path: "/demo/chaos"}).decode(t, &chaos)
	if chaos.ErrorRate != 0.5 || chaos.LatencyMS != 20 {
		t.Errorf("chaos %+v; want what was set", chaos)
	}
	ts.do(t, request{method: "PUT", path: "/demo/chaos", body: `{}`})

	if res := ts.do(t, request{method: "PUT", path: "/demo/crash", body: `{"point":"nowhere"}`}); res.Status != http.StatusBadRequest {
		t.Errorf("an unknown crash point: %d %s; want 400", res.Status, res.Body)
	}
	ts.do(t, request{method: "PUT", path: "/demo/crash", body: `{"point":"after_processor_call"}`})
	var crash struct{ Armed string }
	ts.do(t, request{method: "GET", path: "/demo/crash"}).decode(t, &crash)
	if crash.Armed != "after_processor_call" {
		t.Errorf("armed %q; want after_processor_call", crash.Armed)
	}
	ts.do(t, request{method: "PUT", path: "/demo/crash", body: `{"point":""}`}) // disarm before anything passes it

	ch := ts.paidCharge(t, 1200)
	var ledger struct {
		Data []fakeprocessor.LedgerEntry `json:"data"`
	}
	ts.do(t, request{method: "GET", path: "/demo/ledger"}).decode(t, &ledger)
	if len(ledger.Data) != 1 || ledger.Data[0].Amount != 1200 {
		t.Errorf("ledger %+v; want the one charge of 1200 (%s)", ledger.Data, ch.ID)
	}
}

// The demo as `make run` starts it: a supervisor running the processor and
// the server as a child. Arming "after_processor_call" and charging kills
// the server with a real SIGKILL after the card was charged and before
// anything was recorded; the supervisor starts it again on the same
// socket; the client's retry with the same key gets the charge, and the
// processor's ledger shows one effect.
func TestDemoCrashIsRecoveredOnce(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	addr, _ := startCommand(t, "cmd/server", []string{"demo"}, "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:0",
		"IDEMPOTENCY_LEASE=3s", "PROCESSOR_TIMEOUT=1s", "RECONCILER_INTERVAL=100ms")
	base := "http://" + addr
	call := func(method, path, key, body string) (int, http.Header, []byte, error) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, b, err
	}
	status, _, body, err := call("POST", "/v1/orders", "demo-order", `{"amount":4200,"currency":"usd"}`)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("create order: %d %s %v", status, body, err)
	}
	var order struct{ ID string }
	json.Unmarshal(body, &order)
	if status, _, body, err := call("PUT", "/demo/crash", "", `{"point":"after_processor_call"}`); err != nil || status != http.StatusOK {
		t.Fatalf("arm: %d %s %v", status, body, err)
	}

	charge := `{"payment_method":"pm_card_visa"}`
	path := "/v1/orders/" + order.ID + "/charges"
	// The server dies mid-request. The client sees the connection drop, or,
	// since net/http quietly resends a request with an Idempotency-Key on a
	// dropped connection, the restarted server's 409 for the key the dead
	// one still leases. Either way, no final answer.
	if status, _, body, err := call("POST", path, "demo-charge", charge); err == nil && status != http.StatusConflict && status != http.StatusServiceUnavailable {
		t.Fatalf("the armed charge answered %d %s; want the server to die mid-request", status, body)
	}

	// The retry, as the browser's client makes it: same key, honouring
	// Retry-After, until a final answer (the restarted server, or its
	// reconciler, finishes the charge).
	deadline := time.Now().Add(60 * time.Second)
	var header http.Header
	for {
		status, header, body, err = call("POST", path, "demo-charge", charge)
		if err == nil && status == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no final answer after the crash: %d %s %v", status, body, err)
		}
		wait := 100 * time.Millisecond
		if s, convErr := strconv.Atoi(header.Get("Retry-After")); convErr == nil {
			wait = time.Duration(s) * time.Second
		}
		time.Sleep(wait) // the client's backoff, as Retry-After says
	}
	var ch struct{ ID, Status string }
	json.Unmarshal(body, &ch)
	if ch.Status != "succeeded" {
		t.Errorf("charge %+v; want succeeded", ch)
	}

	_, _, body, err = call("GET", "/demo/ledger", "", "")
	if err != nil {
		t.Fatal(err)
	}
	var ledger struct {
		Data []fakeprocessor.LedgerEntry `json:"data"`
	}
	if err := json.Unmarshal(body, &ledger); err != nil {
		t.Fatalf("ledger: %v %s", err, body)
	}
	// The downstream key is derived from the caller, the key and the request.
	doc, _ := idempotency.DecodeJSON([]byte(charge))
	fingerprint, err := idempotency.Fingerprint("POST", path, doc)
	if err != nil {
		t.Fatal(err)
	}
	if n, want := len(ledger.Data), cardprocessor.DownstreamKey("acme", "demo-charge", fingerprint, 0); n != 1 || ledger.Data[0].IdempotencyKey != want {
		t.Errorf("ledger %+v; want exactly one effect, under charge %s's downstream key %s", ledger.Data, ch.ID, want)
	}
	// The armed point did not survive the crash: this is a new process.
	_, _, body, _ = call("GET", "/demo/crash", "", "")
	if !strings.Contains(string(body), `"armed":""`) {
		t.Errorf("after the restart: %s; want nothing armed (a restarted server)", body)
	}
}

// The supervisor starts the server again after every crash the demo asks
// for, however soon after its start the crash comes. (It used to count a
// server that died within 5 seconds of starting as a failure to start, and
// gave up after five in a row: six quick "Crash at" clicks left the demo
// with no server.) Only a server that dies before it serves is a failure
// to start.
func TestDemoSupervisorRestartsAfterEveryCrash(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	addr, supervisor := startCommand(t, "cmd/server", []string{"demo"}, "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:0",
		"IDEMPOTENCY_LEASE=3s", "PROCESSOR_TIMEOUT=1s")
	ts := &testServer{URL: "http://" + addr}
	startedAt := func() string {
		var state struct {
			StartedAt string `json:"started_at"`
		}
		res, err := ts.send(t, context.Background(), request{method: "GET", path: "/demo/crash"})
		if err != nil || res.Status != http.StatusOK {
			return ""
		}
		res.decode(t, &state)
		return state.StartedAt
	}
	orders := make([]order, 6)
	for i := range orders {
		orders[i] = ts.newOrder(t, "sk_test_acme", 100+i)
	}
	for i, o := range orders {
		before := startedAt()
		if res := ts.do(t, request{method: "PUT", path: "/demo/crash", body: `{"point":"after_charge_created"}`}); res.Status != http.StatusOK {
			t.Fatalf("arm %d: %d %s", i, res.Status, res.Body)
		}
		// The server dies in the middle of this request.
		_, _ = ts.send(t, context.Background(), chargeRequest(o.ID, fmt.Sprintf("crash-%d", i), "pm_card_visa"))
		waitFor(t, 30*time.Second, fmt.Sprintf("a new server after crash %d", i+1), func() bool {
			now := startedAt()
			return now != "" && now != before
		})
	}
	if supervisor.ProcessState != nil {
		t.Fatalf("the supervisor exited: %v", supervisor.ProcessState)
	}
	if res := ts.get(t, "/v1/orders"); res.Status != http.StatusOK {
		t.Fatalf("after six crashes: %d %s", res.Status, res.Body)
	}
}

// TestCrossOriginPagesAreRefused: a page of another origin, open in the
// same browser, can neither arm a crash nor spend the demo's published key,
// nor read the demo's ledger, nor can a page whose name was rebound to the
// demo's address: each is a 403 that changes nothing. The demo
// page's own requests (same-origin) and clients that are not browsers (no
// Sec-Fetch-Site, no Origin) pass. No CORS header is sent unless
// CORS_ALLOWED_ORIGINS names an origin.
func TestCrossOriginPagesAreRefused(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	foreign := func(r request, headers ...string) request {
		r.header = http.Header{}
		for i := 0; i < len(headers); i += 2 {
			r.header.Set(headers[i], headers[i+1])
		}
		return r
	}
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"},
		{"Origin", "https://evil.example"}, // an older browser: no Sec-Fetch-Site
		// DNS rebinding: the attacker's name now resolves to 127.0.0.1, so
		// the browser calls its page's requests same-origin; their Host is
		// still the attacker's name.
		{"Host", "rebind.attacker.example:8080", "Origin", "http://rebind.attacker.example:8080", "Sec-Fetch-Site", "same-origin"},
	} {
		for _, r := range []request{
			{method: "PUT", path: "/demo/crash", body: `{"point":"after_processor_call"}`},
			{method: "GET", path: "/demo/ledger"},
			{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", body: teaOrder},
		} {
			r = foreign(r, h...)
			r.header.Set("Idempotency-Key", "from-evil")
			res := ts.do(t, r)
			res.wantProblem(t, http.StatusForbidden, "cross_origin")
			if res.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s %s: Access-Control-Allow-Origin %q; want no CORS", r.method, r.path, res.Header.Get("Access-Control-Allow-Origin"))
			}
		}
	}
	var crash struct{ Armed string }
	ts.do(t, request{method: "GET", path: "/demo/crash"}).decode(t, &crash)
	if crash.Armed != "" {
		t.Errorf("armed %q by a foreign page; want nothing armed", crash.Armed)
	}
	if n := ts.count(t, "orders") + ts.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("%d rows written by a foreign page; want none", n)
	}
	// The demo page itself: same-origin, by address or as localhost.
	r := foreign(request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", body: teaOrder}, "Sec-Fetch-Site", "same-origin", "Host", "localhost:8080")
	r.header.Set("Idempotency-Key", "from-the-demo-page")
	if res := ts.do(t, r); res.Status != http.StatusCreated {
		t.Errorf("same-origin create: %d %s", res.Status, res.Body)
	}
}

// TestAllowedOriginGetsCORS: an origin named in CORS_ALLOWED_ORIGINS may
// call the API from its pages, and is told so by CORS; others still not.
func TestAllowedOriginGetsCORS(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.CORSAllowedOrigins = []string{"https://shop.example"} }))
	r := request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", body: teaOrder, header: http.Header{
		"Origin": {"https://shop.example"}, "Sec-Fetch-Site": {"cross-site"}, "Idempotency-Key": {"from-the-shop"},
	}}
	res := ts.do(t, r)
	if res.Status != http.StatusCreated || res.Header.Get("Access-Control-Allow-Origin") != "https://shop.example" {
		t.Errorf("allowed origin: %d, Access-Control-Allow-Origin %q; want 201 and the origin", res.Status, res.Header.Get("Access-Control-Allow-Origin"))
	}
	r.header.Set("Origin", "https://evil.example")
	ts.do(t, r).wantProblem(t, http.StatusForbidden, "cross_origin")
}

// TestPollingIsQuiet: the demo page's polling and the health checks,
// answered, log at debug, so that a terminal with the demo open shows the
// requests that matter; a request of the API still logs its line.
func TestPollingIsQuiet(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ts := newTestServer(t, withDemo, func(o *serverOptions) { o.logs = &logs })
	for _, path := range []string{"/healthz", "/readyz", "/demo/ledger", "/demo/crash", "/demo/chaos"} {
		if res := ts.do(t, request{method: "GET", path: path}); res.Status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, res.Status, res.Body)
		}
	}
	ts.createOrder(t, "quiet", teaOrder)
	var routes []string
	for line := range strings.Lines(logs.String()) {
		var l struct{ Msg, Route string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "request" {
			routes = append(routes, l.Route)
		}
	}
	if len(routes) != 1 || routes[0] != "/v1/orders" {
		t.Errorf("request lines for %q; want only POST /v1/orders's", routes)
	}
}
