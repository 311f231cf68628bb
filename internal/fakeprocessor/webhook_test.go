package fakeprocessor_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// receiver is a webhook endpoint that verifies every delivery, as the
// payments server's receiver will, and reports what it accepted.
type receiver struct {
	URL    string
	secret []byte
	// accepted gets every verified delivery it answered with 204.
	accepted chan fakeprocessor.Event

	mu       sync.Mutex
	failNext int            // answer this many next deliveries with 500
	attempts map[string]int // deliveries seen per event id, refused or not
}

func newReceiver(t *testing.T, secret string) *receiver {
	t.Helper()
	rc := &receiver{secret: []byte(secret), accepted: make(chan fakeprocessor.Event, 100), attempts: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		// Verify first, before looking at the body at all.
		if err := cardprocessor.Verify(rc.secret, r.Header.Get(fakeprocessor.SignatureHeader), body, time.Now(), cardprocessor.SignatureTolerance); err != nil {
			t.Errorf("delivery failed verification: %v", err)
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		var ev fakeprocessor.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("delivery is not an event: %v", err)
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.attempts[ev.ID]++
		fail := rc.failNext > 0
		if fail {
			rc.failNext--
		}
		rc.mu.Unlock()
		if fail {
			http.Error(w, "try again later", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		rc.accepted <- ev
	}))
	t.Cleanup(srv.Close)
	rc.URL = srv.URL
	return rc
}

// next waits for the next accepted event. The deadline only bounds a
// failing test; the test is synchronised by the channel.
func (rc *receiver) next(t *testing.T) fakeprocessor.Event {
	t.Helper()
	select {
	case ev := <-rc.accepted:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivered within 10s")
		return fakeprocessor.Event{}
	}
}

func (rc *receiver) attemptsFor(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.attempts[id]
}

// fastRetries makes retries quick: the backoff is real time.
func fastRetries(url string) fakeprocessor.Config {
	return fakeprocessor.Config{
		WebhookURL:         url,
		WebhookSecret:      []byte("whsec_test_webhooks"),
		WebhookBackoffBase: time.Millisecond,
		WebhookBackoffCap:  10 * time.Millisecond,
	}
}

func TestWebhooksAreSignedAndDeliveredForEveryEffect(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, "whsec_test_webhooks")
	f := newFake(t, fastRetries(rc.URL))

	var ch fakeprocessor.Charge
	decodeInto(t, f.post(t, "/v1/charges", "wh-ok", chargeBody(1500, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, &ch)
	declined := wantError(t, f.post(t, "/v1/charges", "wh-no", chargeBody(800, fakeprocessor.PaymentMethodInsufficientFunds)), http.StatusPaymentRequired, fakeprocessor.CodeCardDeclined)
	var re fakeprocessor.Refund
	decodeInto(t, f.post(t, "/v1/refunds", "wh-re", fmt.Sprintf(`{"charge":%q,"amount":1500}`, ch.ID)), http.StatusCreated, &re)
	// A replay is not an effect and sends no event.
	f.post(t, "/v1/charges", "wh-ok", chargeBody(1500, fakeprocessor.PaymentMethodVisa))

	// Delivery order is not guaranteed: collect by type.
	got := map[string]fakeprocessor.Event{}
	for range 3 {
		ev := rc.next(t)
		if _, dup := got[ev.Type]; dup {
			t.Fatalf("two %s events without duplicate chaos", ev.Type)
		}
		got[ev.Type] = ev
	}
	if ev := got[fakeprocessor.EventChargeSucceeded].Data; ev.ID != ch.ID || ev.DownstreamKey != "wh-ok" || ev.Amount != 1500 || ev.Status != fakeprocessor.StatusSucceeded || ev.DeclineCode != nil {
		t.Errorf("charge.succeeded: %+v", ev)
	}
	if ev := got[fakeprocessor.EventChargeFailed].Data; ev.ID != declined.Charge || ev.DownstreamKey != "wh-no" || ev.Status != fakeprocessor.StatusFailed || ev.DeclineCode == nil || *ev.DeclineCode != fakeprocessor.DeclineInsufficientFunds {
		t.Errorf("charge.failed: %+v", ev)
	}
	if ev := got[fakeprocessor.EventRefundSucceeded].Data; ev.ID != re.ID || ev.Charge != ch.ID || ev.DownstreamKey != "wh-re" || ev.Amount != 1500 {
		t.Errorf("refund.succeeded: %+v", ev)
	}
	for _, ev := range got {
		if len(ev.ID) < 5 || ev.ID[:4] != "evt_" || ev.Created == 0 {
			t.Errorf("event envelope: %+v", ev)
		}
	}
}

func TestWebhookIsRetriedAfterAFailedDelivery(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, "whsec_test_webhooks")
	rc.failNext = 2
	f := newFake(t, fastRetries(rc.URL))

	decodeInto(t, f.post(t, "/v1/charges", "retried", chargeBody(100, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, new(fakeprocessor.Charge))
	ev := rc.next(t)
	if n := rc.attemptsFor(ev.ID); n != 3 {
		t.Fatalf("event %s accepted after %d deliveries; want 3 (two refused)", ev.ID, n)
	}
}

func TestWebhookDeliveryGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, "whsec_test_webhooks")
	rc.failNext = 1 << 30
	cfg := fastRetries(rc.URL)
	cfg.WebhookMaxAttempts = 3
	f := newFake(t, cfg)
	decodeInto(t, f.post(t, "/v1/charges", "doomed", chargeBody(100, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, new(fakeprocessor.Charge))

	// Let the receiver start accepting, and send a second event: the
	// deliverer handles one delivery at a time in due order, so once the
	// second is accepted the first has either been given up or is still
	// backing off. Closing then shows the count never passed the bound.
	rc.mu.Lock()
	rc.failNext = 0
	rc.mu.Unlock()
	decodeInto(t, f.post(t, "/v1/charges", "fine", chargeBody(100, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, new(fakeprocessor.Charge))
	for {
		ev := rc.next(t)
		if ev.Data.DownstreamKey == "fine" {
			break
		}
	}
	f.Close()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, n := range rc.attempts {
		if n > 3 {
			t.Errorf("event %s delivered %d times; at most 3 allowed", id, n)
		}
	}
}

func TestDuplicateWebhooksWithChaos(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, "whsec_test_webhooks")
	cfg := fastRetries(rc.URL)
	cfg.Chaos.DuplicateWebhookRate = 1
	f := newFake(t, cfg)

	decodeInto(t, f.post(t, "/v1/charges", "twice", chargeBody(100, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, new(fakeprocessor.Charge))
	first, second := rc.next(t), rc.next(t)
	if first.ID != second.ID || first.Data != second.Data {
		t.Fatalf("duplicates differ:\n%+v\n%+v", first, second)
	}
}
