package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestConcurrentPayoutsAndRefundsNeverOverdraw fires 25 payouts and 25
// refunds at once, each under its own key, against a balance of 5,000 that
// covers fewer than half of them: every answer is accepted or a stored
// insufficient_balance, and what was accepted is exactly what left
// available, which never went below zero.
func TestConcurrentPayoutsAndRefundsNeverOverdraw(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	var charges []charge
	for i := range 5 {
		o := ts.newOrder(t, "sk_test_acme", 1000+i) // distinct orders (newOrder's key has the amount)
		var ch charge
		ts.do(t, chargeRequest(o.ID, fmt.Sprintf("fund-%d", i), "pm_card_visa")).decode(t, &ch)
		charges = append(charges, ch)
	}
	funded := int64(5000 + 0 + 1 + 2 + 3 + 4)

	const n = 50
	reqs := make([]request, n)
	for i := range n {
		if i%2 == 0 {
			reqs[i] = payoutRequest("sk_test_acme", fmt.Sprintf("po-%d", i), `{"amount":300,"currency":"usd"}`)
			continue
		}
		reqs[i] = request{method: "POST", path: "/v1/charges/" + charges[i%5].ID + "/refunds", apiKey: "sk_test_acme",
			header: http.Header{"Idempotency-Key": {fmt.Sprintf("re-%d", i)}}, body: `{"amount":200}`}
	}
	statuses := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := ts.send(t, context.Background(), reqs[i])
			if err != nil {
				t.Error(err)
				return
			}
			statuses[i] = res.Status
			if res.Status == http.StatusConflict {
				res.wantProblem(t, http.StatusConflict, "insufficient_balance")
			}
		})
	}
	close(start)
	wg.Wait()

	var taken int64
	for i, s := range statuses {
		switch {
		case s == http.StatusAccepted && i%2 == 0:
			taken += 300
		case s == http.StatusCreated && i%2 == 1:
			taken += 200
		case s != http.StatusConflict:
			t.Errorf("request %d (%s): status %d", i, reqs[i].path, s)
		}
	}
	if taken == 0 || taken > funded {
		t.Fatalf("%d of %d taken by accepted payouts and refunds", taken, funded)
	}
	// Once the payouts' jobs are done, nothing is in flight: the balance
	// and the entries are read at rest.
	waitFor(t, 30*time.Second, "every payout final", func() bool {
		var open int
		_ = ts.db.QueryRow(context.Background(), `SELECT count(*) FROM payouts WHERE status NOT IN ('paid', 'failed')`).Scan(&open)
		return open == 0
	})
	// Every payout and refund went through: what was taken has left.
	if available, pending := ts.usd(t, "sk_test_acme"); available != funded-taken || pending != 0 {
		t.Errorf("balance: available %d, pending %d; want %d funded less %d taken, and 0", available, pending, funded, taken)
	}
	ts.checkLedger(t, "acme")
}

// checkLedger checks that the caller's balance, as GET /v1/balance reads
// it, is the sum of its entries as GET /v1/ledger_entries lists them.
func (ts *testServer) checkLedger(t *testing.T, caller string) {
	t.Helper()
	apiKey := "sk_test_" + caller
	sums := map[string]int64{}
	after := ""
	for {
		res := ts.do(t, request{method: "GET", path: "/v1/ledger_entries?limit=100" + after, apiKey: apiKey})
		var page struct {
			Data []struct {
				ID          string `json:"id"`
				Amount      int64  `json:"amount"`
				Currency    string `json:"currency"`
				FromAccount string `json:"from_account"`
				ToAccount   string `json:"to_account"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		res.decode(t, &page)
		for _, e := range page.Data {
			if e.Currency == "usd" {
				sums[e.ToAccount] += e.Amount
				sums[e.FromAccount] -= e.Amount
			}
		}
		if !page.HasMore {
			break
		}
		after = "&starting_after=" + page.Data[len(page.Data)-1].ID
	}
	available, pending := ts.usd(t, apiKey)
	if available != sums["available"] || pending != sums["pending"] {
		t.Errorf("%s's balance: available %d, pending %d; its entries sum to %d and %d", caller, available, pending, sums["available"], sums["pending"])
	}
	if sums["available"]+sums["pending"]+sums["processor"] != 0 {
		t.Errorf("%s's entries sum to %v, not zero", caller, sums)
	}
}

// TestLedgerEntriesShowEachMovement: a charge, a partial refund and a
// payout each appear as the movements they made, newest first, to their
// caller only.
func TestLedgerEntriesShowEachMovement(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 2000)
	var ch charge
	ts.do(t, chargeRequest(o.ID, "ledger-charge", "pm_card_visa")).decode(t, &ch)
	res := ts.do(t, request{method: "POST", path: "/v1/charges/" + ch.ID + "/refunds", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {"ledger-refund"}}, body: `{"amount":500}`})
	if res.Status != http.StatusCreated {
		t.Fatalf("refund: %d %s", res.Status, res.Body)
	}
	var re struct{ ID string }
	res.decode(t, &re)

	res = ts.do(t, request{method: "GET", path: "/v1/ledger_entries", apiKey: "sk_test_acme"})
	var page struct {
		Data []map[string]any `json:"data"`
	}
	res.decode(t, &page)
	var got []string
	for _, e := range page.Data {
		got = append(got, fmt.Sprintf("%s %v %s->%s", e["object_id"], e["amount"], e["from_account"], e["to_account"]))
	}
	want := []string{ // newest first; the refund's two entries may share a time
		re.ID + " 500 pending->processor", re.ID + " 500 available->pending", ch.ID + " 2000 processor->available"}
	if len(got) != 3 || got[2] != want[2] || !(got[0] == want[0] && got[1] == want[1] || got[0] == want[1] && got[1] == want[0]) {
		t.Errorf("entries %q; want %q", got, want)
	}
	ts.checkLedger(t, "acme")

	// Another caller sees none of them, and cannot page from them.
	res = ts.do(t, request{method: "GET", path: "/v1/ledger_entries", apiKey: "sk_test_globex"})
	if body, _ := json.Marshal(map[string]any{"data": []any{}, "has_more": false}); res.Status != http.StatusOK || string(res.Body) != string(body)+"\n" && string(res.Body) != string(body) {
		t.Errorf("globex's entries: %d %s", res.Status, res.Body)
	}
	id, _ := page.Data[0]["id"].(string)
	ts.do(t, request{method: "GET", path: "/v1/ledger_entries?starting_after=" + id, apiKey: "sk_test_globex"}).
		wantProblem(t, http.StatusBadRequest, "invalid_request")
}
