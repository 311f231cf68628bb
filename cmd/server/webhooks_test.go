package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/testdb"
)

// addCaller runs `server callers add` and returns the API key and webhook
// secret it printed.
func addCaller(t *testing.T, vars map[string]string, args ...string) (key, secret string) {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), append([]string{"callers", "add"}, args...), env(vars), &out); err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(out.String()) {
		switch line = strings.TrimSpace(line); {
		case strings.HasPrefix(line, "sk_live_"):
			key = line
		case strings.HasPrefix(line, "whsec_"):
			secret = line
		}
	}
	if key == "" || secret == "" {
		t.Fatalf("no key or secret printed:\n%s", out.String())
	}
	return key, secret
}

// payOrder creates an order and charges it with a card that succeeds, as
// the caller whose key this is: two events, charge.succeeded and order.paid.
func payOrder(t *testing.T, base, key string) {
	t.Helper()
	post := func(path, idemKey, body string) map[string]any {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %d %v %v", path, res.StatusCode, out, err)
		}
		return out
	}
	o := post("/v1/orders", "order-"+key[8:16], `{"amount":1500,"currency":"usd"}`)
	post(fmt.Sprintf("/v1/orders/%s/charges", o["id"]), "charge-"+key[8:16], `{"payment_method":"pm_card_visa"}`)
}

// TestCallerWebhookReceivesSignedEvents: a caller made with `callers add
// --webhook-url` gets its events pushed to that URL, signed with the secret
// the command printed; a caller without one gets nothing pushed (and no
// demo receiver stands in outside the demo): it pulls its events. A
// private endpoint is refused unless WEBHOOK_ALLOW_PRIVATE says the
// network is the tests'.
func TestCallerWebhookReceivesSignedEvents(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	received := make(chan string, 10)
	var secret string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := cardprocessor.Verify([]byte(secret), r.Header.Get(events.SignatureHeader), body, time.Now(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var d events.Delivery
		_ = json.Unmarshal(body, &d)
		received <- d.Type
	}))
	t.Cleanup(receiver.Close)

	vars := map[string]string{"DATABASE_URL": dbURL}
	for _, url := range []string{receiver.URL + "/hook", strings.Replace(receiver.URL, "http:", "https:", 1), "https://localhost/hook"} {
		if err := run(context.Background(), []string{"callers", "add", "initech", "--webhook-url", url}, env(vars), io.Discard); err == nil {
			t.Errorf("--webhook-url %s: accepted; want a private endpoint refused", url)
		}
	}
	vars["WEBHOOK_ALLOW_PRIVATE"] = "true"
	key, s := addCaller(t, vars, "initech", "--webhook-url", receiver.URL+"/hook")
	secret = s
	pullKey, _ := addCaller(t, vars, "hooli")

	base, _, _ := startServer(t, map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "WEBHOOK_ALLOW_PRIVATE": "true", "RELAY_INTERVAL": "50ms",
	})
	payOrder(t, base, key)
	payOrder(t, base, pullKey)
	var got []string
	for len(got) < 2 {
		select {
		case typ := <-received:
			got = append(got, typ)
		case <-time.After(30 * time.Second):
			t.Fatalf("received %v in 30s; want charge.succeeded and order.paid", got)
		}
	}
	if strings.Join(got, " ") != "charge.succeeded order.paid" && strings.Join(got, " ") != "order.paid charge.succeeded" {
		t.Errorf("received %v; want charge.succeeded and order.paid", got)
	}

	// hooli's events wait, undelivered, until the relay has set them
	// aside; it reads them with its key.
	db := testdb.Pool(t, dbURL)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var parked, delivered int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE next_attempt_at = 'infinity'), count(*) FILTER (WHERE delivered_at IS NOT NULL)
			FROM events WHERE caller_id = 'hooli'`).Scan(&parked, &delivered); err != nil {
			t.Fatal(err)
		}
		if delivered > 0 {
			t.Fatalf("%d of hooli's events delivered; it has no endpoint", delivered)
		}
		if parked == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of hooli's events set aside to be pulled after 30s; want 2", parked)
		}
		time.Sleep(20 * time.Millisecond) // polling the relay's progress
	}
	if status := getWithKey(t, base+"/v1/events", pullKey); status != http.StatusOK {
		t.Errorf("hooli pulls its events: %d", status)
	}
	select {
	case typ := <-received:
		t.Errorf("received %s more; hooli's events must not reach initech's endpoint", typ)
	default:
	}
	res, err := http.Post(base+"/demo/webhooks/hooli", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound && res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("the demo receiver outside the demo: %d; want none", res.StatusCode)
	}
}
