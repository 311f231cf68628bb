package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/retry"
)

const orderJSON = `{"id":"ord_1","amount":100,"currency":"usd","description":null,"status":"pending","created_at":"2026-11-29T20:00:00Z"}`

// script answers the requests in turn with the given steps (the last one
// repeats) and records the idempotency key of each request.
type script struct {
	mu    sync.Mutex
	keys  []string
	steps []func(w http.ResponseWriter)
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	step := s.steps[min(len(s.keys), len(s.steps))-1]
	s.mu.Unlock()
	step(w)
}

func status(code int, header ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		if code == http.StatusCreated {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			w.Write([]byte(orderJSON))
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(code)
		codes := map[int]string{400: "invalid_request", 409: "idempotency_key_in_use", 422: "idempotency_key_reused", 429: "service_unavailable", 503: "service_unavailable", 502: "service_unavailable", 504: "service_unavailable"}
		w.Write([]byte(`{"type":"x","title":"t","status":` + itoa(code) + `,"code":"` + codes[code] + `"}`))
	}
}

func conflict(code string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		w.Write([]byte(`{"type":"x","title":"t","status":409,"code":"` + code + `"}`))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// newTestClient returns a client of srv that records its waits instead of
// sleeping.
func newTestClient(t *testing.T, srv *httptest.Server, p Policy) (*Client, *[]time.Duration) {
	t.Helper()
	c, err := New(srv.URL, "sk_test", p, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	c.sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err()
	}
	return c, &waits
}

func serve(t *testing.T, s *script) *httptest.Server {
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func TestRetriesTransientFailuresWithTheSameKey(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter){status(503), status(502), status(504), conflict("idempotency_key_in_use"), status(429), status(201)}}
	p := Policy{MaxAttempts: 10, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}
	c, waits := newTestClient(t, serve(t, s), p)
	o, res, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 100, Currency: "usd"})
	if err != nil || o.Id != "ord_1" || res.Attempts != 6 {
		t.Fatalf("CreateOrder = %+v, %+v, %v; want success on the 6th attempt", o, res, err)
	}
	for i, k := range s.keys {
		if k != s.keys[0] || k == "" || k != res.IdempotencyKey {
			t.Fatalf("attempt %d sent key %q; every attempt must send the same key %q", i+1, k, res.IdempotencyKey)
		}
	}
	// Full jitter: the wait before retry n is within [0, min(cap, base·2^(n-1))].
	for i, w := range *waits {
		ceiling := min(p.MaxDelay, p.BaseDelay<<i)
		if w < 0 || w > ceiling {
			t.Errorf("wait %d = %s, outside [0, %s]", i+1, w, ceiling)
		}
	}
}

func TestNeverRetriesOther4xx(t *testing.T) {
	t.Parallel()
	for name, step := range map[string]func(http.ResponseWriter){
		"400": status(400), "422": status(422), "409 business conflict": conflict("order_not_payable"),
	} {
		t.Run(name, func(t *testing.T) {
			s := &script{steps: []func(http.ResponseWriter){step}}
			c, _ := newTestClient(t, serve(t, s), DefaultPolicy())
			_, res, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 100, Currency: "usd"})
			var e *Error
			if !errors.As(err, &e) || res.Attempts != 1 || len(s.keys) != 1 {
				t.Errorf("%s: %d attempts, err %v; want one attempt and the problem", name, res.Attempts, err)
			}
		})
	}
}

func TestHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	// The HTTP-date is made when the answer is sent, as a server makes it:
	// made earlier, a slow machine could spend its seconds before the
	// client reads it.
	inThreeSeconds := func(w http.ResponseWriter) {
		status(429, "Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))(w)
	}
	s := &script{steps: []func(http.ResponseWriter){status(503, "Retry-After", "2"), inThreeSeconds, status(201)}}
	c, waits := newTestClient(t, serve(t, s), DefaultPolicy())
	if _, _, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"}); err != nil {
		t.Fatal(err)
	}
	if len(*waits) != 2 || (*waits)[0] != 2*time.Second || (*waits)[1] < time.Second || (*waits)[1] > 3*time.Second {
		t.Errorf("waits %v; want 2s (seconds form), then up to 3s (HTTP-date form)", *waits)
	}
}

func TestDeadlineStopsRetries(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter){status(503, "Retry-After", "5")}}
	c, waits := newTestClient(t, serve(t, s), DefaultPolicy())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, res, err := c.CreateOrder(ctx, apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"})
	var e *Error
	if !errors.As(err, &e) || e.Status != 503 || res.Attempts != 1 || len(*waits) != 0 {
		t.Errorf("%d attempts, waits %v, err %v; want one attempt: the next could not finish before the deadline", res.Attempts, *waits, err)
	}
}

// Under a total outage the shared budget stops the retries: 100 calls make
// at most 100 first tries plus the floor (10) plus a tenth of the calls.
func TestBudgetStopsRetriesUnderTotalFailure(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		status(503)(w)
	}))
	t.Cleanup(srv.Close)
	c, _ := newTestClient(t, srv, Policy{MaxAttempts: 5, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, Budget: retry.NewBudget(0.1, 10)})
	for range 100 {
		c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"})
	}
	retries := requests.Load() - 100
	if retries > 10+10 {
		t.Errorf("%d retries for 100 failing calls; the budget allows at most 20 (without it: 400)", retries)
	}
	t.Logf("100 calls under a total outage: %d requests, %d of them retries", requests.Load(), retries)
}

func TestRetriesAConnectionError(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close() // the answer is lost
			return
		}
		status(201)(w)
	}))
	t.Cleanup(srv.Close)
	c, _ := newTestClient(t, srv, DefaultPolicy())
	if _, res, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"}); err != nil || res.Attempts != 2 {
		t.Errorf("after a dropped connection: %+v, %v; want success on the 2nd attempt", res, err)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"3": 3 * time.Second, "0": 0, "Sun, 29 Nov 2026 20:00:07 GMT": 7 * time.Second, "Sun, 29 Nov 2026 19:00:00 GMT": 0,
	} {
		if got, ok := retryAfter(v, now); !ok || got != want {
			t.Errorf("retryAfter(%q) = %s, %v; want %s", v, got, ok, want)
		}
	}
	for _, bad := range []string{"", "soon", "-1"} {
		if _, ok := retryAfter(bad, now); ok {
			t.Errorf("retryAfter(%q) accepted", bad)
		}
	}
}

// A hung attempt that hits the HTTP client's own timeout is retried with
// the same key; only the caller's context ending stops the operation.
func TestRetriesAnAttemptThatTimedOut(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	keys := make(chan string, 2)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if n.Add(1) == 1 {
			select { // hang until the client gives up on this attempt
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		status(201)(w)
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	c, err := New(srv.URL, "sk_test", DefaultPolicy(), &http.Client{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	if _, res, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"}); err != nil || res.Attempts != 2 {
		t.Fatalf("after a timed-out attempt: %+v, %v; want success on the 2nd attempt", res, err)
	}
	if first, second := <-keys, <-keys; first != second {
		t.Errorf("keys %q then %q; want the same", first, second)
	}
}

func TestAbsurdRetryAfterGivesUp(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter){status(503, "Retry-After", "99999999999999999")}}
	c, waits := newTestClient(t, serve(t, s), DefaultPolicy())
	if _, res, err := c.CreateOrder(context.Background(), apiclient.CreateOrderRequest{Amount: 1, Currency: "usd"}); err == nil || res.Attempts != 1 || len(*waits) != 0 {
		t.Errorf("%+v, waits %v, %v; want one attempt and the 503, not a wait of centuries", res, *waits, err)
	}
}

// payoutAt answers GET /v1/payouts/po_1 with the payout in status, and
// Retry-After when it is given.
func payoutAt(status, retryAfter string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"id":"po_1","amount":100,"currency":"usd","destination":"ba_test_ok","status":"` + status +
			`","failure_code":null,"created_at":"2026-11-30T00:00:00Z"}`))
	}
}

// WaitForPayout polls until the payout is final, waiting as each answer's
// Retry-After says (a second when it says nothing), and retries a 503 on
// the way like any safe read.
func TestWaitForPayoutPollsAsRetryAfterSays(t *testing.T) {
	t.Parallel()
	s := &script{steps: []func(http.ResponseWriter){
		payoutAt("pending", "1"), payoutAt("in_transit", "3"), status(503, "Retry-After", "2"), payoutAt("in_transit", ""), payoutAt("paid", ""),
	}}
	c, waits := newTestClient(t, serve(t, s), Policy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	var seen []apiclient.PayoutStatus
	po, err := c.WaitForPayout(context.Background(), "po_1", func(p apiclient.Payout) { seen = append(seen, p.Status) })
	if err != nil || po.Status != apiclient.PayoutStatusPaid {
		t.Fatalf("WaitForPayout = %+v, %v; want paid", po, err)
	}
	want := []time.Duration{time.Second, 3 * time.Second, 2 * time.Second, time.Second}
	if !slices.Equal(*waits, want) {
		t.Errorf("waits %v; want %v (Retry-After 1 and 3, the 503's 2, the default 1s)", *waits, want)
	}
	if len(seen) != 4 || seen[0] != apiclient.PayoutStatusPending || seen[3] != apiclient.PayoutStatusPaid {
		t.Errorf("states seen %v", seen)
	}
}
