package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
)

func refundRequest(chargeID, key, body string) request {
	return request{method: "POST", path: "/v1/charges/" + chargeID + "/refunds", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {key}}, body: body}
}

// paidCharge creates an order of amount and charges it.
func (ts *testServer) paidCharge(t *testing.T, amount int) charge {
	t.Helper()
	o := ts.newOrder(t, "sk_test_acme", amount)
	res := ts.do(t, chargeRequest(o.ID, "pay-"+o.ID, "pm_card_visa"))
	if res.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	var ch charge
	res.decode(t, &ch)
	return ch
}

type refund struct {
	ID       string `json:"id"`
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Status   string `json:"status"`
}

func TestRefundOnceAndReplay(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ch := ts.paidCharge(t, 1000)

	first := ts.do(t, refundRequest(ch.ID, "refund-1", `{"amount":300}`))
	if first.Status != http.StatusCreated {
		t.Fatalf("refund: %d %s", first.Status, first.Body)
	}
	var re refund
	first.decode(t, &re)
	if re.Amount != 300 || re.Status != "succeeded" || re.ChargeID != ch.ID {
		t.Errorf("refund %+v", re)
	}
	if again := ts.do(t, refundRequest(ch.ID, "refund-1", `{"amount":300}`)); !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s", again.Status, again.Body)
	}
	// No amount: what remains.
	rest := ts.do(t, refundRequest(ch.ID, "refund-rest", ""))
	var restRefund refund
	rest.decode(t, &restRefund)
	if rest.Status != http.StatusCreated || restRefund.Amount != 700 {
		t.Fatalf("refund of the rest: %d %s", rest.Status, rest.Body)
	}
	// Nothing remains now: a final, stored 409.
	full := ts.do(t, refundRequest(ch.ID, "refund-more", `{"amount":1}`))
	full.wantProblem(t, http.StatusConflict, "charge_not_refundable")
	if again := ts.do(t, refundRequest(ch.ID, "refund-more", `{"amount":1}`)); !bytes.Equal(again.Body, full.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the conflict should replay: %s", again.Body)
	}
	ts.do(t, refundRequest("ch_nope", "refund-unknown", "")).wantProblem(t, http.StatusNotFound, "not_found")
	ts.do(t, refundRequest(ch.ID, "refund-zero", `{"amount":0}`)).wantProblem(t, http.StatusBadRequest, "invalid_request")
	assertMoneyConserved(t, ts)
}

// Refunds under different keys, all at once, never exceed the charge:
// exactly three of ten 300s fit in 1000, the others are a 409, and the
// processor refunded exactly what we recorded.
func TestConcurrentRefundsNeverExceedTheCharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ch := ts.paidCharge(t, 1000)
	var reqs []request
	for i := range 10 {
		reqs = append(reqs, refundRequest(ch.ID, fmt.Sprintf("concurrent-%d", i), `{"amount":300}`))
	}
	succeeded := 0
	for _, r := range fireEach(t, reqs, ts) {
		switch r.Status {
		case http.StatusCreated:
			succeeded++
		case http.StatusConflict:
			r.wantProblem(t, http.StatusConflict, "refund_exceeds_charge")
		default:
			t.Fatalf("unexpected %d %s (an over-refund must be a 4xx, never a 5xx)", r.Status, r.Body)
		}
	}
	if succeeded != 3 {
		t.Errorf("%d refunds of 300 succeeded on a charge of 1000; want 3", succeeded)
	}
	assertMoneyConserved(t, ts)
}

// assertMoneyConserved: the processor's ledger (charges minus refunds)
// equals our succeeded charges minus our succeeded refunds, and every
// charge's refunded amount is the sum of its refunds.
func assertMoneyConserved(t *testing.T, ts *testServer) {
	t.Helper()
	var processorNet int64
	for _, e := range ts.effects(t) {
		switch {
		case e.Object == "charge" && e.Status == "succeeded":
			processorNet += e.Amount
		case e.Object == "refund" && e.Status == "succeeded":
			processorNet -= e.Amount
		}
	}
	var ourNet int64
	var inconsistent int
	err := ts.db.QueryRow(context.Background(), `
		SELECT
		  (SELECT coalesce(sum(amount), 0) FROM charges WHERE status = 'succeeded')
		  - (SELECT coalesce(sum(amount), 0) FROM refunds WHERE status = 'succeeded'),
		  (SELECT count(*) FROM charges c WHERE c.amount_refunded <>
		     (SELECT coalesce(sum(r.amount), 0) FROM refunds r WHERE r.caller_id = c.caller_id AND r.charge_id = c.id AND r.status IN ('pending', 'succeeded')))`).Scan(&ourNet, &inconsistent)
	if err != nil {
		t.Fatal(err)
	}
	if ourNet != processorNet || inconsistent != 0 {
		t.Errorf("money: we hold %d, the processor %d; %d charges disagree with their refunds", ourNet, processorNet, inconsistent)
	}
}

// GET /v1/charges/{id}/refunds lists a charge's refunds oldest first, a page
// at a time; another caller's charge is a 404 and a cursor from another
// charge a 400. (The operation docs/adding-an-operation.md walks through.)
func TestListRefundsOfACharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ch := ts.paidCharge(t, 1000)
	other := ts.paidCharge(t, 700)
	var made []refund
	for i, amount := range []int{100, 200, 300} {
		res := ts.do(t, refundRequest(ch.ID, fmt.Sprintf("list-%d", i), fmt.Sprintf(`{"amount":%d}`, amount)))
		if res.Status != http.StatusCreated {
			t.Fatalf("refund %d: %d %s", i, res.Status, res.Body)
		}
		var re refund
		res.decode(t, &re)
		made = append(made, re)
	}
	var otherRefund refund
	ts.do(t, refundRequest(other.ID, "list-other", `{"amount":50}`)).decode(t, &otherRefund)

	type page struct {
		Data    []refund `json:"data"`
		HasMore bool     `json:"has_more"`
	}
	var first, second page
	ts.get(t, "/v1/charges/"+ch.ID+"/refunds?limit=2").decode(t, &first)
	if len(first.Data) != 2 || !first.HasMore || first.Data[0].ID != made[0].ID || first.Data[1].ID != made[1].ID {
		t.Fatalf("first page %+v; want the two oldest refunds and has_more", first)
	}
	ts.get(t, "/v1/charges/"+ch.ID+"/refunds?limit=2&starting_after="+first.Data[1].ID).decode(t, &second)
	if len(second.Data) != 1 || second.HasMore || second.Data[0].ID != made[2].ID || second.Data[0].Amount != 300 {
		t.Fatalf("second page %+v; want the third refund and no more", second)
	}

	ts.get(t, "/v1/charges/"+ch.ID+"/refunds?starting_after="+otherRefund.ID).wantProblem(t, http.StatusBadRequest, "invalid_request")
	ts.get(t, "/v1/charges/ch_nosuch/refunds").wantProblem(t, http.StatusNotFound, "not_found")
	ts.do(t, request{method: "GET", path: "/v1/charges/" + ch.ID + "/refunds", apiKey: "sk_test_globex"}).wantProblem(t, http.StatusNotFound, "not_found")
}
