package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

type payout struct {
	ID          string  `json:"id"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Destination string  `json:"destination"`
	Status      string  `json:"status"`
	FailureCode *string `json:"failure_code"`
}

type balance struct {
	Available []struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	} `json:"available"`
	Pending []struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	} `json:"pending"`
}

// usd returns the caller's available and pending usd.
func (ts *testServer) usd(t *testing.T, apiKey string) (available, pending int64) {
	t.Helper()
	var b balance
	res := ts.do(t, request{method: "GET", path: "/v1/balance", apiKey: apiKey})
	if res.Status != http.StatusOK {
		t.Fatalf("balance: %d %s", res.Status, res.Body)
	}
	res.decode(t, &b)
	for _, a := range b.Available {
		if a.Currency == "usd" {
			available = a.Amount
		}
	}
	for _, p := range b.Pending {
		if p.Currency == "usd" {
			pending = p.Amount
		}
	}
	return available, pending
}

var fundings atomic.Int64

// fund gives the caller amount of available usd: an order, paid by a
// succeeded charge.
func (ts *testServer) fund(t *testing.T, apiKey string, amount int) {
	t.Helper()
	n := fundings.Add(1)
	res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: apiKey,
		header: http.Header{"Idempotency-Key": {fmt.Sprintf("fund-order-%d", n)}},
		body:   fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, amount)})
	var o order
	res.decode(t, &o)
	ch := chargeRequest(o.ID, fmt.Sprintf("fund-charge-%d", n), "pm_card_visa")
	ch.apiKey = apiKey
	if res := ts.do(t, ch); res.Status != http.StatusCreated {
		t.Fatalf("fund: charge %d %s", res.Status, res.Body)
	}
}

func payoutRequest(apiKey, key, body string) request {
	return request{method: "POST", path: "/v1/payouts", apiKey: apiKey,
		header: http.Header{"Idempotency-Key": {key}}, body: body}
}

// pollPayout polls the payout's Location, as a client would, until it is
// final, honouring Retry-After (in tests the processor's transfers take a
// fraction of a second, so each wait is cut to 50ms), and returns it with
// the non-final statuses it went through.
func (ts *testServer) pollPayout(t *testing.T, apiKey, location string) (payout, []string) {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		res := ts.do(t, request{method: "GET", path: location, apiKey: apiKey})
		if res.Status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", location, res.Status, res.Body)
		}
		var po payout
		res.decode(t, &po)
		retryAfter := res.Header.Get("Retry-After")
		switch po.Status {
		case "paid", "failed":
			if retryAfter != "" {
				t.Errorf("final payout %s carries Retry-After %q", po.Status, retryAfter)
			}
			return po, seen
		}
		if n, err := strconv.Atoi(retryAfter); err != nil || n < 1 {
			t.Fatalf("%s payout without a Retry-After of at least 1 (%q)", po.Status, retryAfter)
		}
		if len(seen) == 0 || seen[len(seen)-1] != po.Status {
			seen = append(seen, po.Status)
		}
		time.Sleep(50 * time.Millisecond) // the poll interval of this client, not a wait for a state
	}
	t.Fatalf("payout at %s not final within 30s", location)
	return payout{}, nil
}

// payoutTransfers returns the processor's ledger entries for payouts.
func (ts *testServer) payoutTransfers(t *testing.T) []fakeprocessor.LedgerEntry {
	t.Helper()
	var out []fakeprocessor.LedgerEntry
	for _, e := range ts.effects(t) {
		if e.Object == fakeprocessor.ObjectPayout {
			out = append(out, e)
		}
	}
	return out
}

func TestPayoutIsAcceptedReplayedAndPolledToPaid(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 5000)

	body := `{"amount":1500,"currency":"usd","destination":"ba_test_ok"}`
	first := ts.do(t, payoutRequest("sk_test_acme", "po-1", body))
	if first.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", first.Status, first.Body)
	}
	var po payout
	first.decode(t, &po)
	location := first.Header.Get("Location")
	if po.Status != "pending" || po.Amount != 1500 || po.Destination != "ba_test_ok" || location != "/v1/payouts/"+po.ID {
		t.Fatalf("accepted %+v at %q", po, location)
	}
	// Accepting took the amount from available into pending at once.
	if avail, pending := ts.usd(t, "sk_test_acme"); avail+pending != 5000 || pending > 1500 {
		t.Errorf("balance after accepting: available %d, pending %d", avail, pending)
	}

	// A retry replays the same 202, byte for byte, whatever the payout's
	// state now.
	replay := ts.do(t, payoutRequest("sk_test_acme", "po-1", body))
	if replay.Status != http.StatusAccepted || !bytes.Equal(replay.Body, first.Body) ||
		replay.Header.Get("Idempotent-Replayed") != "true" || replay.Header.Get("Location") != location {
		t.Fatalf("replay: %d %s %v", replay.Status, replay.Body, replay.Header)
	}

	final, _ := ts.pollPayout(t, "sk_test_acme", location)
	if final.Status != "paid" || final.FailureCode != nil || final.ID != po.ID {
		t.Fatalf("final payout %+v", final)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 3500 || pending != 0 {
		t.Errorf("balance after the payout: available %d, pending %d; want 3500, 0", avail, pending)
	}
	// After it was paid, a retry still replays the 202 as accepted.
	if again := ts.do(t, payoutRequest("sk_test_acme", "po-1", body)); !bytes.Equal(again.Body, first.Body) {
		t.Errorf("replay after paid differs: %s", again.Body)
	}

	transfers := ts.payoutTransfers(t)
	if key := ts.payoutDownstreamKey(t, po.ID); len(transfers) != 1 || transfers[0].Amount != 1500 || transfers[0].Status != "paid" || transfers[0].IdempotencyKey != key {
		t.Fatalf("processor payouts %+v; want one paid transfer of 1500 under %s", transfers, key)
	}
	if n := ts.countEvents(t, "payout.paid"); n != 1 {
		t.Errorf("%d payout.paid events; want 1", n)
	}
	var list struct {
		Data []payout `json:"data"`
	}
	ts.get(t, "/v1/payouts").decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != po.ID || list.Data[0].Status != "paid" {
		t.Errorf("list %+v", list.Data)
	}
}

// payoutDownstreamKey is the key the payout was sent to the processor
// under.
func (ts *testServer) payoutDownstreamKey(t *testing.T, id string) string {
	t.Helper()
	var key string
	if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key FROM payouts WHERE id = $1`, id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	return key
}

func (ts *testServer) countEvents(t *testing.T, eventType string) int {
	t.Helper()
	var n int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE type = $1`, eventType).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPayoutToAClosedAccountFailsAndGivesTheMoneyBack(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 2000)
	res := ts.do(t, payoutRequest("sk_test_acme", "po-closed", `{"amount":2000,"currency":"usd","destination":"ba_test_closed"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	final, seen := ts.pollPayout(t, "sk_test_acme", res.Header.Get("Location"))
	if final.Status != "failed" || final.FailureCode == nil || *final.FailureCode != "account_closed" {
		t.Fatalf("final %+v; want failed with account_closed", final)
	}
	for _, s := range seen {
		if s != "pending" && s != "in_transit" {
			t.Errorf("went through %q", s)
		}
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 2000 || pending != 0 {
		t.Errorf("balance after a failed payout: available %d, pending %d; want 2000, 0", avail, pending)
	}
	if n := ts.countEvents(t, "payout.failed"); n != 1 {
		t.Errorf("%d payout.failed events; want 1", n)
	}
	if tr := ts.payoutTransfers(t); len(tr) != 1 || tr[0].Status != "failed" || tr[0].FailureCode != "account_closed" {
		t.Errorf("processor payouts %+v; want one failed transfer", tr)
	}
}

func TestFlakyAndSlowDestinationsArePaidOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 3000)

	// ba_test_flaky answers 503 to the first two requests for the
	// transfer: the job's retries ask again under the same key.
	flaky := ts.do(t, payoutRequest("sk_test_acme", "po-flaky", `{"amount":1000,"currency":"usd","destination":"ba_test_flaky"}`))
	// ba_test_slow is in transit ten times as long (3s here): pollers are
	// told to wait.
	slow := ts.do(t, payoutRequest("sk_test_acme", "po-slow", `{"amount":1000,"currency":"usd","destination":"ba_test_slow"}`))
	if flaky.Status != http.StatusAccepted || slow.Status != http.StatusAccepted {
		t.Fatalf("payouts: %d %s / %d %s", flaky.Status, flaky.Body, slow.Status, slow.Body)
	}
	// The slow one first, from the moment it is accepted: it is seen in
	// transit for seconds.
	po, seen := ts.pollPayout(t, "sk_test_acme", slow.Header.Get("Location"))
	if po.Status != "paid" || len(seen) == 0 || seen[len(seen)-1] != "in_transit" {
		t.Errorf("slow payout %+v, seen %v; want paid after in_transit", po, seen)
	}
	if po, _ := ts.pollPayout(t, "sk_test_acme", flaky.Header.Get("Location")); po.Status != "paid" {
		t.Errorf("flaky payout %+v", po)
	}
	transfers := ts.payoutTransfers(t)
	if len(transfers) != 2 {
		t.Fatalf("processor payouts %+v; want one transfer per payout", transfers)
	}
	// Failed runs, not attempt: a snooze (in transit) takes its run back
	// from attempt, and the job may still be snoozed when the webhook has
	// already made the payout paid.
	var failedRuns int
	if err := ts.db.QueryRow(context.Background(), `SELECT max(cardinality(errors)) FROM river.river_job WHERE kind = 'payout'`).Scan(&failedRuns); err != nil {
		t.Fatal(err)
	}
	if failedRuns < 2 {
		t.Errorf("the flaky payout's job failed %d runs; the processor refuses the first two", failedRuns)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 1000 || pending != 0 {
		t.Errorf("balance: available %d, pending %d; want 1000, 0", avail, pending)
	}
}

// TestConcurrentPayoutsNeverOverdraw fires 20 payouts at once, each under
// its own key, against a balance that covers 3 of them: exactly 3 are
// accepted, and the other 17 are a stored insufficient_balance.
func TestConcurrentPayoutsNeverOverdraw(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 3000)

	const n = 20
	statuses := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := ts.send(t, context.Background(), payoutRequest("sk_test_acme", fmt.Sprintf("race-%d", i), `{"amount":1000,"currency":"usd"}`))
			if err != nil {
				t.Error(err)
				return
			}
			statuses[i] = res.Status
		})
	}
	close(start)
	wg.Wait()

	accepted, refused := 0, 0
	for i, s := range statuses {
		switch s {
		case http.StatusAccepted:
			accepted++
		case http.StatusConflict:
			refused++
			// A refusal is a stored outcome: its retry replays it.
			replay := ts.do(t, payoutRequest("sk_test_acme", fmt.Sprintf("race-%d", i), `{"amount":1000,"currency":"usd"}`))
			replay.wantProblem(t, http.StatusConflict, "insufficient_balance")
			if replay.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("insufficient_balance under race-%d not replayed", i)
			}
		default:
			t.Errorf("payout race-%d: status %d", i, s)
		}
	}
	if accepted != 3 || refused != 17 {
		t.Fatalf("%d accepted, %d refused; want 3 and 17", accepted, refused)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 0 || pending > 3000 {
		t.Errorf("balance: available %d, pending %d", avail, pending)
	}
	if got := ts.count(t, "payouts"); got != 3 {
		t.Errorf("%d payout rows; want 3", got)
	}
	// All three are paid, one transfer each.
	waitFor(t, 30*time.Second, "three paid payouts", func() bool {
		var paid int
		_ = ts.db.QueryRow(context.Background(), `SELECT count(*) FROM payouts WHERE status = 'paid'`).Scan(&paid)
		return paid == 3
	})
	if tr := ts.payoutTransfers(t); len(tr) != 3 {
		t.Errorf("%d processor transfers; want 3", len(tr))
	}
	// The database itself refuses an overdraw, whatever the application
	// does.
	if _, err := ts.db.Exec(context.Background(), `SELECT ledger_debit('acme', 'usd', 1, 'le_test', 'po_test')`); err == nil {
		t.Error("the database let the balance go negative")
	}
}

func TestRefundOfMoneyPaidOutIsRefused(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 2000)
	res := ts.do(t, chargeRequest(o.ID, "charge-then-payout", "pm_card_visa"))
	var ch charge
	res.decode(t, &ch)
	if res := ts.do(t, payoutRequest("sk_test_acme", "po-most", `{"amount":1500,"currency":"usd"}`)); res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	refund := request{method: "POST", path: "/v1/charges/" + ch.ID + "/refunds", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {"refund-too-much"}}, body: `{"amount":1000}`}
	ts.do(t, refund).wantProblem(t, http.StatusConflict, "insufficient_balance")
	ts.do(t, refund).wantProblem(t, http.StatusConflict, "insufficient_balance") // stored, replayed
	// What is left can be refunded.
	refund.header = http.Header{"Idempotency-Key": {"refund-the-rest"}}
	refund.body = `{"amount":500}`
	if res := ts.do(t, refund); res.Status != http.StatusCreated {
		t.Fatalf("refund of what is left: %d %s", res.Status, res.Body)
	}
	if avail, _ := ts.usd(t, "sk_test_acme"); avail != 0 {
		t.Errorf("available %d; want 0", avail)
	}
	var refunded int64
	if err := ts.db.QueryRow(context.Background(), `SELECT amount_refunded FROM charges WHERE id = $1`, ch.ID).Scan(&refunded); err != nil {
		t.Fatal(err)
	}
	if refunded != 500 {
		t.Errorf("amount_refunded %d; want 500 (the refused refund reserved nothing)", refunded)
	}
}

func TestPayoutsAreTheCallersOwn(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 1000)
	res := ts.do(t, payoutRequest("sk_test_acme", "shared-key", `{"amount":1000,"currency":"usd"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	location := res.Header.Get("Location")
	ts.do(t, request{method: "GET", path: location, apiKey: "sk_test_globex"}).wantProblem(t, http.StatusNotFound, "not_found")
	var list struct {
		Data []payout `json:"data"`
	}
	ts.do(t, request{method: "GET", path: "/v1/payouts", apiKey: "sk_test_globex"}).decode(t, &list)
	if len(list.Data) != 0 {
		t.Errorf("globex lists %d payouts", len(list.Data))
	}
	if avail, pending := ts.usd(t, "sk_test_globex"); avail != 0 || pending != 0 {
		t.Errorf("globex's balance: %d, %d", avail, pending)
	}
	// The same key is globex's own, and globex has nothing to pay out.
	ts.do(t, payoutRequest("sk_test_globex", "shared-key", `{"amount":1000,"currency":"usd"}`)).wantProblem(t, http.StatusConflict, "insufficient_balance")
	ts.do(t, request{method: "GET", path: "/v1/payouts?starting_after=" + location[len("/v1/payouts/"):], apiKey: "sk_test_globex"}).wantProblem(t, http.StatusBadRequest, "invalid_request")
}

func TestBadPayoutRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 1000)
	for _, tc := range []struct {
		name, key, body, code string
	}{
		{"unknown destination", "bad-1", `{"amount":100,"currency":"usd","destination":"ba_elsewhere"}`, "invalid_request"},
		{"zero amount", "bad-2", `{"amount":0,"currency":"usd"}`, "invalid_request"},
		{"unknown currency", "bad-3", `{"amount":100,"currency":"xyz"}`, "invalid_request"},
		{"unknown field", "bad-4", `{"amount":100,"currency":"usd","to":"me"}`, "invalid_request"},
		{"no key", "", `{"amount":100,"currency":"usd"}`, "idempotency_key_missing"},
	} {
		r := payoutRequest("sk_test_acme", tc.key, tc.body)
		if tc.key == "" {
			r.header = nil
		}
		ts.do(t, r).wantProblem(t, http.StatusBadRequest, tc.code)
	}
	if n := ts.count(t, "payouts") + ts.count(t, "river.river_job"); n != 0 {
		t.Errorf("%d payouts or jobs after bad requests", n)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 1000 || pending != 0 {
		t.Errorf("balance %d, %d", avail, pending)
	}
	ts.get(t, "/v1/payouts/po_nosuchpayout").wantProblem(t, http.StatusNotFound, "not_found")
}

// paycli payout against the real service: it prints the payout as it
// ends, after following it through its states on stderr.
func TestPaycliPayoutFollowsThePayoutToItsEnd(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 1000)
	for _, tc := range []struct{ destination, status string }{
		{"ba_test_ok", "paid"},
		{"ba_test_closed", "failed"},
	} {
		cmd := exec.Command(binary(t, "cmd/paycli"), "payout", "--url", ts.URL, "--amount", "500", "--destination", tc.destination)
		cmd.Env = append(os.Environ(), "PAYMENTS_API_KEY=sk_test_acme")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("paycli payout: %v\n%s", err, stderr.String())
		}
		var po payout
		if err := json.Unmarshal(stdout.Bytes(), &po); err != nil {
			t.Fatalf("paycli output %q: %v", stdout.String(), err)
		}
		if po.Status != tc.status || !strings.Contains(stderr.String(), "accepted (pending)") || !strings.Contains(stderr.String(), po.ID+" "+tc.status) {
			t.Errorf("to %s: %+v\nstderr:\n%s", tc.destination, po, stderr.String())
		}
	}
	// One paid (500 gone), one failed (500 back).
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 500 || pending != 0 {
		t.Errorf("balance %d, %d; want 500, 0", avail, pending)
	}
}
