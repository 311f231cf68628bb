package events_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/events"
)

// TestWebhookURLMustBePublic: outside the demo, an endpoint is a public
// https URL; one at a loopback, private, link-local or metadata address,
// whether written as an address or a name that resolves to one, is
// refused (the relay would otherwise be a way into the server's network).
func TestWebhookURLMustBePublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{
		"https://127.0.0.1/hook", "https://localhost/hook", "https://[::1]/hook", "https://10.1.2.3/hook",
		"https://192.168.0.1/hook", "https://172.16.0.1/hook", "https://169.254.169.254/latest/meta-data",
		"https://[fe80::1]/hook", "https://0.0.0.0/hook", "https://100.64.0.1/hook", "https://[::ffff:127.0.0.1]/hook",
		// What the IANA special-purpose registries mark as not globally
		// reachable, and IPv6 that embeds an IPv4 address (NAT64 and 6to4 of
		// the metadata address, IPv4-compatible loopback).
		"https://[64:ff9b::a9fe:a9fe]/hook", "https://[2002:a9fe:a9fe::1]/hook", "https://[::127.0.0.1]/hook",
		"https://0.1.2.3/hook", "https://198.18.0.1/hook", "https://240.0.0.1/hook", "https://192.0.0.170/hook",
		"https://[2001::1]/hook", "https://[fc00::1]/hook", "https://[2001:db8::1]/hook",
		"http://93.184.216.34/hook", // public, but not https
		"https://user:pw@93.184.216.34/hook", "/hook", "ftp://93.184.216.34/",
	} {
		if err := events.CheckWebhookURL(ctx, raw, false); err == nil {
			t.Errorf("%s: accepted; want refused", raw)
		}
	}
	for _, public := range []string{"93.184.216.34", "[2606:2800:220:1::1]"} {
		if err := events.CheckWebhookURL(ctx, "https://"+public+"/hook", false); err != nil {
			t.Errorf("a public https endpoint: %v", err)
		}
	}
	// The relay's guard as it connects refuses the same addresses, and
	// lets the public ones through.
	for addr, public := range map[string]bool{"93.184.216.34:443": true, "[2606:2800:220:1::1]:443": true,
		"169.254.169.254:80": false, "[64:ff9b::a9fe:a9fe]:80": false, "[2002:a9fe:a9fe::1]:80": false,
		"[::127.0.0.1]:80": false, "0.1.2.3:80": false, "198.18.0.1:80": false, "240.0.0.1:80": false,
		"192.0.0.170:80": false, "[::ffff:10.0.0.1]:80": false} {
		if err := events.PublicOnly("tcp", addr, nil); (err == nil) != public {
			t.Errorf("connecting to %s: %v; want allowed %v", addr, err, public)
		}
	}
	// The demo and the tests allow their loopback receivers.
	if err := events.CheckWebhookURL(ctx, "http://127.0.0.1:8080/hook", true); err != nil {
		t.Errorf("loopback, allowed: %v", err)
	}
}

// TestRelayRefusesToConnectToAPrivateAddress: an endpoint that reached the
// database anyway (set by SQL, or a name that resolves elsewhere since) is
// never connected to: the delivery fails and is retried, as for an
// endpoint that is down.
func TestRelayRefusesToConnectToAPrivateAddress(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var calls atomic.Int32
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	t.Cleanup(endpoint.Close)
	setWebhookURL(t, pool, "acme", endpoint.URL)
	recordEvent(t, pool, "acme", "order.paid", map[string]any{"id": "ord_1"})
	cfg := goodConfig()
	cfg.AllowPrivate = false
	if _, err := newRelay(t, pool, cfg).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, ev := range outbox(t, pool) {
		if ev.delivered || ev.attempts != 1 || calls.Load() != 0 {
			t.Errorf("%s: delivered %v after %d attempts, %d calls; want refused before connecting", id, ev.delivered, ev.attempts, calls.Load())
		}
	}
}

// TestEventsWithoutAnEndpointWaitToBePulled: with no webhook URL (and no
// demo receiver), an event is not pushed, not marked delivered, and not
// counted as an attempt; once the caller sets a URL, it is delivered,
// signed.
func TestEventsWithoutAnEndpointWaitToBePulled(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	recordEvent(t, pool, "acme", "order.paid", map[string]any{"id": "ord_1"})
	r := newRelay(t, pool, goodConfig())
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, ev := range outbox(t, pool) {
		if ev.delivered || ev.attempts != 0 || ev.due {
			t.Errorf("%s with no endpoint: delivered %v, %d attempts, due %v; want it parked", id, ev.delivered, ev.attempts, ev.due)
		}
	}
	if n, _ := r.RunOnce(context.Background()); n != 0 {
		t.Errorf("claimed %d parked events; want none", n)
	}

	secret := webhookSecret(t, pool, "acme")
	var verified atomic.Int32
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
		if cardprocessor.Verify(secret, r.Header.Get(events.SignatureHeader), body, time.Now(), 0) == nil {
			verified.Add(1)
		}
	}))
	t.Cleanup(endpoint.Close)
	url := endpoint.URL
	if _, err := events.SetWebhookURL(context.Background(), pool, "acme", &url); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, ev := range outbox(t, pool) {
		if !ev.delivered || verified.Load() != 1 {
			t.Errorf("%s after a URL was set: delivered %v, %d verified; want delivered, signed", id, ev.delivered, verified.Load())
		}
	}
}

// TestRotatedSecretSignsBesideTheNewOne: after a rotation, deliveries carry
// a signature by the new secret and one by the old, so a receiver holding
// either accepts them while it switches.
func TestRotatedSecretSignsBesideTheNewOne(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	old := webhookSecret(t, pool, "acme")
	fresh, until, err := events.RotateWebhookSecret(context.Background(), pool, "acme")
	if err != nil || string(old) == fresh || !strings.HasPrefix(fresh, "whsec_") || time.Until(until) < events.SecretOverlap-time.Minute {
		t.Fatalf("rotate: %q until %v, %v; want a new secret, the old one kept for %v", fresh, until, err, events.SecretOverlap)
	}
	var byOld, byNew atomic.Int32
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
		if cardprocessor.Verify(old, r.Header.Get(events.SignatureHeader), body, time.Now(), 0) == nil {
			byOld.Add(1)
		}
		if cardprocessor.Verify([]byte(fresh), r.Header.Get(events.SignatureHeader), body, time.Now(), 0) == nil {
			byNew.Add(1)
		}
	}))
	t.Cleanup(endpoint.Close)
	setWebhookURL(t, pool, "acme", endpoint.URL)
	recordEvent(t, pool, "acme", "order.paid", map[string]any{"id": "ord_1"})
	if _, err := newRelay(t, pool, goodConfig()).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if byOld.Load() != 1 || byNew.Load() != 1 {
		t.Errorf("verified by the old secret %d, by the new %d; want both", byOld.Load(), byNew.Load())
	}
}

// TestRelayDoesNotFollowRedirects: an endpoint that redirects (perhaps to
// an address it may not name itself) has not acknowledged the event: the
// relay does not follow, and retries later.
func TestRelayDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var followed atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { followed.Add(1) }))
	t.Cleanup(target.Close)
	endpoint := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
	t.Cleanup(endpoint.Close)
	setWebhookURL(t, pool, "acme", endpoint.URL)
	recordEvent(t, pool, "acme", "order.paid", map[string]any{"id": "ord_1"})
	if _, err := newRelay(t, pool, goodConfig()).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, ev := range outbox(t, pool) {
		if ev.delivered || followed.Load() != 0 {
			t.Errorf("%s: delivered %v, redirect followed %d times; want neither", id, ev.delivered, followed.Load())
		}
	}
}

// TestWebhookURLsAreLoggedWithoutTheirQuery: a receiver may keep a token
// in its URL's query; a failed delivery's log line names the endpoint
// without it.
func TestWebhookURLsAreLoggedWithoutTheirQuery(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	setWebhookURL(t, pool, "acme", gone.URL+"/hook?token=s3cr3t#s3cr3t")
	recordEvent(t, pool, "acme", "order.paid", map[string]any{"id": "ord_1"})
	var logs strings.Builder
	r, err := events.NewRelay(goodConfig(), pool, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "posting to "+gone.URL+"/hook") || strings.Contains(logs.String(), "s3cr3t") {
		t.Errorf("the relay logged:\n%s\nwant the failure, naming the endpoint without its query", logs.String())
	}
}
