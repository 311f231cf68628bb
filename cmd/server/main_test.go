package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/testdb"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestRunRejectsInvalidConfiguration(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), nil, env(map[string]string{
		"IDEMPOTENCY_LEASE":         "soon",
		"IDEMPOTENCY_KEY_RETENTION": "-1h",
		"MAX_BODY_BYTES":            "lots",
		"SEED_DEMO_CALLERS":         "maybe",
	}), io.Discard)
	if err == nil {
		t.Fatal("run accepted an invalid configuration")
	}
	for _, name := range []string{"IDEMPOTENCY_LEASE", "IDEMPOTENCY_KEY_RETENTION", "MAX_BODY_BYTES", "SEED_DEMO_CALLERS"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s:\n%v", name, err)
		}
	}
	err = run(context.Background(), nil, env(map[string]string{"IDEMPOTENCY_LEASE": "48h"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "must be longer than IDEMPOTENCY_LEASE") {
		t.Errorf("a lease longer than the retention window: %v", err)
	}
	if err := run(context.Background(), []string{"explode"}, env(nil), io.Discard); err == nil {
		t.Error("run accepted an unknown command")
	}
}

func TestRunExplainsMissingPostgres(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), nil, env(map[string]string{
		"DATABASE_URL": "postgres://postgres@127.0.0.1:1/payments?sslmode=disable&connect_timeout=2",
	}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not answering") || !strings.Contains(err.Error(), "docker compose up") {
		t.Fatalf("unreachable database: %v; want an explanation of how to get one", err)
	}
}

func TestRunMigrateAndServe(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	if err := run(context.Background(), []string{"migrate"}, env(map[string]string{"DATABASE_URL": dbURL}), io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	ctx, stop := context.WithCancel(context.Background())
	logs, logWriter := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, env(map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0"}), logWriter)
		logWriter.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not listening after 30s")
	}

	for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml", "/"} {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, res.StatusCode)
		}
	}
	// The demo callers were seeded.
	req, _ := http.NewRequest("GET", base+"/v1/orders", nil)
	req.Header.Set("Authorization", "Bearer sk_test_globex")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("demo caller globex: %d", res.StatusCode)
	}

	stop() // what SIGINT/SIGTERM do in main
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("graceful shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after its context was canceled")
	}
}

func TestRunListsDeadLetters(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	vars := map[string]string{"DATABASE_URL": dbURL}
	if err := run(context.Background(), []string{"migrate"}, env(vars), io.Discard); err != nil {
		t.Fatal(err)
	}
	pool := testdb.Pool(t, dbURL)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, request_method, request_path, request_fingerprint)
		VALUES ('globex', 'given-up', 'dead', 'charge_created', 11, 'POST', '/v1/orders/ord_x/charges', '\x00'),
		       ('acme', 'fine', 'in_progress', 'started', 1, 'POST', '/v1/orders', '\x00')`)
	if err == nil {
		t.Fatal("an in-progress record without a lease was accepted") // the CHECK constraint
	}
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, request_method, request_path, request_fingerprint)
		VALUES ('globex', 'given-up', 'dead', 'charge_created', 11, 'POST', '/v1/orders/ord_x/charges', '\x00')`); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"dead-letters"}, env(vars), &out); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["key"] != nil {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 || lines[0]["caller"] != "globex" || lines[0]["key"] != "given-up" || lines[0]["recovery_point"] != "charge_created" {
		t.Errorf("dead letters %v; want the one dead globex record", lines)
	}
}
