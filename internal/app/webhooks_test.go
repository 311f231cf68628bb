package app

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
)

func signedWebhook(t *testing.T, body string, at time.Time, secret string) request {
	t.Helper()
	return request{method: "POST", path: "/webhooks/processor",
		header: http.Header{"Processor-Signature": {cardprocessor.Sign([]byte(secret), at, []byte(body))}}, body: body}
}

func TestWebhookSignatureIsCheckedFirst(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	body := `{"id":"pevt_1","type":"charge.succeeded","created":1,"data":{"id":"pch_1","downstream_key":"acme-ch_unknown","amount":1,"currency":"usd","status":"succeeded","decline_code":null}}`
	for name, req := range map[string]request{
		"wrong secret":    signedWebhook(t, body, time.Now(), "whsec_wrong"),
		"stale":           signedWebhook(t, body, time.Now().Add(-6*time.Minute), ts.webhookSecret),
		"from the future": signedWebhook(t, body, time.Now().Add(6*time.Minute), ts.webhookSecret),
		"malformed":       {method: "POST", path: "/webhooks/processor", header: http.Header{"Processor-Signature": {"v1=abc"}}, body: body},
		"body changed": func() request {
			r := signedWebhook(t, body, time.Now(), ts.webhookSecret)
			r.body = body + " "
			return r
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			ts.do(t, req).wantProblem(t, http.StatusBadRequest, "invalid_signature")
		})
	}
	// Even an invalid body is refused for its signature first.
	ts.do(t, request{method: "POST", path: "/webhooks/processor", header: http.Header{"Processor-Signature": {"t=1,v1=00"}}, body: `{"nope":`}).
		wantProblem(t, http.StatusBadRequest, "invalid_signature")
	if n := ts.count(t, "processor_events"); n != 0 {
		t.Errorf("%d webhook events recorded from bad deliveries", n)
	}
	// A valid event about a key we never made is acknowledged and ignored.
	res := ts.do(t, signedWebhook(t, body, time.Now(), ts.webhookSecret))
	if res.Status != http.StatusOK {
		t.Errorf("unknown object: %d %s", res.Status, res.Body)
	}
}

// A webhook may be the first to tell us a stalled charge succeeded (the
// processor charged the card, but its answer to us was lost). It completes
// the charge's local state; the client's later retry resumes the operation,
// finds the outcome recorded, and agrees with it: one charge, one set of
// events. A redelivery of the webhook changes nothing.
func TestWebhookCompletesStalledChargeAndRetryAgrees(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	ts.do(t, chargeRequest(o.ID, "lost", "pm_card_lostResponse")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")

	// The processor's own webhook arrives (asynchronously): wait for it.
	waitFor(t, 10*time.Second, "the processor's webhook completes the charge", func() bool { return ts.orderStatus(t, o.ID) == "paid" })
	var recStatus string
	if err := ts.db.QueryRow(context.Background(), `SELECT status FROM idempotency_keys WHERE key = 'lost'`).Scan(&recStatus); err != nil || recStatus != "in_progress" {
		t.Fatalf("the key record is %s (%v); the webhook completes the charge, not the request", recStatus, err)
	}

	// Redeliver the same event: a duplicate.
	var downstream, processorID string
	if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key, processor_charge_id FROM charges`).Scan(&downstream, &processorID); err != nil {
		t.Fatal(err)
	}
	var eventID string
	if err := ts.db.QueryRow(context.Background(), `SELECT event_id FROM processor_events`).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"id":%q,"type":"charge.succeeded","created":1,"data":{"id":%q,"downstream_key":%q,"amount":1500,"currency":"usd","status":"succeeded","decline_code":null}}`, eventID, processorID, downstream)
	res := ts.do(t, signedWebhook(t, body, time.Now(), ts.webhookSecret))
	var ack struct {
		Received  bool `json:"received"`
		Duplicate bool `json:"duplicate"`
	}
	res.decode(t, &ack)
	if res.Status != http.StatusOK || !ack.Received || !ack.Duplicate {
		t.Errorf("redelivery: %d %s; want a duplicate acknowledged", res.Status, res.Body)
	}

	// The client retries: the resumed operation agrees with the webhook.
	retry := ts.do(t, chargeRequest(o.ID, "lost", "pm_card_lostResponse"))
	var ch charge
	retry.decode(t, &ch)
	if retry.Status != http.StatusCreated || ch.Status != "succeeded" {
		t.Fatalf("retry: %d %s", retry.Status, retry.Body)
	}
	var succeededEvents int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE type IN ('charge.succeeded', 'order.paid')`).Scan(&succeededEvents); err != nil || succeededEvents != 2 {
		t.Errorf("%d charge.succeeded/order.paid events (%v); want one of each", succeededEvents, err)
	}
	if n := len(ts.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

// Deliveries may come out of order and late: a refund's event before its
// charge's, both after our own phases recorded everything. Each is
// acknowledged and applied idempotently: nothing changes, nothing is
// recorded twice.
func TestWebhooksOutOfOrderChangeNothingTwice(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ch := ts.paidCharge(t, 900)
	if res := ts.do(t, refundRequest(ch.ID, "r1", `{"amount":400}`)); res.Status != http.StatusCreated {
		t.Fatal(res.Status, string(res.Body))
	}
	var chargeKey, chargePID, refundKey, refundPID string
	if err := ts.db.QueryRow(context.Background(), `
		SELECT c.downstream_key, c.processor_charge_id, r.downstream_key, r.processor_refund_id
		FROM charges c JOIN refunds r ON r.caller_id = c.caller_id AND r.charge_id = c.id`).Scan(&chargeKey, &chargePID, &refundKey, &refundPID); err != nil {
		t.Fatal(err)
	}
	countEvents := func() (n int) {
		if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := countEvents()
	for i, body := range []string{
		fmt.Sprintf(`{"id":"pevt_late_refund","type":"refund.succeeded","created":2,"data":{"id":%q,"downstream_key":%q,"amount":400,"currency":"usd","status":"succeeded","decline_code":null}}`, refundPID, refundKey),
		fmt.Sprintf(`{"id":"pevt_late_charge","type":"charge.succeeded","created":1,"data":{"id":%q,"downstream_key":%q,"amount":900,"currency":"usd","status":"succeeded","decline_code":null}}`, chargePID, chargeKey),
	} {
		if res := ts.do(t, signedWebhook(t, body, time.Now(), ts.webhookSecret)); res.Status != http.StatusOK {
			t.Fatalf("delivery %d: %d %s", i, res.Status, res.Body)
		}
	}
	if after := countEvents(); after != before {
		t.Errorf("late, reordered webhooks wrote %d events", after-before)
	}
	var refunded int64
	if err := ts.db.QueryRow(context.Background(), `SELECT amount_refunded FROM charges`).Scan(&refunded); err != nil || refunded != 400 {
		t.Errorf("amount refunded %d (%v); want 400", refunded, err)
	}
	assertMoneyConserved(t, ts)
}

// A correctly signed event that contradicts a final state already recorded
// is acknowledged (a 5xx would be redelivered for ever), changes no money
// state, and is set aside for an operator with what it contradicts.
func TestContradictingWebhookIsSetAsideNotApplied(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	declined := ts.newOrder(t, "sk_test_acme", 300)
	if res := ts.do(t, chargeRequest(declined.ID, "declined", "pm_card_chargeDeclined")); res.Status != http.StatusPaymentRequired {
		t.Fatalf("declined charge: %d %s", res.Status, res.Body)
	}
	paid := ts.paidCharge(t, 800)

	type row struct{ key, pid, status string }
	chargeRow := func(orderID string) (r row) {
		if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key, processor_charge_id, status FROM charges WHERE order_id = $1`,
			orderID).Scan(&r.key, &r.pid, &r.status); err != nil {
			t.Fatal(err)
		}
		return r
	}
	countEvents := func() (n int) {
		if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	d, p := chargeRow(declined.ID), chargeRow(paid.OrderID)
	eventsBefore := countEvents()
	for _, ev := range []struct{ id, typ string }{{"pevt_contra_1", "charge.succeeded"}, {"pevt_contra_2", "charge.failed"}} {
		r := d
		if ev.typ == "charge.failed" {
			r = p
		}
		body := fmt.Sprintf(`{"id":%q,"type":%q,"created":1,"data":{"id":%q,"downstream_key":%q,"amount":300,"currency":"usd","status":"succeeded","decline_code":null}}`,
			ev.id, ev.typ, r.pid, r.key)
		for delivery := range 2 {
			res := ts.do(t, signedWebhook(t, body, time.Now(), ts.webhookSecret))
			if res.Status != http.StatusOK {
				t.Fatalf("%s, delivery %d: %d %s; want 200 (acknowledged, not applied)", ev.typ, delivery, res.Status, res.Body)
			}
		}
	}
	if got := chargeRow(declined.ID).status; got != "failed" {
		t.Errorf("the declined charge is now %s; want still failed", got)
	}
	if got := chargeRow(paid.OrderID).status; got != "succeeded" {
		t.Errorf("the succeeded charge is now %s; want still succeeded", got)
	}
	if got := ts.orderStatus(t, declined.ID); got != "pending" {
		t.Errorf("the declined charge's order is %s; want pending", got)
	}
	if n := countEvents(); n != eventsBefore {
		t.Errorf("%d events written by contradicting webhooks; want none", n-eventsBefore)
	}
	var setAside int
	if err := ts.db.QueryRow(context.Background(),
		`SELECT count(*) FROM processor_events WHERE contradiction LIKE '%recorded%'`).Scan(&setAside); err != nil || setAside != 2 {
		t.Errorf("%d events set aside for an operator (%v); want 2", setAside, err)
	}
	assertMoneyConserved(t, ts)
}
