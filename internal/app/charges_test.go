package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
)

type charge struct {
	ID            string  `json:"id"`
	OrderID       string  `json:"order_id"`
	Amount        int64   `json:"amount"`
	Currency      string  `json:"currency"`
	Status        string  `json:"status"`
	PaymentMethod string  `json:"payment_method"`
	FailureCode   *string `json:"failure_code"`
}

func chargeRequest(orderID, key, paymentMethod string) request {
	return request{method: "POST", path: "/v1/orders/" + orderID + "/charges", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {key}}, body: fmt.Sprintf(`{"payment_method":%q}`, paymentMethod)}
}

// effects returns the processor's ledger entries: every charge it made.
func (ts *testServer) effects(t *testing.T) []fakeprocessor.LedgerEntry {
	t.Helper()
	effects, err := fakeprocessor.FetchLedger(context.Background(), ts.processorURL)
	if err != nil {
		t.Fatal(err)
	}
	return effects
}

func (ts *testServer) orderStatus(t *testing.T, id string) string {
	t.Helper()
	var o order
	ts.get(t, "/v1/orders/"+id).decode(t, &o)
	return o.Status
}

func TestChargeSucceedsOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1999)

	first := ts.do(t, chargeRequest(o.ID, "pay-1", "pm_card_visa"))
	if first.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.Status, first.Body)
	}
	var ch charge
	first.decode(t, &ch)
	if ch.Status != "succeeded" || ch.OrderID != o.ID || ch.Amount != 1999 || ch.Currency != "usd" || first.Header.Get("Location") != "/v1/charges/"+ch.ID {
		t.Errorf("charge %+v, Location %q", ch, first.Header.Get("Location"))
	}
	if s := ts.orderStatus(t, o.ID); s != "paid" {
		t.Errorf("order is %s; want paid", s)
	}
	replay := ts.do(t, chargeRequest(o.ID, "pay-1", "pm_card_visa"))
	if !bytes.Equal(replay.Body, first.Body) || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s", replay.Status, replay.Body)
	}
	if got := ts.get(t, "/v1/charges/"+ch.ID); got.Status != http.StatusOK {
		t.Errorf("GET charge: %d", got.Status)
	}
	ts.do(t, request{method: "GET", path: "/v1/charges/" + ch.ID, apiKey: "sk_test_globex"}).wantProblem(t, http.StatusNotFound, "not_found")

	effects := ts.effects(t)
	if len(effects) != 1 || effects[0].Status != "succeeded" || effects[0].Amount != 1999 {
		t.Fatalf("processor ledger %+v; want exactly one succeeded charge of 1999", effects)
	}
	// A paid order cannot be charged again (stored) nor canceled.
	ts.do(t, chargeRequest(o.ID, "pay-2", "pm_card_visa")).wantProblem(t, http.StatusConflict, "order_not_payable")
	ts.do(t, request{method: "POST", path: "/v1/orders/" + o.ID + "/cancel", apiKey: "sk_test_acme"}).wantProblem(t, http.StatusConflict, "order_not_cancelable")
	if n := len(ts.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

func TestDeclineIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 500)
	first := ts.do(t, chargeRequest(o.ID, "declined", "pm_card_insufficientFunds"))
	p := first.wantProblem(t, http.StatusPaymentRequired, "card_declined")
	if p["decline_code"] != "insufficient_funds" {
		t.Errorf("decline_code %v", p["decline_code"])
	}
	again := ts.do(t, chargeRequest(o.ID, "declined", "pm_card_insufficientFunds"))
	if !bytes.Equal(again.Body, first.Body) || again.Status != 402 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replayed decline: %d %s", again.Status, again.Body)
	}
	var status, code string
	if err := ts.db.QueryRow(context.Background(), `SELECT status, failure_code FROM charges WHERE order_id = $1`, o.ID).Scan(&status, &code); err != nil || status != "failed" || code != "insufficient_funds" {
		t.Errorf("charge row: %s %s (%v)", status, code, err)
	}
	if s := ts.orderStatus(t, o.ID); s != "pending" {
		t.Errorf("order is %s after a decline; want pending", s)
	}
	// Another card, under a new key, pays the order.
	if res := ts.do(t, chargeRequest(o.ID, "second-card", "pm_card_mastercard")); res.Status != http.StatusCreated {
		t.Fatalf("second card: %d %s", res.Status, res.Body)
	}
	if n := len(ts.effects(t)); n != 2 {
		t.Errorf("%d processor effects; want the decline and the success", n)
	}
}

// A processor that fails (503 twice, then succeeds) is an uncertain
// outcome: 503 with Retry-After, nothing stored, the record waiting at
// charge_created; the retries with the same key resume there and the card
// is charged once.
func TestProcessorFailureResumesWithOneEffect(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 700)
	for attempt := 1; attempt <= 2; attempt++ {
		res := ts.do(t, chargeRequest(o.ID, "flaky", "pm_card_flaky"))
		res.wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
		if res.Header.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		var rec struct {
			Status        string `json:"status"`
			RecoveryPoint string `json:"recovery_point"`
			Attempt       int    `json:"attempt"`
		}
		ts.get(t, "/v1/idempotency-keys/flaky").decode(t, &rec)
		if rec.Status != "in_progress" || rec.RecoveryPoint != "charge_created" || rec.Attempt != attempt {
			t.Errorf("after failed attempt %d the record is %+v; want in_progress at charge_created", attempt, rec)
		}
	}
	res := ts.do(t, chargeRequest(o.ID, "flaky", "pm_card_flaky"))
	if res.Status != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("third attempt: %d %s", res.Status, res.Body)
	}
	effects := ts.effects(t)
	if len(effects) != 1 {
		t.Fatalf("%d processor effects; want 1", len(effects))
	}
	var downstream string
	if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key FROM charges`).Scan(&downstream); err != nil || effects[0].IdempotencyKey != downstream {
		t.Errorf("the effect's key %q is not the charge's downstream key %q (%v)", effects[0].IdempotencyKey, downstream, err)
	}
}

// The processor charged the card but the answer never arrived (a dropped
// connection, or a call that timed out): uncertain, so 503 and nothing
// recorded as failed; the retry asks again with the same downstream key and
// the processor answers with the charge it already made.
func TestLostAnswerIsRecoveredWithoutSecondCharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.ProcessorTimeout = 300 * time.Millisecond }))
	for _, method := range []string{"pm_card_lostResponse", "pm_card_timeout"} {
		t.Run(method, func(t *testing.T) {
			o := ts.newOrder(t, "sk_test_acme", 800)
			key := "lost-" + method
			ts.do(t, chargeRequest(o.ID, key, method)).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
			var status string
			// Pending, or succeeded if the processor's webhook already told
			// us; never failed.
			if err := ts.db.QueryRow(context.Background(), `SELECT status FROM charges WHERE order_id = $1`, o.ID).Scan(&status); err != nil || status == "failed" {
				t.Fatalf("charge after the lost answer is %q (%v); an uncertain outcome is never a failure", status, err)
			}
			res := ts.do(t, chargeRequest(o.ID, key, method))
			if res.Status != http.StatusCreated {
				t.Fatalf("retry: %d %s", res.Status, res.Body)
			}
			if s := ts.orderStatus(t, o.ID); s != "paid" {
				t.Errorf("order is %s; want paid", s)
			}
		})
	}
	if n := len(ts.effects(t)); n != 2 {
		t.Errorf("%d processor effects for two orders; want 2", n)
	}
}

func TestIdenticalChargesInFlight(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1200)
	responses := fire(t, 5, chargeRequest(o.ID, "same-charge", "pm_card_visa"), ts)
	var original []byte
	for _, r := range responses {
		switch {
		case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
			if original != nil {
				t.Fatal("two requests executed the charge")
			}
			original = r.Body
		case r.Status == http.StatusCreated, r.Status == http.StatusConflict:
		default:
			t.Fatalf("unexpected %d %s", r.Status, r.Body)
		}
	}
	for _, r := range responses {
		if r.Status == http.StatusCreated && !bytes.Equal(r.Body, original) {
			t.Errorf("answers differ:\n%s\n%s", r.Body, original)
		}
	}
	if n := len(ts.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

// Different keys charging one order at once: the database lets exactly one
// charge exist, so the card is charged once and the others are told the
// order is not payable.
func TestDifferentKeysChargeOneOrderOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 900)
	var reqs []request
	for i := range 8 {
		reqs = append(reqs, chargeRequest(o.ID, fmt.Sprintf("key-%d", i), "pm_card_visa"))
	}
	responses := fireEach(t, reqs, ts)
	succeeded := 0
	for _, r := range responses {
		switch r.Status {
		case http.StatusCreated:
			succeeded++
		case http.StatusConflict:
			r.wantProblem(t, http.StatusConflict, "order_not_payable")
		default:
			t.Fatalf("unexpected %d %s", r.Status, r.Body)
		}
	}
	var rows int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE status = 'succeeded'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if succeeded != 1 || rows != 1 {
		t.Fatalf("%d successful answers and %d succeeded charges; want exactly 1", succeeded, rows)
	}
	if n := len(ts.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

func TestCanceledOrderIsNotPayable(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 300)
	ts.do(t, request{method: "POST", path: "/v1/orders/" + o.ID + "/cancel", apiKey: "sk_test_acme"})
	first := ts.do(t, chargeRequest(o.ID, "late", "pm_card_visa"))
	first.wantProblem(t, http.StatusConflict, "order_not_payable")
	if again := ts.do(t, chargeRequest(o.ID, "late", "pm_card_visa")); !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the conflict is a final outcome and should replay: %d %s", again.Status, again.Body)
	}
	if n := len(ts.effects(t)); n != 0 {
		t.Errorf("%d processor effects; want none", n)
	}
	// An unknown order is a 404 that is not stored.
	ts.do(t, chargeRequest("ord_nope", "unknown-order", "pm_card_visa")).wantProblem(t, http.StatusNotFound, "not_found")
	if res := ts.get(t, "/v1/idempotency-keys/"+url.PathEscape("unknown-order")); res.Status != http.StatusNotFound {
		t.Errorf("a 404 before the claim stored a key record: %d", res.Status)
	}
}

// A charge waiting on the processor keeps its order from being canceled.
func TestChargeInProgressBlocksCancel(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 400)
	ts.do(t, chargeRequest(o.ID, "stalled", "pm_card_flaky")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	ts.do(t, request{method: "POST", path: "/v1/orders/" + o.ID + "/cancel", apiKey: "sk_test_acme"}).wantProblem(t, http.StatusConflict, "order_not_cancelable")
}

// A charge the reconciler set aside (dead) is answered with its own 409:
// not "in progress" (which tells the client to retry), and not replayed.
func TestDeadChargeIsNotRetried(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 400)
	ts.do(t, chargeRequest(o.ID, "given-up", "pm_card_flaky")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	// What the reconciler does after too many failed tries.
	if _, err := ts.db.Exec(context.Background(), `UPDATE idempotency_keys SET status = 'dead', locked_until = NULL WHERE key = 'given-up'`); err != nil {
		t.Fatal(err)
	}
	res := ts.do(t, chargeRequest(o.ID, "given-up", "pm_card_flaky"))
	res.wantProblem(t, http.StatusConflict, "idempotency_key_dead")
	if res.Header.Get("Retry-After") != "" {
		t.Error("a set-aside operation must not invite a retry")
	}
	if n := len(ts.effects(t)); n != 0 {
		t.Errorf("%d processor effects; want none", n)
	}
}

// The outbox: each state change wrote its events in its own transaction,
// exactly once, and GET /v1/events lists them newest first, per caller.
func TestEventsAreWrittenWithTheirChanges(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	declined := ts.newOrder(t, "sk_test_acme", 100)
	ts.do(t, chargeRequest(declined.ID, "no", "pm_card_chargeDeclined"))
	ch := ts.paidCharge(t, 1000)
	ts.do(t, chargeRequest(ch.OrderID, "pay-"+ch.OrderID, "pm_card_visa")) // a replay writes nothing
	if res := ts.do(t, refundRequest(ch.ID, "r", `{"amount":250}`)); res.Status != http.StatusCreated {
		t.Fatal(res.Status, string(res.Body))
	}

	var list struct {
		Data []struct {
			ID   string         `json:"id"`
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		} `json:"data"`
		HasMore bool `json:"has_more"`
	}
	ts.get(t, "/v1/events?limit=100").decode(t, &list)
	var types []string
	for _, e := range list.Data {
		types = append(types, e.Type)
	}
	// Newest first; order.paid and charge.succeeded share a transaction.
	want := map[string]int{"refund.succeeded": 1, "order.paid": 1, "charge.succeeded": 1, "charge.failed": 1}
	got := map[string]int{}
	for _, typ := range types {
		got[typ]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || types[0] != "refund.succeeded" || types[len(types)-1] != "charge.failed" {
		t.Errorf("events %v; want each once, newest first", types)
	}
	if list.Data[0].Data["charge_id"] != ch.ID || list.Data[0].Data["amount"] != float64(250) {
		t.Errorf("refund event data %v", list.Data[0].Data)
	}
	// Paging.
	var page struct {
		Data    []struct{ ID string } `json:"data"`
		HasMore bool                  `json:"has_more"`
	}
	ts.get(t, "/v1/events?limit=2").decode(t, &page)
	if len(page.Data) != 2 || !page.HasMore {
		t.Errorf("first page %+v", page)
	}
	ts.get(t, "/v1/events?limit=2&starting_after="+page.Data[1].ID).decode(t, &page)
	if len(page.Data) != 2 || page.HasMore {
		t.Errorf("second page %+v", page)
	}
	// Another caller sees none of them.
	var other struct {
		Data []any `json:"data"`
	}
	ts.do(t, request{method: "GET", path: "/v1/events", apiKey: "sk_test_globex"}).decode(t, &other)
	if len(other.Data) != 0 {
		t.Errorf("globex sees %d of acme's events", len(other.Data))
	}
}
