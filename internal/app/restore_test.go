package app

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

// A database restored from a backup forgets everything after the backup,
// but the processor does not. The downstream key is what keeps the two
// apart, and this test restores a real backup under a running service to
// show it:
//
//   - an operation that was in flight when the backup was taken, and
//     finished after it, is in flight again once restored; its retry
//     resumes it and sends the processor the same downstream key it sent
//     before, so the processor replays its answer: one effect;
//   - an operation started after the restore never sends a downstream key
//     the processor has already seen, so it is never taken for an earlier
//     one (the processor would replay that one's answer, and our record
//     would claim an effect that never happened).
//
// The backup is pg_dump's, restored with pg_restore into a new database;
// the processor runs as its own process throughout, as a real one would.
func TestNoDownstreamKeyReuseAfterARestore(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"pg_dump", "pg_restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := fmt.Sprintf("this test backs a database up and restores it: it needs %s (PostgreSQL's client tools)", tool)
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	ctx := context.Background()
	processorURL := startProcessorProcess(t)
	ledgerKeys := func() map[string]int {
		entries, err := fakeprocessor.FetchLedger(ctx, processorURL)
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]int{}
		for _, e := range entries {
			keys[e.IdempotencyKey]++
		}
		return keys
	}
	env := []string{"PROCESSOR_URL=" + processorURL, "RECONCILER_ENABLED=false"}
	dbURL := testdb.New(t)
	before := startServerProcess(t, dbURL, env...)
	before.db = testdb.Pool(t, dbURL)

	// Before the backup: one charge done, and one in flight (the flaky card
	// failed once: the charge exists with its downstream key, the record
	// waits at charge_created).
	done := before.newOrder(t, "sk_test_acme", 1100)
	if res := before.do(t, chargeRequest(done.ID, "before-backup", "pm_card_visa")); res.Status != http.StatusCreated {
		t.Fatalf("charge before the backup: %d %s", res.Status, res.Body)
	}
	inFlight := before.newOrder(t, "sk_test_acme", 1200)
	before.do(t, chargeRequest(inFlight.ID, "in-flight", "pm_card_flaky")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	var inFlightKey string
	if err := before.db.QueryRow(ctx, `SELECT downstream_key FROM charges WHERE order_id = $1`, inFlight.ID).Scan(&inFlightKey); err != nil {
		t.Fatal(err)
	}

	backup := filepath.Join(t.TempDir(), "backup.dump")
	if out, err := exec.Command("pg_dump", "--format=custom", "--file="+backup, dbURL).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}

	// After the backup: the in-flight charge finishes (the flaky card's
	// second failure, then its success), and a new order is charged.
	before.do(t, chargeRequest(inFlight.ID, "in-flight", "pm_card_flaky")).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	if res := before.do(t, chargeRequest(inFlight.ID, "in-flight", "pm_card_flaky")); res.Status != http.StatusCreated {
		t.Fatalf("the in-flight charge, after the backup: %d %s", res.Status, res.Body)
	}
	lost := before.newOrder(t, "sk_test_acme", 1300)
	if res := before.do(t, chargeRequest(lost.ID, "after-backup", "pm_card_visa")); res.Status != http.StatusCreated {
		t.Fatalf("charge after the backup: %d %s", res.Status, res.Body)
	}
	if err := before.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = before.cmd.Wait()
	seen := ledgerKeys()
	if seen[inFlightKey] != 1 || len(seen) != 3 {
		t.Fatalf("the processor's ledger before the restore: %v; want three charges, one under %s", seen, inFlightKey)
	}

	// The restore: the backup, into a new database, and the service
	// started again on it.
	restoredURL := restoreInto(t, backup)
	after := startServerProcess(t, restoredURL, env...)
	after.db = testdb.Pool(t, restoredURL)
	var status string
	if err := after.db.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE key = 'in-flight'`).Scan(&status); err != nil || status != "in_progress" {
		t.Fatalf("the restored record of the in-flight charge is %q (%v); want in_progress, as at the backup", status, err)
	}

	// The in-flight charge's retry resumes it, under the same downstream
	// key: the processor replays its charge.
	res := after.do(t, chargeRequest(inFlight.ID, "in-flight", "pm_card_flaky"))
	if res.Status != http.StatusCreated || res.Header.Get(outcomeHeader) != "resumed" {
		t.Fatalf("the in-flight charge's retry after the restore: %d %s %s; want a resumed 201", res.Status, res.Header.Get(outcomeHeader), res.Body)
	}
	var resumedKey string
	if err := after.db.QueryRow(ctx, `SELECT downstream_key FROM charges WHERE order_id = $1 AND status = 'succeeded'`, inFlight.ID).Scan(&resumedKey); err != nil {
		t.Fatal(err)
	}
	if resumedKey != inFlightKey {
		t.Errorf("the resumed charge sent %s; before the restore it sent %s", resumedKey, inFlightKey)
	}

	// New operations after the restore: charges, a refund, a payout. Not
	// one of their downstream keys is one the processor saw before.
	for i := range 5 {
		o := after.newOrder(t, "sk_test_acme", 1400+i)
		if res := after.do(t, chargeRequest(o.ID, fmt.Sprintf("after-restore-%d", i), "pm_card_visa")); res.Status != http.StatusCreated {
			t.Fatalf("charge after the restore: %d %s", res.Status, res.Body)
		}
	}
	var charge string
	if err := after.db.QueryRow(ctx, `SELECT id FROM charges WHERE order_id = $1`, done.ID).Scan(&charge); err != nil {
		t.Fatal(err)
	}
	if res := after.do(t, refundRequest(charge, "refund-after-restore", `{"amount":100}`)); res.Status != http.StatusCreated {
		t.Fatalf("refund after the restore: %d %s", res.Status, res.Body)
	}
	if res := after.do(t, payoutRequest("sk_test_acme", "payout-after-restore", `{"amount":100,"currency":"usd"}`)); res.Status != http.StatusAccepted {
		t.Fatalf("payout after the restore: %d %s", res.Status, res.Body)
	}
	rows, err := after.db.Query(ctx, `
		SELECT downstream_key FROM charges WHERE order_id <> ALL($1)
		UNION ALL SELECT downstream_key FROM refunds
		UNION ALL SELECT downstream_key FROM payouts`, []string{done.ID, inFlight.ID})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != 7 {
		t.Fatalf("%d downstream keys of operations after the restore; want 7", len(fresh))
	}
	for _, k := range fresh {
		if seen[k] > 0 {
			t.Errorf("an operation after the restore sent %s, a downstream key the processor saw before it", k)
		}
	}
	waitFor(t, 30*time.Second, "the payout's transfer at the processor", func() bool { return len(ledgerKeys()) == len(seen)+len(fresh) })
	for k, n := range ledgerKeys() {
		if n != 1 {
			t.Errorf("the processor made %d effects under %s; want 1", n, k)
		}
	}
}

// restoreInto restores the pg_dump backup into a new database of the
// tests' PostgreSQL, dropped when t ends, and returns its URL.
func restoreInto(t *testing.T, backup string) string {
	t.Helper()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		admin = testdb.DefaultURL
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("restored_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	if out, err := exec.Command("pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--dbname="+u.String(), backup).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	return u.String()
}
