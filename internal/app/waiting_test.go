package app

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/config"
)

// Duplicates wait for the original (IDEMPOTENCY_WAIT) instead of being
// sent away with a 409: the answer they get is the original's stored
// response, replayed, the moment it is stored.

// A duplicate of a charge still in progress is answered with that charge's
// answer once it is stored: the same status and bytes, marked as a replay.
// The original is held inside its last phase by a table lock (its ledger
// entry's insert waits), so "in progress" is a fact, not a timing accident.
func TestDuplicateGetsTheOriginalsAnswer(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.IdempotencyWait = time.Minute }))
	o := ts.newOrder(t, "sk_test_acme", 1999)
	release := ts.blockInserts(t, "ledger_entries")
	original := make(chan response, 1)
	go func() { original <- ts.do(t, chargeRequest(o.ID, "waited", "pm_card_visa")) }()
	ts.waitForBlockedInserts(t, "ledger_entries", 1)

	duplicate := make(chan response, 1)
	go func() { duplicate <- ts.do(t, chargeRequest(o.ID, "waited", "pm_card_visa")) }()
	waitFor(t, 10*time.Second, "the duplicate to wait", func() bool {
		var awaited bool
		_ = ts.db.QueryRow(context.Background(), `SELECT awaited FROM idempotency_keys WHERE key = 'waited'`).Scan(&awaited)
		return awaited
	})
	select {
	case d := <-duplicate:
		t.Fatalf("the duplicate was answered (%d %s) while the original was still working", d.Status, d.Body)
	default:
	}
	release()
	first, dup := <-original, <-duplicate
	if first.Status != http.StatusCreated || dup.Status != http.StatusCreated || !bytes.Equal(dup.Body, first.Body) ||
		dup.Header.Get("Idempotent-Replayed") != "true" || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("original %d %s, duplicate %d %v %s; want the original's answer, replayed", first.Status, first.Body, dup.Status, dup.Header, dup.Body)
	}
	if n := ts.count(t, "charges"); n != 1 {
		t.Fatalf("%d charges; want 1", n)
	}
}

// Two hundred duplicates of one charge are all answered by a server whose
// pool has ten connections: waiting holds none, so while they wait the
// server still serves other requests, and once the original is done each
// gets its answer (or, past its wait, a 409 with a short Retry-After).
// One charge is made.
func TestTwoHundredDuplicatesWithTenConnections(t *testing.T) {
	t.Parallel()
	var inFlight atomic.Int64
	ts := newTestServer(t,
		withConfig(func(c *config.Server) { c.IdempotencyWait = time.Minute; c.RateLimit = 0 }),
		func(o *serverOptions) {
			o.pool = func(c *pgxpool.Config) { c.MaxConns = 10 }
			o.wrap = func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodPost {
						inFlight.Add(1)
						defer inFlight.Add(-1)
					}
					h.ServeHTTP(w, r)
				})
			}
		})
	o := ts.newOrder(t, "sk_test_acme", 1999)
	release := ts.blockInserts(t, "ledger_entries")
	original := make(chan response, 1)
	go func() { original <- ts.do(t, chargeRequest(o.ID, "storm", "pm_card_visa")) }()
	ts.waitForBlockedInserts(t, "ledger_entries", 1)

	const n = 200
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := ts.send(t, context.Background(), chargeRequest(o.ID, "storm", "pm_card_visa"))
			if err != nil {
				t.Error(err)
			}
			answers[i] = res
		})
	}
	waitFor(t, 30*time.Second, "all the duplicates to be in the server", func() bool { return inFlight.Load() == n+1 })
	// Ten connections, two hundred waiters, and the server still answers
	// something else: the waiters hold no connection.
	if res := ts.get(t, "/v1/orders"); res.Status != http.StatusOK {
		t.Fatalf("another request while %d duplicates wait: %d %s", n, res.Status, res.Body)
	}
	release()
	first := <-original
	wg.Wait()
	replayed, conflicts := 0, 0
	for _, a := range answers {
		switch {
		case a.Status == http.StatusCreated && bytes.Equal(a.Body, first.Body) && a.Header.Get("Idempotent-Replayed") == "true":
			replayed++
		case a.Status == http.StatusConflict:
			a.wantProblem(t, http.StatusConflict, "idempotency_key_in_use")
			if ra, err := strconv.Atoi(a.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 2 {
				t.Errorf("409 with Retry-After %q; want 1 or 2", a.Header.Get("Retry-After"))
			}
			conflicts++
		default:
			t.Fatalf("a duplicate got %d %v %s", a.Status, a.Header, a.Body)
		}
	}
	t.Logf("%d duplicates: %d replayed, %d told to retry", n, replayed, conflicts)
	if first.Status != http.StatusCreated || replayed+conflicts != n {
		t.Fatalf("original %d; duplicates %d replayed + %d 409; want 201 and %d answered", first.Status, replayed, conflicts, n)
	}
	if c := ts.count(t, "charges"); c != 1 {
		t.Fatalf("%d charges; want 1", c)
	}
}
