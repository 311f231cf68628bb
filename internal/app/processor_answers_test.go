package app

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// A processor answer that does not say "done" or "definitely not" never
// becomes a final outcome. A 409 from the processor means an earlier
// request with the same downstream key is still running there (Stripe
// answers so): the charge may well succeed. It used to be read as a
// decline, stored as a 402 (and the order could be charged again) while
// the first request charged the card.
func TestProcessorInFlightIsNotADecline(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1300)
	ts.do(t, chargeRequest(o.ID, "in-flight", "pm_card_inFlight")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	if status := keyStatus(t, ts.db, "in-flight"); status != "in_progress" {
		t.Fatalf("after the processor's 409 the key record is %s; want in_progress (nothing final stored)", status)
	}
	res := ts.do(t, chargeRequest(o.ID, "in-flight", "pm_card_inFlight"))
	var ch charge
	res.decode(t, &ch)
	if res.Status != http.StatusCreated || ch.Status != "succeeded" {
		t.Fatalf("retry: %d %s; want the charge succeeded", res.Status, res.Body)
	}
	charges := 0
	for _, e := range ts.effects(t) {
		if e.Object == fakeprocessor.ObjectCharge {
			charges++
		}
	}
	if charges != 1 {
		t.Errorf("%d charges at the processor; want 1", charges)
	}
}

// The same for a payout: a 409 is "not yet", never "failed" (which would
// give the money back to the balance while the transfer goes ahead).
func TestPayoutInFlightIsNotAFailure(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 3000)
	res := ts.do(t, payoutRequest("sk_test_acme", "po-in-flight", `{"amount":2000,"currency":"usd","destination":"ba_test_inFlight"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	final, _ := ts.pollPayout(t, "sk_test_acme", res.Header.Get("Location"))
	if final.Status != "paid" {
		t.Fatalf("payout %+v; want paid", final)
	}
	if transfers := ts.payoutTransfers(t); len(transfers) != 1 || transfers[0].Status != "paid" {
		t.Errorf("processor transfers %+v; want one, paid", transfers)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 1000 || pending != 0 {
		t.Errorf("balance: available %d, pending %d; want 1000, 0", avail, pending)
	}
}

// A payout job that the processor keeps telling to wait (503 with a long
// Retry-After, which snoozes the job and so uses up none of River's
// attempts) used to wait for ever. It gives up after PAYOUT_GIVE_UP_AFTER
// and is set aside with its reason; the money stays held (pending), since
// only a person can say where it is.
func TestPayoutJobGivesUpWhenTheProcessorKeepsSayingWait(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.PayoutGiveUpAfter = 3 * time.Second }))
	ts.fund(t, "sk_test_acme", 3000)
	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1, ErrorRetryAfter: 2})
	res := ts.do(t, payoutRequest("sk_test_acme", "po-wait", `{"amount":1200,"currency":"usd"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	var state, reason string
	waitFor(t, 30*time.Second, "the payout job to be set aside", func() bool {
		err := ts.db.QueryRow(context.Background(), `
			SELECT state::text, coalesce(errors[array_upper(errors, 1)] ->> 'error', '')
			FROM river.river_job WHERE kind = 'payout'`).Scan(&state, &reason)
		if err != nil {
			t.Fatal(err)
		}
		return state == "cancelled"
	})
	if want := "no definite answer from the processor after 3s"; !strings.Contains(reason, want) {
		t.Errorf("the job's reason %q; want it to say %q", reason, want)
	}
	var po payout
	ts.get(t, res.Header.Get("Location")).decode(t, &po)
	if po.Status != "pending" {
		t.Errorf("payout %s; want pending: not failed on a guess", po.Status)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 1800 || pending != 1200 {
		t.Errorf("balance: available %d, pending %d; want 1800 and the 1200 held", avail, pending)
	}
	if n := len(ts.payoutTransfers(t)); n != 0 {
		t.Errorf("%d transfers at the processor; want none", n)
	}
}

// A correctly signed webhook about the right downstream key but with the
// wrong amount is not applied: it is recorded and set aside, the payout
// stays in transit, and the balance does not move.
func TestWebhookWithTheWrongAmountIsNotApplied(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.setChaos(t, fakeprocessor.Chaos{}) // no duplicates: one delivery per event
	ts.fund(t, "sk_test_acme", 5000)
	res := ts.do(t, payoutRequest("sk_test_acme", "po-slow", `{"amount":5000,"currency":"usd","destination":"ba_test_slow"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	var key, processorID string
	waitFor(t, 10*time.Second, "the payout to be in transit", func() bool {
		err := ts.db.QueryRow(context.Background(), `SELECT downstream_key, coalesce(processor_payout_id, '') FROM payouts`).Scan(&key, &processorID)
		if err != nil {
			t.Fatal(err)
		}
		return processorID != ""
	})
	body := fmt.Sprintf(`{"id":"pevt_wrong_amount","type":"payout.failed","created":1,"data":{"id":%q,"downstream_key":%q,"amount":9999,"currency":"usd","status":"failed","failure_code":"account_closed"}}`,
		processorID, key)
	if res := ts.do(t, signedWebhook(t, body, time.Now(), ts.webhookSecret)); res.Status != http.StatusOK {
		t.Fatalf("webhook: %d %s; want 200 (acknowledged, not applied)", res.Status, res.Body)
	}
	var contradiction string
	if err := ts.db.QueryRow(context.Background(), `SELECT coalesce(contradiction, '') FROM processor_events WHERE event_id = 'pevt_wrong_amount'`).Scan(&contradiction); err != nil || !strings.Contains(contradiction, "amount") {
		t.Errorf("event recorded with contradiction %q (%v); want the amount named", contradiction, err)
	}
	if avail, _ := ts.usd(t, "sk_test_acme"); avail != 0 {
		t.Errorf("available %d after a webhook with the wrong amount; want 0 (the money is in transit)", avail)
	}
	// The payout goes on to be paid, as the processor says.
	if final, _ := ts.pollPayout(t, "sk_test_acme", res.Header.Get("Location")); final.Status != "paid" {
		t.Errorf("payout %+v; want paid", final)
	}
}

// A processor 422 says it has seen our downstream key with a different
// request. That is no answer about the customer's money (and our bug, or
// someone else using our key), so it is never recorded as a decline: the
// operation is set aside for an operator at once, the charge stays
// pending, and the order is neither paid nor payable again by a guess.
//
// The key is taken from us the way it would happen in life: the first
// attempt gets no answer (a 503 before any effect), and before the retry
// someone else sends the processor a different charge under that key.
func TestProcessorRefusingOurKeyIsDeadNotDeclined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1300)
	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1})
	ts.do(t, chargeRequest(o.ID, "taken-key", "pm_card_visa")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	ts.setChaos(t, fakeprocessor.Chaos{})

	var downstreamKey string
	if err := ts.db.QueryRow(ctx, `SELECT downstream_key FROM charges WHERE order_id = $1`, o.ID).Scan(&downstreamKey); err != nil {
		t.Fatal(err)
	}
	other, err := cardprocessor.NewClient(ts.processorURL, 5*time.Second).Charge(ctx, downstreamKey,
		cardprocessor.ChargeRequest{Amount: 999, Currency: "usd", PaymentMethod: fakeprocessor.PaymentMethodVisa})
	if err != nil {
		t.Fatalf("the other charge under our key: %v", err)
	}

	ts.do(t, chargeRequest(o.ID, "taken-key", "pm_card_visa")).wantProblem(t, http.StatusConflict, "idempotency_key_dead")
	if status := keyStatus(t, ts.db, "taken-key"); status != "dead" {
		t.Errorf("key record %s; want dead (set aside at once, not retried by the reconciler)", status)
	}
	var chargeStatus string
	var failureCode *string
	if err := ts.db.QueryRow(ctx, `SELECT status, failure_code FROM charges WHERE order_id = $1`, o.ID).Scan(&chargeStatus, &failureCode); err != nil {
		t.Fatal(err)
	}
	if chargeStatus != "pending" || failureCode != nil {
		t.Errorf("charge %s (failure code %v); want pending: a refused key is not a decline", chargeStatus, failureCode)
	}
	var ord order
	ts.get(t, "/v1/orders/"+o.ID).decode(t, &ord)
	if ord.Status != "pending" {
		t.Errorf("order %s; want pending", ord.Status)
	}
	// A retry gets the same answer, and the processor still has only the
	// other charge: ours was never made.
	ts.do(t, chargeRequest(o.ID, "taken-key", "pm_card_visa")).wantProblem(t, http.StatusConflict, "idempotency_key_dead")
	var made []fakeprocessor.LedgerEntry
	for _, e := range ts.effects(t) {
		if e.Object == fakeprocessor.ObjectCharge {
			made = append(made, e)
		}
	}
	if len(made) != 1 || made[0].ID != other.ID || made[0].Amount != 999 {
		t.Errorf("processor charges %+v; want only the other one (%s, 999)", made, other.ID)
	}
}

// The same for a payout: a 422 cancels the job with its reason (a person
// must look), the payout stays pending, and its money stays held, because
// nothing says whether it left.
func TestPayoutJobWhoseKeyIsRefusedIsCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 3000)
	// The job's first run gets a 503 and waits 5 s before the next: the
	// time to take its key.
	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1, ErrorRetryAfter: 5})
	res := ts.do(t, payoutRequest("sk_test_acme", "po-taken", `{"amount":1200,"currency":"usd"}`))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	var downstreamKey string
	if err := ts.db.QueryRow(ctx, `SELECT downstream_key FROM payouts`).Scan(&downstreamKey); err != nil {
		t.Fatal(err)
	}
	// Its first run is over once River has put it off for the
	// processor's Retry-After: it was inserted due at once, and only a
	// run that called the processor moves it seconds ahead.
	waitFor(t, 30*time.Second, "the payout job's first run to be put off", func() bool {
		var putOff bool
		if err := ts.db.QueryRow(ctx, `SELECT scheduled_at > now() + interval '2 seconds' FROM river.river_job WHERE kind = 'payout'`).Scan(&putOff); err != nil {
			t.Fatal(err)
		}
		return putOff
	})
	ts.setChaos(t, fakeprocessor.Chaos{})
	if _, err := cardprocessor.NewClient(ts.processorURL, 5*time.Second).Payout(ctx, downstreamKey,
		cardprocessor.PayoutRequest{Amount: 700, Currency: "usd", Destination: "ba_test_ok"}); err != nil {
		t.Fatalf("the other payout under our key: %v", err)
	}

	var state, reason string
	waitFor(t, 30*time.Second, "the payout job to be set aside", func() bool {
		err := ts.db.QueryRow(ctx, `
			SELECT state::text, coalesce(errors[array_upper(errors, 1)] ->> 'error', '')
			FROM river.river_job WHERE kind = 'payout'`).Scan(&state, &reason)
		if err != nil {
			t.Fatal(err)
		}
		return state == "cancelled"
	})
	if !strings.Contains(reason, "idempotency_key_reused") {
		t.Errorf("the job's reason %q; want the processor's refusal of the key", reason)
	}
	var po payout
	ts.get(t, res.Header.Get("Location")).decode(t, &po)
	if po.Status != "pending" {
		t.Errorf("payout %s; want pending: not failed on a guess", po.Status)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 1800 || pending != 1200 {
		t.Errorf("balance: available %d, pending %d; want 1800 and the 1200 held", avail, pending)
	}
	if transfers := ts.payoutTransfers(t); len(transfers) != 1 || transfers[0].Amount != 700 {
		t.Errorf("processor transfers %+v; want only the other one, of 700", transfers)
	}
}
