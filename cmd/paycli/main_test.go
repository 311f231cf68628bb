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

// noEnv is a getenv with nothing set.
func noEnv(string) string { return "" }

// runCLI runs paycli with args and no environment.
func runCLI(args ...string) (stdout, stderr string, err error) {
	var o, e strings.Builder
	err = run(context.Background(), args, noEnv, &o, &e)
	return o.String(), e.String(), err
}

// Every spelling of help succeeds and lists the six commands, with a
// description each, and the common flags.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"-help"}, {"help"}} {
		stdout, stderr, err := runCLI(args...)
		if err != nil {
			t.Errorf("%v: %v", args, err)
		}
		if stderr != "" {
			t.Errorf("%v wrote to stderr:\n%s", args, stderr)
		}
		for _, want := range []string{
			"order     create an order",
			"charge    charge an order",
			"refund    refund a charge",
			"payout    pay out from the balance",
			"balance   show the balance",
			"key       show what the API recorded",
			"--url", "--api-key", "--idempotency-key", "-v ",
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%v: no %q in:\n%s", args, want, stdout)
			}
		}
	}
}

// With no arguments paycli fails, with the usage on stderr.
func TestNoArguments(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := runCLI()
	if err == nil {
		t.Error("no error without a command")
	}
	if stdout != "" || !strings.Contains(stderr, "Commands:") || !strings.Contains(stderr, "refund") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

// Help never shows an API key taken from the environment.
func TestHelpHidesTheEnvironment(t *testing.T) {
	t.Parallel()
	getenv := func(k string) string { return map[string]string{"PAYMENTS_API_KEY": "sk_live_secret"}[k] }
	for _, args := range [][]string{{"--help"}, {"order", "--help"}} {
		var out strings.Builder
		if err := run(context.Background(), args, getenv, &out, &out); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "sk_live_secret") {
			t.Errorf("%v printed the API key from the environment:\n%s", args, out.String())
		}
	}
}

// A command's help lists its own flags and the common ones, not another
// command's.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	common := []string{"--url", "--api-key", "--idempotency-key", "-v "}
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"refund", "--help"}, []string{"--charge", "--amount"}, []string{"--payment-method", "--description", "--currency", "--order", "--key "}},
		{[]string{"refund", "-h"}, []string{"--charge", "--amount"}, []string{"--payment-method", "--description"}},
		{[]string{"help", "charge"}, []string{"--order", "--payment-method"}, []string{"--amount", "--charge", "--description"}},
		{[]string{"charge", "-help"}, []string{"--order", "--payment-method"}, []string{"--amount", "--charge"}},
		{[]string{"order", "--help"}, []string{"--amount", "--currency", "--description"}, []string{"--charge", "--payment-method", "--order"}},
		{[]string{"key", "--help"}, []string{"--key "}, []string{"--amount", "--order", "--charge"}},
	} {
		stdout, stderr, err := runCLI(tc.args...)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
		if stderr != "" {
			t.Errorf("%v wrote to stderr:\n%s", tc.args, stderr)
		}
		for _, want := range append(tc.want, common...) {
			if !strings.Contains(stdout, want) {
				t.Errorf("%v: no %q in:\n%s", tc.args, want, stdout)
			}
		}
		for _, not := range tc.not {
			if strings.Contains(stdout, not) {
				t.Errorf("%v: %q in:\n%s", tc.args, not, stdout)
			}
		}
	}
}

// Mistakes fail before any request, with a hint naming the help to read.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		hint string
	}{
		{[]string{"explode"}, "paycli --help"},
		{[]string{"help", "explode"}, "paycli --help"},
		{[]string{"--url", "http://x", "order"}, "paycli --help"},
		{[]string{"refund", "--payment-method", "pm_card_visa"}, "paycli refund --help"},
		{[]string{"order", "--amount", "ten"}, "paycli order --help"},
		{[]string{"charge", "ord_1"}, "paycli charge --help"},
		{[]string{"key"}, "paycli key --help"},
	} {
		stdout, _, err := runCLI(tc.args...)
		if err == nil {
			t.Errorf("%v: no error", tc.args)
			continue
		}
		if !strings.Contains(err.Error(), tc.hint) {
			t.Errorf("%v: %q, want a hint %q", tc.args, err, tc.hint)
		}
		if stdout != "" {
			t.Errorf("%v wrote to stdout:\n%s", tc.args, stdout)
		}
	}
}

// key looks up the key given by --key, or by the common --idempotency-key.
func TestKey(t *testing.T) {
	t.Parallel()
	paths := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"key":"k1"}`))
	}))
	t.Cleanup(srv.Close)
	for _, flag := range []string{"--key", "--idempotency-key"} {
		stdout, stderr, err := runCLI("key", "--url", srv.URL, flag, "k1")
		if err != nil {
			t.Fatalf("%s: %v\n%s", flag, err, stderr)
		}
		if p := <-paths; !strings.HasSuffix(p, "/k1") {
			t.Errorf("%s: requested %s", flag, p)
		}
		if !strings.Contains(stdout, `"key": "k1"`) {
			t.Errorf("%s: stdout:\n%s", flag, stdout)
		}
	}
}
