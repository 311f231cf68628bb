package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/testdb"
)

// sweeper --once against a database with expired keys leaves exactly the
// right rows, and reports what it did.
func TestOnceLeavesExactlyTheRightRows(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	pool := testdb.Pool(t, dbURL)
	ctx := context.Background()
	if err := auth.SeedDemoCallers(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, locked_until, operation, request_method, request_path,
		                              request_fingerprint, response_status, response_headers, response_body, created_at) VALUES
		  ('acme', 'old-done', 'completed', 'finished', NULL, 'createOrder', 'POST', '/v1/orders', '\x00', 201, '{}', '\x7b7d', now() - interval '2 hours'),
		  ('acme', 'new-done', 'completed', 'finished', NULL, 'createOrder', 'POST', '/v1/orders', '\x00', 201, '{}', '\x7b7d', now()),
		  ('acme', 'old-open', 'in_progress', 'started', now(), 'createOrder', 'POST', '/v1/orders', '\x00', NULL, NULL, NULL, now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	metrics := filepath.Join(t.TempDir(), "sweeper.prom")
	var log strings.Builder
	// The server would refuse PROCESSOR_TIMEOUT and HTTP_WRITE_TIMEOUT
	// here (both against its lease); the sweeper reads neither.
	env := map[string]string{"DATABASE_URL": dbURL, "IDEMPOTENCY_KEY_RETENTION": "90m", "PROCESSOR_TIMEOUT": "1h", "HTTP_WRITE_TIMEOUT": "1s"}
	if err := run(ctx, []string{"--once", "--batch", "1", "--metrics-file", metrics}, func(k string) string { return env[k] }, &log); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT key FROM idempotency_keys ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var k string
		rows.Scan(&k)
		left = append(left, k)
	}
	if strings.Join(left, ",") != "new-done,old-open" {
		t.Errorf("left %v; want the recent record and the in-progress one", left)
	}
	if !strings.Contains(log.String(), `"deleted_idempotency_keys":1`) || !strings.Contains(log.String(), `"stale_in_progress":1`) {
		t.Errorf("log does not report the sweep:\n%s", log.String())
	}
	b, err := os.ReadFile(metrics)
	if err != nil || !strings.Contains(string(b), `payments_sweeper_deleted_rows{table="idempotency_keys"} 1`) {
		t.Errorf("metrics file: %v\n%s", err, b)
	}
}

// The sweeper holds the retention window to the server's rules: a window
// no longer than the lease would forget operations that may still run.
func TestRetentionIsChecked(t *testing.T) {
	t.Parallel()
	env := map[string]string{"IDEMPOTENCY_KEY_RETENTION": "1m", "IDEMPOTENCY_LEASE": "2m"}
	err := run(context.Background(), []string{"--once"}, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_KEY_RETENTION") {
		t.Errorf("a window shorter than the lease: %v; want it refused", err)
	}
}

func TestFlagsAreChecked(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"--once", "--interval", "1m"}, {"--once", "--batch", "0"}} {
		if err := run(context.Background(), args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("run(%q) accepted bad flags", args)
		}
	}
}

// The sweeper links only what it runs: no HTTP server, no request
// validation, no charges or processor. (A cron job that deletes rows should
// not carry the API's attack surface or its start-up rules.)
func TestSweeperLinksNoServerCode(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		for _, banned := range []string{"github.com/labstack/echo", "github.com/getkin/kin-openapi", "/internal/server", "/internal/charges", "/internal/fakeprocessor", "/internal/events"} {
			if strings.Contains(dep, banned) {
				t.Errorf("cmd/sweeper depends on %s", dep)
			}
		}
	}
}
