package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/testdb"
)

func (ts *testServer) relay(t *testing.T) *events.Relay {
	t.Helper()
	cfg := ts.cfg
	demoURL := "" // the demo receiver exists in the demo only
	if cfg.DemoMode {
		demoURL = ts.URL + "/demo/webhooks/"
	}
	r, err := events.NewRelay(events.RelayConfig{
		Interval: time.Second, Batch: 10, Lease: 60 * time.Second, Timeout: 5 * time.Second, DemoURL: demoURL,
		AllowPrivate: true, // the tests' endpoints are on loopback
		BackoffBase:  time.Millisecond, BackoffCap: time.Millisecond,
	}, testdb.Pool(t, cfg.DatabaseURL), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// drain runs the relay until no event is waiting to be delivered soon: a
// failed delivery is due again after the test relay's backoff (at most a
// millisecond), which may not have passed when a round finds nothing.
func drain(t *testing.T, db *pgxpool.Pool, r *events.Relay) {
	t.Helper()
	for range 1000 {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			continue
		}
		var waiting int
		if err := db.QueryRow(context.Background(),
			`SELECT count(*) FROM events WHERE delivered_at IS NULL AND next_attempt_at < now() + interval '1 second'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 0 {
			return
		}
	}
	t.Fatal("the relay did not drain the outbox in 1000 rounds")
}

// The relay delivers every event of the outbox to the caller's endpoint
// (here the built-in demo receiver), signed; a redelivery is recognised by
// the receiver's deduplication on the event id.
func TestRelayDeliversEveryEventAtLeastOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ts.paidCharge(t, 700) // charge.succeeded and order.paid
	r := ts.relay(t)
	drain(t, ts.db, r)

	var events, received, undelivered int
	err := ts.db.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM demo_received_events),
		       (SELECT count(*) FROM events WHERE delivered_at IS NULL)`).Scan(&events, &received, &undelivered)
	if err != nil {
		t.Fatal(err)
	}
	if events != 2 || received != 2 || undelivered != 0 {
		t.Fatalf("%d events, %d received, %d undelivered; want 2, 2, 0", events, received, undelivered)
	}

	// A relay that crashed after delivering but before recording it
	// delivers again: the receiver sees a duplicate, not a new event.
	if _, err := ts.db.Exec(context.Background(), `UPDATE events SET delivered_at = NULL, next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	drain(t, ts.db, r)
	var distinct, deliveries int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*), sum(deliveries) FROM demo_received_events`).Scan(&distinct, &deliveries); err != nil {
		t.Fatal(err)
	}
	if distinct != 2 || deliveries != 4 {
		t.Errorf("%d distinct events in %d deliveries; want 2 in 4", distinct, deliveries)
	}
}

// An endpoint that fails is retried until it acknowledges; a delivery with
// a bad signature is refused by the receiver.
func TestRelayRetriesAFailingEndpoint(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	var secret string
	if err := ts.db.QueryRow(context.Background(), `SELECT webhook_secret FROM callers WHERE id = 'acme'`).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	var other string
	if err := ts.db.QueryRow(context.Background(), `SELECT webhook_secret FROM callers WHERE id = 'globex'`).Scan(&other); err != nil || other == secret {
		t.Fatalf("callers share a webhook secret (%v)", err)
	}
	var calls atomic.Int32
	var verified atomic.Int32
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if cardprocessor.Verify([]byte(secret), r.Header.Get(events.SignatureHeader), body, time.Now(), 0) == nil {
			verified.Add(1)
		}
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(endpoint.Close)
	if _, err := ts.db.Exec(context.Background(), `UPDATE callers SET webhook_url = $1 WHERE id = 'acme'`, endpoint.URL); err != nil {
		t.Fatal(err)
	}
	o := ts.newOrder(t, "sk_test_acme", 100)
	ts.do(t, chargeRequest(o.ID, "declined", "pm_card_chargeDeclined")) // one charge.failed event
	drain(t, ts.db, ts.relay(t))
	var delivered bool
	var attempts int
	if err := ts.db.QueryRow(context.Background(), `SELECT delivered_at IS NOT NULL, delivery_attempts FROM events`).Scan(&delivered, &attempts); err != nil {
		t.Fatal(err)
	}
	if !delivered || attempts != 2 || calls.Load() != 2 || verified.Load() != 2 {
		t.Errorf("delivered %v after %d attempts (%d calls, %d verified); want delivered on the 2nd, every call signed", delivered, attempts, calls.Load(), verified.Load())
	}

	// The demo receiver refuses a delivery it cannot verify, and answers an
	// unknown caller exactly alike: this unauthenticated endpoint must not
	// tell anyone which caller ids exist.
	now := time.Now()
	for _, sig := range []string{"t=1,v1=00", cardprocessor.Sign([]byte("whsec_guess"), now, []byte(`{"id":"evt_x"}`))} {
		known := ts.do(t, request{method: "POST", path: "/demo/webhooks/acme", header: http.Header{events.SignatureHeader: {sig}}, body: `{"id":"evt_x"}`})
		known.wantProblem(t, http.StatusBadRequest, "invalid_signature")
		unknown := ts.do(t, request{method: "POST", path: "/demo/webhooks/no-such-caller", header: http.Header{events.SignatureHeader: {sig}}, body: `{"id":"evt_x"}`})
		if unknown.Status != known.Status || !bytes.Equal(unknown.Body, known.Body) {
			t.Errorf("signature %q: unknown caller answered %d %s, known caller %d %s; want them alike", sig, unknown.Status, unknown.Body, known.Status, known.Body)
		}
	}
}
