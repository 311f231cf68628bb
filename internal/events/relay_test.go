package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests run the relay against a real PostgreSQL outbox and real HTTP
// endpoints (httptest servers standing in for the callers' receivers).

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// goodConfig is a valid configuration whose backoff is an hour, so an event
// whose delivery failed is not due again during a test.
func goodConfig() events.RelayConfig {
	return events.RelayConfig{
		Interval: time.Second, Batch: 10, Lease: time.Minute, Timeout: 5 * time.Second,
		BackoffBase: time.Hour, BackoffCap: time.Hour,
		AllowPrivate: true, // the endpoints are httptest servers, on loopback
	}
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func newRelay(t *testing.T, pool *pgxpool.Pool, cfg events.RelayConfig) *events.Relay {
	t.Helper()
	r, err := events.NewRelay(cfg, pool, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// recordEvent writes an event to the outbox, as a change's transaction does.
func recordEvent(t *testing.T, pool *pgxpool.Pool, callerID, eventType string, data map[string]any) {
	t.Helper()
	if err := postgres.Transact(context.Background(), pool, func(tx pgx.Tx) error {
		return events.Emit(context.Background(), tx, callerID, eventType, data)
	}); err != nil {
		t.Fatal(err)
	}
}

func setWebhookURL(t *testing.T, pool *pgxpool.Pool, callerID, url string) {
	t.Helper()
	if tag, err := pool.Exec(context.Background(), `UPDATE callers SET webhook_url = $2 WHERE id = $1`, callerID, url); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("set %s's webhook URL: %v", callerID, err)
	}
}

func webhookSecret(t *testing.T, pool *pgxpool.Pool, callerID string) []byte {
	t.Helper()
	var secret string
	if err := pool.QueryRow(context.Background(), `SELECT webhook_secret FROM callers WHERE id = $1`, callerID).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	return []byte(secret)
}

type outboxEvent struct {
	callerID    string
	typ         string
	data        map[string]any
	createdAt   time.Time
	delivered   bool
	attempts    int32
	due         bool          // next_attempt_at <= now()
	nextAttempt time.Duration // next_attempt_at - now()
}

// outbox reads every event, by id.
func outbox(t *testing.T, pool *pgxpool.Pool) map[string]outboxEvent {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT id, caller_id, type, data, created_at, delivered_at IS NOT NULL, delivery_attempts,
		       next_attempt_at <= now(),
		       CASE WHEN isfinite(next_attempt_at) THEN next_attempt_at - now() END -- a parked event's is infinity
		FROM events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]outboxEvent{}
	for rows.Next() {
		var id string
		var e outboxEvent
		var data []byte
		var next *time.Duration
		if err := rows.Scan(&id, &e.callerID, &e.typ, &data, &e.createdAt, &e.delivered, &e.attempts, &e.due, &next); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &e.data); err != nil {
			t.Fatal(err)
		}
		if next != nil {
			e.nextAttempt = *next
		}
		out[id] = e
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// received is one request an endpoint got.
type received struct {
	method, path string
	header       http.Header
	body         []byte
}

// endpoint is a caller's webhook receiver: it records every request and
// answers with status (204 unless set).
type endpoint struct {
	*httptest.Server
	status atomic.Int32
	mu     sync.Mutex
	got    []received
}

func newEndpoint(t *testing.T) *endpoint {
	t.Helper()
	e := &endpoint{}
	e.status.Store(http.StatusNoContent)
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("endpoint: read body: %v", err)
		}
		e.mu.Lock()
		e.got = append(e.got, received{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: body})
		e.mu.Unlock()
		w.WriteHeader(int(e.status.Load()))
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) requests() []received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// New refuses every configuration that could not work, with an error that
// names the field, so a bad setting fails at start-up and says which one.
func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	if _, err := events.NewRelay(goodConfig(), nil, quiet); err != nil {
		t.Fatalf("a valid configuration was refused: %v", err)
	}
	for _, c := range []struct {
		field  string
		mutate func(*events.RelayConfig)
	}{
		{"Batch", func(c *events.RelayConfig) { c.Batch = 0 }},
		{"Interval", func(c *events.RelayConfig) { c.Interval = 0 }},
		{"Timeout", func(c *events.RelayConfig) { c.Timeout = 0 }},
		// A delivery runs under its claim's lease: it must outlast Timeout.
		{"Lease", func(c *events.RelayConfig) { c.Lease = c.Timeout }},
		{"BackoffCap", func(c *events.RelayConfig) { c.BackoffBase, c.BackoffCap = time.Second, time.Second-1 }},
		{"BackoffBase", func(c *events.RelayConfig) { c.BackoffBase = 0 }},
	} {
		cfg := goodConfig()
		c.mutate(&cfg)
		r, err := events.NewRelay(cfg, nil, quiet)
		if err == nil || r != nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("bad %s (%+v): %v; want no relay and an error naming %s", c.field, cfg, err, c.field)
		}
	}
}

// RunOnce posts every due event to its caller's endpoint (the caller's
// webhook URL, or the demo receiver's URL plus the caller id), signed with
// that caller's own secret, with the event's id, type, time and data; it
// marks each delivered, and a second scan finds nothing to deliver.
func TestRunOnceDeliversSignedEvents(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ep := newEndpoint(t)
	setWebhookURL(t, pool, "acme", ep.URL+"/acme-hooks")
	// globex has no webhook URL: its events go to the demo receiver.
	cfg := goodConfig()
	cfg.DemoURL = ep.URL + "/demo/"
	r := newRelay(t, pool, cfg)

	recordEvent(t, pool, "acme", events.ChargeSucceeded, map[string]any{"charge_id": "ch_1", "amount": 100})
	recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": "ord_1", "amount": 100})
	recordEvent(t, pool, "globex", events.ChargeFailed, map[string]any{"charge_id": "ch_2", "failure_code": "generic_decline"})
	want := outbox(t, pool)
	secrets := map[string][]byte{"acme": webhookSecret(t, pool, "acme"), "globex": webhookSecret(t, pool, "globex")}
	if string(secrets["acme"]) == string(secrets["globex"]) {
		t.Fatal("the callers share a webhook secret")
	}

	n, err := r.RunOnce(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("RunOnce: %d, %v; want the 3 events", n, err)
	}

	got := ep.requests()
	if len(got) != 3 {
		t.Fatalf("the endpoints got %d requests; want 3", len(got))
	}
	seen := map[string]bool{}
	for _, req := range got {
		var d events.Delivery
		if err := json.Unmarshal(req.body, &d); err != nil {
			t.Fatalf("delivery body %s: %v", req.body, err)
		}
		ev, ok := want[d.ID]
		if !ok {
			t.Fatalf("delivered an event that is not in the outbox: %s", req.body)
		}
		seen[d.ID] = true
		wantPath := map[string]string{"acme": "/acme-hooks", "globex": "/demo/globex"}[ev.callerID]
		if req.method != http.MethodPost || req.path != wantPath || req.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s was sent as %s %s (%s); want POST %s, application/json", d.ID, req.method, req.path, req.header.Get("Content-Type"), wantPath)
		}
		var data map[string]any
		if err := json.Unmarshal(d.Data, &data); err != nil {
			t.Fatal(err)
		}
		if d.Type != ev.typ || !d.CreatedAt.Equal(ev.createdAt) || !reflect.DeepEqual(data, ev.data) {
			t.Errorf("%s delivered as %s at %v with %v; want %s at %v with %v", d.ID, d.Type, d.CreatedAt, data, ev.typ, ev.createdAt, ev.data)
		}
		sig := req.header.Get(events.SignatureHeader)
		if err := cardprocessor.Verify(secrets[ev.callerID], sig, req.body, time.Now(), 0); err != nil {
			t.Errorf("%s: the signature does not verify with %s's secret: %v", d.ID, ev.callerID, err)
		}
		other := map[string]string{"acme": "globex", "globex": "acme"}[ev.callerID]
		if err := cardprocessor.Verify(secrets[other], sig, req.body, time.Now(), 0); !errors.Is(err, cardprocessor.ErrSignatureMismatch) {
			t.Errorf("%s: verifying with %s's secret: %v; want a mismatch (each caller has its own)", d.ID, other, err)
		}
	}
	if len(seen) != 3 {
		t.Errorf("delivered %d distinct events; want each of the 3 once", len(seen))
	}
	for id, ev := range outbox(t, pool) {
		if !ev.delivered || ev.attempts != 1 {
			t.Errorf("%s: delivered %v after %d attempts; want delivered at the first", id, ev.delivered, ev.attempts)
		}
	}

	if n, err := r.RunOnce(context.Background()); err != nil || n != 0 {
		t.Errorf("second RunOnce: %d, %v; want nothing left to deliver", n, err)
	}
	if len(ep.requests()) != 3 {
		t.Errorf("the endpoints got %d requests after a second scan; want still 3", len(ep.requests()))
	}
}

// A delivery that fails (the endpoint answers 500, or cannot be reached at
// all) leaves the event undelivered, with the attempt counted and its next
// try put off by the backoff, not by the claim's lease: the next scan does
// not hammer the endpoint, and once the event is due again and the
// endpoint works it is delivered.
func TestFailedDeliveryIsRetriedLater(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"500", "unreachable"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			ep := newEndpoint(t)
			if name == "500" {
				ep.status.Store(http.StatusInternalServerError)
				setWebhookURL(t, pool, "acme", ep.URL)
			} else {
				gone := httptest.NewServer(http.NotFoundHandler())
				gone.Close()
				setWebhookURL(t, pool, "acme", gone.URL)
			}
			cfg := goodConfig()
			cfg.Lease = 24 * time.Hour // far longer than the backoff cap (an hour)
			r := newRelay(t, pool, cfg)
			recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": "ord_1"})

			n, err := r.RunOnce(context.Background())
			if err != nil || n != 1 {
				t.Fatalf("RunOnce: %d, %v; want the event claimed, its failure handled", n, err)
			}
			for id, ev := range outbox(t, pool) {
				// Full jitter draws the delay from [0, 1h]; a draw of a few
				// milliseconds is possible but (about 1 in a million) rare.
				if ev.delivered || ev.attempts != 1 || ev.due || ev.nextAttempt > time.Hour {
					t.Errorf("%s: delivered %v, %d attempts, next try in %v; want undelivered, 1 attempt, next try in (0, 1h]",
						id, ev.delivered, ev.attempts, ev.nextAttempt)
				}
			}
			if n, err := r.RunOnce(context.Background()); err != nil || n != 0 {
				t.Errorf("an immediate second scan claimed %d (%v); want none before the backoff", n, err)
			}
			wantCalls := map[string]int{"500": 1, "unreachable": 0}[name]
			if got := len(ep.requests()); got != wantCalls {
				t.Errorf("the endpoint got %d requests; want %d", got, wantCalls)
			}

			// The endpoint works again and the backoff has passed.
			ep.status.Store(http.StatusOK)
			setWebhookURL(t, pool, "acme", ep.URL)
			if _, err := pool.Exec(context.Background(), `UPDATE events SET next_attempt_at = now()`); err != nil {
				t.Fatal(err)
			}
			if n, err := r.RunOnce(context.Background()); err != nil || n != 1 {
				t.Fatalf("RunOnce after recovery: %d, %v", n, err)
			}
			for id, ev := range outbox(t, pool) {
				if !ev.delivered || ev.attempts != 2 {
					t.Errorf("%s: delivered %v after %d attempts; want delivered at the second", id, ev.delivered, ev.attempts)
				}
			}
		})
	}
}

// Two relays draining one outbox at once (two server replicas) share it:
// a claimed event is invisible to the other relay, so without failures
// every event is delivered exactly once.
func TestTwoRelaysShareTheQueue(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ep := newEndpoint(t)
	setWebhookURL(t, pool, "acme", ep.URL)
	const n = 30
	for i := range n {
		recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": i})
	}
	cfg := goodConfig()
	cfg.Batch = 4
	relays := []*events.Relay{newRelay(t, pool, cfg), newRelay(t, pool, cfg)}
	var claimed atomic.Int64
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Go(func() {
			for {
				k, err := r.RunOnce(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				claimed.Add(int64(k))
				if k == 0 {
					return
				}
			}
		})
	}
	wg.Wait()

	deliveries := map[string]int{}
	for _, req := range ep.requests() {
		var d events.Delivery
		if err := json.Unmarshal(req.body, &d); err != nil {
			t.Fatal(err)
		}
		deliveries[d.ID]++
	}
	ids := slices.Collect(maps.Keys(outbox(t, pool)))
	for _, id := range ids {
		if deliveries[id] != 1 {
			t.Errorf("%s delivered %d times; want once", id, deliveries[id])
		}
	}
	if claimed.Load() != n || len(deliveries) != n {
		t.Errorf("the relays claimed %d and delivered %d distinct events; want %d each", claimed.Load(), len(deliveries), n)
	}
	for id, ev := range outbox(t, pool) {
		if !ev.delivered || ev.attempts != 1 {
			t.Errorf("%s: delivered %v after %d attempts; want delivered at the first", id, ev.delivered, ev.attempts)
		}
	}
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runInBackground(r *events.Relay) (cancel func(), done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	go func() { defer close(ch); r.Run(ctx) }()
	return cancel, ch
}

func wantReturnSoon(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its context being canceled")
	}
}

// Run returns promptly once its context is canceled: while it waits out
// its interval (here an hour) after a scan, and while a delivery is in
// flight to an endpoint that does not answer (the relay's timeout is 30s;
// the cancellation must reach the request, not wait for the timeout).
func TestRunReturnsPromptlyWhenCanceled(t *testing.T) {
	t.Parallel()

	t.Run("waiting", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t)
		ep := newEndpoint(t)
		setWebhookURL(t, pool, "acme", ep.URL)
		recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": "ord_1"})
		cfg := goodConfig()
		cfg.Interval = time.Hour
		cancel, done := runInBackground(newRelay(t, pool, cfg))
		defer cancel()
		waitFor(t, "the delivery", func() bool { return len(ep.requests()) == 1 })
		cancel()
		wantReturnSoon(t, done)
	})

	t.Run("delivering", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t)
		inFlight, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(inFlight) })
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		t.Cleanup(hang.Close)
		t.Cleanup(func() { close(release) }) // runs first: frees the handler before Close waits for it
		setWebhookURL(t, pool, "acme", hang.URL)
		recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": "ord_1"})
		cfg := goodConfig()
		cfg.Batch, cfg.Timeout = 1, 30*time.Second
		cancel, done := runInBackground(newRelay(t, pool, cfg))
		defer cancel()
		select {
		case <-inFlight:
		case <-time.After(10 * time.Second):
			t.Fatal("the relay never called the endpoint")
		}
		cancel()
		wantReturnSoon(t, done)
		for id, ev := range outbox(t, pool) {
			if ev.delivered {
				t.Errorf("%s is marked delivered though the endpoint never acknowledged it", id)
			}
		}
	})
}

// TestAHangingEndpointDelaysNoOtherCaller: acme's endpoint accepts and never
// answers, and 30 of its events wait; globex's event, written after them,
// still reaches its endpoint at once (the contract allows 15 s), since a
// claim takes every caller's first event before anyone's second and
// delivers them all at once. acme's endpoint is not tried once per waiting
// event: after its deliveries time out, its other events wait out the
// backoff with them.
func TestAHangingEndpointDelaysNoOtherCaller(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	release := make(chan struct{})
	var hung atomic.Int32
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hung.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })
	setWebhookURL(t, pool, "acme", hanging.URL)
	for i := range 30 {
		recordEvent(t, pool, "acme", events.OrderPaid, map[string]any{"order_id": i})
	}
	ep := newEndpoint(t)
	setWebhookURL(t, pool, "globex", ep.URL)
	recordEvent(t, pool, "globex", events.OrderPaid, map[string]any{"order_id": "globex's"})
	cfg := goodConfig()
	cfg.Batch = 5
	start := time.Now()
	cancel, done := runInBackground(newRelay(t, pool, cfg))
	defer func() { cancel(); <-done }()
	waitFor(t, "globex's event", func() bool { return len(ep.requests()) == 1 })
	t.Logf("globex's event arrived after %v", time.Since(start))
	// The first batch: globex's event and four of acme's, which time out
	// (5 s); then acme's untried events are put off too (by up to an hour).
	waitFor(t, "acme's endpoint backing off", func() bool {
		for _, ev := range outbox(t, pool) {
			if ev.callerID == "acme" && ev.attempts == 0 && ev.due {
				return false
			}
		}
		return true
	})
	if n := hung.Load(); n != 4 {
		t.Errorf("acme's endpoint got %d requests; want 4, the first batch's, then nothing until the backoff", n)
	}
}

// TestAnEventThatAlwaysFailsHoldsBackNoOther: acme's endpoint refuses one
// event (evt_a) for ever and takes the rest. A failure puts off all of
// acme's due events together, so they fall due together again; of those,
// the least tried goes first, so evt_b and evt_c are delivered, one claim
// at a time, while evt_a keeps failing.
func TestAnEventThatAlwaysFailsHoldsBackNoOther(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var mu sync.Mutex
	got := map[string]int{}
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var d events.Delivery
		_ = json.NewDecoder(r.Body).Decode(&d)
		mu.Lock()
		got[d.ID]++
		mu.Unlock()
		if d.ID == "evt_a" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(ep.Close)
	setWebhookURL(t, pool, "acme", ep.URL)
	if _, err := pool.Exec(context.Background(), `INSERT INTO events (caller_id, id, type, data, created_at)
		SELECT 'acme', id, 'order.paid', '{}', now() + n * interval '1 ms' FROM unnest('{evt_a,evt_b,evt_c}'::text[]) WITH ORDINALITY AS e(id, n)`); err != nil {
		t.Fatal(err)
	}
	cfg := goodConfig()
	cfg.Batch, cfg.BackoffBase, cfg.BackoffCap = 1, time.Millisecond, time.Millisecond
	r := newRelay(t, pool, cfg)
	for range 8 {
		if _, err := pool.Exec(context.Background(), `UPDATE events SET next_attempt_at = now() WHERE delivered_at IS NULL AND next_attempt_at > now()`); err != nil {
			t.Fatal(err)
		}
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got["evt_b"] != 1 || got["evt_c"] != 1 {
		t.Errorf("deliveries %v; want evt_b and evt_c delivered once each, evt_a failing", got)
	}
}
