package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/ijson"
)

// What one client can make the server spend is bounded before it is spent.
// Each test here is an attack that worked against an earlier version.

// A 64 KiB body of '[' once made the duplicate-member check allocate 4 GiB
// (a pointer string per level, all kept during the recursion); the
// processor's webhook ran that check before its signature, so one
// unauthenticated request could kill the server. Now a body nested deeper
// than ijson.MaxDepth is a 400 that names the limit, and answering it costs
// about what reading it does.
func TestHostileBodiesAreRefusedCheaply(t *testing.T) {
	// Not parallel: it counts the bytes the whole process allocates while
	// the server answers, and parallel tests would add theirs.
	ts := newTestServer(t)
	ts.get(t, "/v1/orders") // the first request pays for warming up, not for its body
	deep := strings.Repeat("[", 64<<10)
	deepObject := strings.Repeat(`{"a":`, (64<<10)/5)
	signed := signedWebhook(t, deep, time.Now(), ts.webhookSecret)
	for name, r := range map[string]request{
		"deep array, authenticated":    ordersRequest("deep-1", deep),
		"deep object, authenticated":   ordersRequest("deep-2", deepObject),
		"deep webhook, unsigned":       {method: "POST", path: "/webhooks/processor", header: http.Header{"Processor-Signature": {"t=1,v1=00"}}, body: deep},
		"deep webhook, signed":         signed,
		"deep array, no API key":       {method: "POST", path: "/v1/orders", header: http.Header{"Idempotency-Key": {"deep-3"}}, body: deep},
		"many members, authenticated":  ordersRequest("wide-1", manyMembers(64<<10)),
		"escaped names, authenticated": ordersRequest("wide-2", strings.ReplaceAll(manyMembers(40<<10), `"m`, `"\u006d`)),
		"long string, authenticated":   ordersRequest("long-1", `{"amount":1,"currency":"usd","description":"`+strings.Repeat(`\u0041`, 10<<10)+`"}`),
	} {
		t.Run(name, func(t *testing.T) {
			var res response
			start := time.Now()
			allocated := bytesAllocated(func() { res = ts.do(t, r) })
			t.Logf("%d bytes: answered %d in %s, %d KiB allocated (client and server)", len(r.body), res.Status, time.Since(start), allocated>>10)
			switch {
			case strings.HasPrefix(name, "deep webhook, unsigned"):
				res.wantProblem(t, http.StatusBadRequest, "invalid_signature")
			case strings.HasSuffix(name, "no API key"):
				res.wantProblem(t, http.StatusUnauthorized, "unauthorized")
			case strings.HasPrefix(name, "deep"):
				p := res.wantProblem(t, http.StatusBadRequest, "invalid_request")
				if detail, _ := p["detail"].(string); !strings.Contains(detail, fmt.Sprintf("%d levels deep", ijson.MaxDepth)) {
					t.Errorf("detail %q does not name the limit", detail)
				}
			case strings.HasPrefix(name, "long"):
				p := res.wantProblem(t, http.StatusBadRequest, "invalid_request")
				if detail, _ := p["detail"].(string); !strings.Contains(detail, fmt.Sprintf("at most %d characters", ijson.MaxString)) {
					t.Errorf("detail %q does not name the limit", detail)
				}
			default:
				p := res.wantProblem(t, http.StatusBadRequest, "invalid_request")
				if detail, _ := p["detail"].(string); !strings.Contains(detail, fmt.Sprintf("at most %d members", ijson.MaxMembers)) {
					t.Errorf("detail %q does not name the limit", detail)
				}
			}
			// Client and server together: the body is sent, read and
			// answered. (The check it replaced allocated 4 GiB for the
			// deep array.)
			if allocated > 2<<20 {
				t.Errorf("answering allocated %d KiB; want at most 2 MiB", allocated>>10)
			}
		})
	}
	if n := ts.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("%d key records claimed by refused requests", n)
	}
}

// manyMembers is a JSON object of about size bytes with distinct members.
func manyMembers(size int) string {
	var b strings.Builder
	b.WriteString(`{"amount":100,"currency":"usd"`)
	for i := 0; b.Len() < size-16; i++ {
		fmt.Fprintf(&b, `,"m%d":0`, i)
	}
	b.WriteString("}")
	return b.String()
}

func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Metric labels come from fixed sets. Requests with thousands of distinct
// methods (each a 405 or 404) and paths once grew /metrics by a series
// each: 5,000 unique 8 KB methods made it 700 MB. Now every method the
// server does not know is "other", and every path is a route template.
func TestMetricLabelsStayBounded(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	const n = 2000
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			method := fmt.Sprintf("M%d%s", i, strings.Repeat("X", 1024))
			path := fmt.Sprintf("/v1/orders/ord_%d/nope/%d", i, rand.Int())
			if i%2 == 0 {
				method = "GET"
			}
			req, err := http.NewRequest(method, ts.URL+path, nil)
			if err != nil {
				t.Error(err)
				return
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
		})
	}
	wg.Wait()
	after := ts.scrape(t)
	methods, routes := map[string]bool{}, map[string]bool{}
	for sample := range after {
		if !strings.HasPrefix(sample, "payments_http_") {
			continue
		}
		if strings.Contains(sample, `method="M`) || strings.Contains(sample, "/nope/") {
			t.Errorf("a series labelled with client input: %.200s", sample)
		}
		if m := labelValue(sample, "method"); m != "" {
			methods[m] = true
		}
		if r := labelValue(sample, "route"); r != "" {
			routes[r] = true
		}
	}
	known := map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true, "other": true}
	for m := range methods {
		if !known[m] {
			t.Errorf("method label %q is not one of the fixed set", m)
		}
	}
	// The routes are the templates the server registered (the whole
	// process's test servers have the same ones): a few dozen.
	if len(routes) > 40 {
		t.Errorf("%d distinct route labels after %d requests to distinct paths", len(routes), n)
	}
}

// labelValue is the value of label in a sample line as scrape returns it.
func labelValue(sample, label string) string {
	_, rest, ok := strings.Cut(sample, label+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// Each caller has its own token bucket. A caller over its limit gets a 429
// with Retry-After, before its key is claimed (a retry after the wait runs
// the operation, once), and another caller's requests go through
// meanwhile.
func TestRateLimitIsPerCaller(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.RateLimit, c.RateBurst = 2, 4 }))
	limited := 0
	for i := range 12 {
		res := ts.get(t, "/v1/orders")
		if res.Status == http.StatusTooManyRequests {
			res.wantProblem(t, http.StatusTooManyRequests, "rate_limited")
			if after, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || after < 1 {
				t.Fatalf("a 429 with Retry-After %q; want whole seconds", res.Header.Get("Retry-After"))
			}
			limited++
		}
		// globex, sending within its own limit (4 requests: its burst),
		// is not slowed by acme's flood.
		if i%3 == 0 {
			if res := ts.do(t, request{method: "GET", path: "/v1/balance", apiKey: "sk_test_globex"}); res.Status != http.StatusOK {
				t.Fatalf("globex during acme's flood: %d %s", res.Status, res.Body)
			}
		}
	}
	if limited == 0 {
		t.Fatal("12 requests against a burst of 4 at 2/s: none was limited")
	}

	// A keyed request refused with 429 claims nothing; retried after the
	// wait, it takes effect once, as a new operation.
	var refused response
	for refused.Status != http.StatusTooManyRequests {
		refused = ts.createOrder(t, "limited-order", teaOrder)
		if refused.Status == http.StatusCreated {
			t.Fatal("the keyed request went through; the bucket should be empty")
		}
	}
	var records int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = 'limited-order'`).Scan(&records); err != nil || records != 0 {
		t.Fatalf("%d records for a refused request (%v); a 429 must claim nothing", records, err)
	}
	var created response
	waitFor(t, 10*time.Second, "the retry to get past the limit", func() bool {
		created = ts.createOrder(t, "limited-order", teaOrder)
		return created.Status != http.StatusTooManyRequests
	})
	if created.Status != http.StatusCreated || created.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the limit: %d (replayed %q) %s; want 201, a new operation", created.Status, created.Header.Get("Idempotent-Replayed"), created.Body)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// More header lines than the limit is a 431 problem, before anything else.
func TestTooManyHeaderLinesAreRefused(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	r := ordersRequest("many-headers", teaOrder)
	for i := range ts.cfg.MaxHeaders {
		r.header.Add(fmt.Sprintf("X-Filler-%d", i), "x")
	}
	ts.do(t, r).wantProblem(t, http.StatusRequestHeaderFieldsTooLarge, "request_header_fields_too_large")
	if n := ts.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("%d key records claimed by a refused request", n)
	}
	// At the limit, fine.
	r = ordersRequest("some-headers", teaOrder)
	for i := range ts.cfg.MaxHeaders - 10 {
		r.header.Add(fmt.Sprintf("X-Filler-%d", i), "x")
	}
	if res := ts.do(t, r); res.Status != http.StatusCreated {
		t.Fatalf("%d header lines: %d %s", ts.cfg.MaxHeaders-10, res.Status, res.Body)
	}
}
