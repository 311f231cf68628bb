package app

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// scrape reads /metrics and returns each sample line's value by its name
// and labels as written (e.g. `payments_http_requests_total{method="GET",route="/healthz",status="200"}`).
func (ts *testServer) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	res := ts.do(t, request{method: "GET", path: "/metrics"})
	if res.Status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", res.Status, res.Body)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(res.Body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return samples
}

// The metrics count what a demo flow did. They are the process's (other
// tests running in parallel add to them too), so the test compares each
// sample before and after its own flow and wants at least its own part.
func TestMetricsShowWhatTheIdempotencyLayerDid(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo) // whose receiver the relay delivers to
	before := ts.scrape(t)

	// new, replayed, mismatch; a flaky charge's 503s (retry hints, the
	// processor's uncertain answers) and its retries that resume.
	ts.createOrder(t, "metrics-order", teaOrder)
	ts.createOrder(t, "metrics-order", teaOrder)
	ts.createOrder(t, "metrics-order", `{"amount":1,"currency":"usd"}`)
	o := ts.newOrder(t, "sk_test_acme", 1200)
	for range 3 {
		ts.do(t, chargeRequest(o.ID, "metrics-flaky", "pm_card_flaky"))
	}
	drain(t, ts.db, ts.relay(t))
	after := ts.scrape(t)

	for sample, least := range map[string]float64{
		`payments_idempotency_outcomes_total{operation="createOrder",outcome="new"}`:      2,
		`payments_idempotency_outcomes_total{operation="createOrder",outcome="replayed"}`: 1,
		`payments_idempotency_outcomes_total{operation="createOrder",outcome="mismatch"}`: 1,
		`payments_idempotency_outcomes_total{operation="createCharge",outcome="new"}`:     1,
		`payments_idempotency_outcomes_total{operation="createCharge",outcome="resumed"}`: 2,
		`payments_http_requests_total{method="POST",route="/v1/orders",status="201"}`:     2,
		`payments_http_requests_total{method="POST",route="/v1/orders",status="422"}`:     1,
		`payments_http_request_duration_seconds_count{method="POST",route="/v1/orders"}`:  4,
		`payments_http_retry_hints_total{status="503"}`:                                   2,
		`payments_processor_calls_total{call="charges",result="uncertain"}`:               2,
		`payments_processor_calls_total{call="charges",result="success"}`:                 1,
		`payments_processor_call_duration_seconds_count{call="charges"}`:                  3,
		`payments_relay_deliveries_total{result="delivered"}`:                             2,
	} {
		if got := after[sample] - before[sample]; got < least {
			t.Errorf("%s went up by %v; the flow made it at least %v", sample, got, least)
		}
	}
	for _, present := range []string{"go_goroutines", "process_cpu_seconds_total", "payments_outbox_lag_seconds",
		"payments_reconciler_takeovers_total", "payments_reconciler_dead_letters_total"} {
		if _, ok := after[present]; !ok {
			t.Errorf("no %s in /metrics", present)
		}
	}
	// Route templates, never paths with ids: the series stay few.
	for sample := range after {
		if strings.Contains(sample, "ord_") || strings.Contains(sample, "ch_") {
			t.Errorf("a sample names an object: %s", sample)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every request is one log line with its id, caller, route, status,
// duration and idempotency outcome; no log line carries an API key, an
// Idempotency-Key's value, a webhook secret or anything like card data.
func TestRequestLogsCarryTheOutcomeAndNoSecrets(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ts := newTestServer(t, func(o *serverOptions) { o.logs = &logs })

	const key = "my-secret-order-key-42"
	r := ordersRequest(key, teaOrder)
	r.header.Set("X-Request-Id", "support-ticket-7")
	first := ts.do(t, r)
	if first.Header.Get("X-Request-Id") != "support-ticket-7" {
		t.Errorf("X-Request-Id %q; want the client's own id back", first.Header.Get("X-Request-Id"))
	}
	replay := ts.createOrder(t, key, teaOrder)
	if id := replay.Header.Get("X-Request-Id"); len(id) != 32 {
		t.Errorf("made-up X-Request-Id %q; want 32 hex characters", id)
	}
	var o order
	first.decode(t, &o)
	ts.do(t, chargeRequest(o.ID, "log-charge-key", "pm_card_visa"))
	// A 503 (the processor fails the first call with this card): a 5xx is
	// the server's failure, so its line is a warning, which the process's
	// log writes at once instead of with a later batch.
	flaky := ts.newOrder(t, "sk_test_acme", 300)
	ts.do(t, chargeRequest(flaky.ID, "log-flaky-key", "pm_card_flaky")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	ts.fund(t, "sk_test_acme", 500)
	ts.do(t, payoutRequest("sk_test_acme", "log-payout-key", `{"amount":100,"currency":"usd"}`))
	// An id that is not a plain token (quotes and spaces, to forge a
	// field of a text log line) is replaced.
	forged := `x" status=200 y`
	bad := ts.do(t, request{method: "GET", path: "/v1/orders", apiKey: "sk_test_acme", header: http.Header{"X-Request-Id": {forged}}})
	if bad.Header.Get("X-Request-Id") == forged {
		t.Error("a request id with quotes and spaces was kept")
	}

	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	byRequest := map[string]map[string]any{}
	outcomes := map[string]int{}
	levels := map[string]int{}
	for _, l := range lines {
		status, _ := l["status"].(float64)
		want := "INFO"
		if status >= 500 {
			want = "WARN"
		}
		if l["level"] != want {
			t.Errorf("a %v request's line at level %v; want %s", l["status"], l["level"], want)
		}
		levels[want]++
		for _, attr := range []string{"request_id", "method", "route", "status", "duration"} {
			if l[attr] == nil {
				t.Errorf("request line without %s: %v", attr, l)
			}
		}
		byRequest[fmt.Sprint(l["request_id"])] = l
		if o, ok := l["idempotency"].(string); ok {
			outcomes[o]++
			if l["caller"] != "acme" || l["key_hash"] == nil {
				t.Errorf("keyed request line without its caller or key hash: %v", l)
			}
		}
	}
	if l := byRequest["support-ticket-7"]; l == nil || l["route"] != "/v1/orders" || l["status"] != float64(201) || l["idempotency"] != "new" {
		t.Errorf("the line of request support-ticket-7: %v", l)
	}
	if levels["WARN"] != 1 || levels["INFO"] < 5 {
		t.Errorf("request lines by level %v; want the 503's at WARN and the rest at INFO", levels)
	}
	if outcomes["new"] < 3 || outcomes["replayed"] < 1 {
		t.Errorf("idempotency outcomes logged %v; want the new order, charge and payout, and the replay", outcomes)
	}

	all := logs.String()
	for _, secret := range []string{key, "log-charge-key", "log-payout-key", "log-flaky-key", "pm_card_visa"} {
		if strings.Contains(all, secret) {
			t.Errorf("the logs contain %q", secret)
		}
	}
	for _, leak := range secretsIn(all) {
		t.Errorf("the logs: %s", leak)
	}
}
