package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// The CLI retries a failing call through the client, with one key, and
// prints every attempt with -v.
func TestOrderSurvivesAFailure(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	keys := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if n.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"type":"x","title":"t","status":503,"code":"service_unavailable"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ord_1","amount":100,"currency":"usd","description":null,"status":"pending","created_at":"2026-11-29T20:00:00Z"}`))
	}))
	t.Cleanup(srv.Close)
	var stdout, stderr strings.Builder
	err := run(context.Background(), []string{"order", "--url", srv.URL, "--amount", "100", "-v"}, func(string) string { return "" }, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	first, second := <-keys, <-keys
	if first != second || first == "" {
		t.Errorf("keys %q and %q; want the same key on the retry", first, second)
	}
	if !strings.Contains(stdout.String(), `"id": "ord_1"`) || !strings.Contains(stderr.String(), "attempt 2") || !strings.Contains(stderr.String(), "status=503") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := run(context.Background(), []string{"explode"}, func(string) string { return "" }, &out, &out); err == nil {
		t.Error("accepted an unknown command")
	}
}
