package app

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/config"
)

// Every answer to a keyed request that reached the claim says what the
// claim found, in Idempotency-Outcome: a first request is new, its retry
// replayed; a retry after a 503 resumed; a retry after its owner's lease
// lapsed under it taken_over; a retry while a lease is held in_progress;
// another body under the key mismatch. The header is never stored (the
// replay of a new answer says replayed), answers given before the claim
// carry none, and browsers may read it (CORS).
func TestIdempotencyOutcomeHeader(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	outcome := func(t *testing.T, res response, status int, want string) {
		t.Helper()
		if res.Status != status || res.Header.Get(outcomeHeader) != want {
			t.Errorf("%d with %s %q; want %d with %q\n%s", res.Status, outcomeHeader, res.Header.Get(outcomeHeader), status, want, res.Body)
		}
	}

	t.Run("new, replayed, mismatch", func(t *testing.T) {
		outcome(t, ts.createOrder(t, "outcome-1", `{"amount":100,"currency":"usd"}`), http.StatusCreated, "new")
		// The first replay reads the database, the next the replay cache:
		// both say replayed, never the stored answer's "new".
		for range 2 {
			res := ts.createOrder(t, "outcome-1", `{"amount":100,"currency":"usd"}`)
			outcome(t, res, http.StatusCreated, "replayed")
			if res.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay without Idempotent-Replayed")
			}
		}
		outcome(t, ts.createOrder(t, "outcome-1", `{"amount":101,"currency":"usd"}`), http.StatusUnprocessableEntity, "mismatch")
	})

	t.Run("resumed after a 503", func(t *testing.T) {
		o := ts.newOrder(t, "sk_test_acme", 200)
		// pm_card_flaky: 503, 503, then the charge. Each 503 gives the
		// lease up, so each retry resumes the operation at once.
		outcome(t, ts.do(t, chargeRequest(o.ID, "outcome-flaky", "pm_card_flaky")), http.StatusServiceUnavailable, "new")
		outcome(t, ts.do(t, chargeRequest(o.ID, "outcome-flaky", "pm_card_flaky")), http.StatusServiceUnavailable, "resumed")
		outcome(t, ts.do(t, chargeRequest(o.ID, "outcome-flaky", "pm_card_flaky")), http.StatusCreated, "resumed")
		outcome(t, ts.do(t, chargeRequest(o.ID, "outcome-flaky", "pm_card_flaky")), http.StatusCreated, "replayed")
	})

	t.Run("in_progress, then taken_over", func(t *testing.T) {
		// The first request claims the key and is held inside its last
		// phase (the ledger entry's insert waits on the test's lock): its
		// lease has not lapsed, so a copy of it is told so.
		o := ts.newOrder(t, "sk_test_acme", 300)
		release := ts.blockInserts(t, "ledger_entries")
		charge := func() response { return ts.do(t, chargeRequest(o.ID, "outcome-stalled", "pm_card_visa")) }
		var (
			wg    sync.WaitGroup
			first response
		)
		wg.Go(func() { first = charge() })
		ts.waitForBlockedInserts(t, "ledger_entries", 1)
		outcome(t, charge(), http.StatusConflict, "in_progress")

		// Its lease lapses while it is still held: the database's clock
		// passes locked_until (moved here to a moment between the claim
		// and now, instead of waiting out the lease). The next copy takes
		// the operation over, and is held behind the first (on the order's
		// lock, which the first's last phase holds).
		if _, err := ts.db.Exec(context.Background(), `
			UPDATE idempotency_keys SET locked_until = updated_at + (clock_timestamp() - updated_at) / 2
			WHERE key = 'outcome-stalled'`); err != nil {
			t.Fatal(err)
		}
		var second response
		wg.Go(func() { second = charge() })
		waitFor(t, 10*time.Second, "the second request to take the key over", func() bool {
			var attempt int
			if err := ts.db.QueryRow(context.Background(), `SELECT attempt FROM idempotency_keys WHERE key = 'outcome-stalled'`).Scan(&attempt); err != nil {
				t.Fatal(err)
			}
			return attempt == 2
		})
		release()
		wg.Wait()
		outcome(t, second, http.StatusCreated, "taken_over")
		// The first owner was fenced out: it answers with what the record
		// says when it finds out, never a second charge: the newer owner's
		// stored response (replayed, so marked), or, its own claim having
		// been new, a 409 while that owner works or a 503 to retry.
		switch first.Status {
		case http.StatusCreated:
			outcome(t, first, first.Status, "replayed")
		case http.StatusConflict, http.StatusServiceUnavailable:
			outcome(t, first, first.Status, "new")
		default:
			t.Errorf("the fenced-out first request: %d %s", first.Status, first.Body)
		}
		if n := ts.count(t, "charges"); n != 2 {
			t.Errorf("%d charges; want 2 (one per charge key of this test)", n)
		}
	})

	t.Run("none before the claim", func(t *testing.T) {
		res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", body: `{"amount":100,"currency":"usd"}`})
		res.wantProblem(t, http.StatusBadRequest, "idempotency_key_missing")
		if v := res.Header.Values(outcomeHeader); len(v) != 0 {
			t.Errorf("a 400 before the claim says %s %q; want none", outcomeHeader, v)
		}
		var stored []byte
		if err := ts.db.QueryRow(context.Background(), `SELECT response_headers FROM idempotency_keys WHERE key = 'outcome-1'`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if len(stored) == 0 || strings.Contains(strings.ToLower(string(stored)), strings.ToLower(outcomeHeader)) {
			t.Errorf("stored headers %s; want them without %s", stored, outcomeHeader)
		}
	})

	t.Run("browsers of an allowed origin may read it", func(t *testing.T) {
		ts := newTestServer(t, withConfig(func(c *config.Server) { c.CORSAllowedOrigins = []string{"http://elsewhere.test"} }))
		req, err := http.NewRequest("GET", ts.URL+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", "http://elsewhere.test")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if exposed := res.Header.Get("Access-Control-Expose-Headers"); !strings.Contains(strings.ToLower(exposed), strings.ToLower(outcomeHeader)) {
			t.Errorf("Access-Control-Expose-Headers %q; want %s in it", exposed, outcomeHeader)
		}
	})
}
