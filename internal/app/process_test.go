package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests run the real server binary as separate processes sharing one
// database: the guarantees must hold across replicas, and a crash is a real
// SIGKILL, not a simulated one.

var (
	buildMu  sync.Mutex
	binDir   string
	binaries = map[string]string{}
)

// binary builds a command of this module once per test run and returns
// its path.
func binary(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if path, ok := binaries[pkg]; ok {
		return path
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "payments-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	path := filepath.Join(binDir, filepath.Base(pkg))
	if err := testdb.Build(binDir, pkg); err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	binaries[pkg] = path
	return path
}

func TestMain(m *testing.M) {
	code := m.Run()
	closeBrowser()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if leaks := secretsIn(suiteLogs.String()); len(leaks) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the test servers' logs (every level, every test of this package) contain secrets:\n%s\n", strings.Join(leaks, "\n"))
		code = 1
	}
	os.Exit(code)
}

// suiteLogs is everything every test server of this package logged.
var suiteLogs syncBuffer

// secretsIn lists what in logs looks like a secret: the demo API keys, a
// webhook signing secret, a card number.
func secretsIn(logs string) []string {
	var leaks []string
	for _, s := range []string{"sk_test_acme", "sk_test_globex", "whsec_"} {
		if strings.Contains(logs, s) {
			leaks = append(leaks, "contains "+s)
		}
	}
	// Trace and span ids are random hex, and one in two thousand span ids
	// is all decimal digits: they are not looked at.
	if m := cardNumber.FindString(traceIDs.ReplaceAllString(logs, "")); m != "" {
		leaks = append(leaks, "contains something like a card number: "+m)
	}
	return leaks
}

var (
	cardNumber = regexp.MustCompile(`\b\d{13,19}\b`)
	traceIDs   = regexp.MustCompile(`"(trace|span)_id":"[0-9a-f]{16,32}"|\b(trace|span)_id=[0-9a-f]{16,32}\b`)
)

// serverProcess is one running server process.
type serverProcess struct {
	*testServer
	cmd *exec.Cmd
}

// startProcess starts a command of this module with env added, and waits
// until it logs the address it listens on.
func startProcess(t testing.TB, pkg string, env ...string) (addr string, cmd *exec.Cmd) {
	t.Helper()
	return startCommand(t, pkg, nil, env...)
}

// startCommand is startProcess with arguments.
func startCommand(t testing.TB, pkg string, args []string, env ...string) (addr string, cmd *exec.Cmd) {
	t.Helper()
	cmd = exec.Command(binary(t, pkg), args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addrs := make(chan string, 1)
	go func() {
		// Read the log until the "listening" line, then keep draining it so
		// the process never blocks on a full pipe.
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			commandLogs.add(cmd, sc.Text())
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				select {
				case addrs <- line.Addr:
				default: // a restarted process says it again; the first is kept
				}
			}
		}
		close(addrs)
	}()
	select {
	case a, ok := <-addrs:
		if !ok {
			t.Fatalf("%s exited before listening", pkg)
		}
		return a, cmd
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start listening within 30s", pkg)
	}
	return "", nil
}

// commandLogs keeps every line each command started by startCommand has
// written, for the tests that read what an operator's terminal shows.
var commandLogs = &lineLog{lines: map[*exec.Cmd][]string{}}

type lineLog struct {
	mu    sync.Mutex
	lines map[*exec.Cmd][]string
}

func (l *lineLog) add(cmd *exec.Cmd, line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines[cmd] = append(l.lines[cmd], line)
}

func (l *lineLog) of(cmd *exec.Cmd) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines[cmd])
}

// processSecret is the webhook secret the processor and server processes
// of these tests share (startProcessorProcess, startServerProcess).
var processSecret = "whsec_" + rand.Text()

// startProcessorProcess starts the fake processor's binary, listening on a
// free port, and returns its URL.
func startProcessorProcess(t testing.TB, env ...string) string {
	t.Helper()
	addr, _ := startProcess(t, "cmd/processor", append([]string{"PROCESSOR_ADDR=127.0.0.1:0", "WEBHOOK_SECRET=" + processSecret}, env...)...)
	return "http://" + addr
}

// startServerProcess starts the server binary on dbURL, listening on a
// free port, with the demo callers (the tests' callers) and the secret of
// the processors startProcessorProcess starts.
func startServerProcess(t testing.TB, dbURL string, env ...string) *serverProcess {
	t.Helper()
	defaults := []string{"DATABASE_URL=" + dbURL, "HTTP_ADDR=127.0.0.1:0", "SEED_DEMO_CALLERS=true", "PROCESSOR_WEBHOOK_SECRET=" + processSecret}
	addr, cmd := startProcess(t, "cmd/server", append(defaults, env...)...)
	return &serverProcess{testServer: &testServer{URL: "http://" + addr}, cmd: cmd}
}

func TestIdenticalRequestsAcrossTwoServerProcesses(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	a := startServerProcess(t, dbURL)
	b := startServerProcess(t, dbURL)
	db := testdb.Pool(t, dbURL)
	a.db, b.db = db, db

	burstIdenticalRequests(t, "two-replicas", a.testServer, b.testServer)
}

// TestKilledMidEffectIsRecoveredOnce kills a server with SIGKILL while its
// order create is inside its one transaction (order insert waiting on a
// lock, nothing committed), then retries with the same key against another
// server process. The crash left nothing behind, so the retry runs the
// operation afresh, at once: no lease to wait out, and one order.
func TestKilledMidEffectIsRecoveredOnce(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	doomed := startServerProcess(t, dbURL, "PROCESSOR_TIMEOUT=1s", "RECONCILER_ENABLED=false")
	survivor := startServerProcess(t, dbURL, "PROCESSOR_TIMEOUT=1s", "RECONCILER_ENABLED=false")
	db := testdb.Pool(t, dbURL)
	doomed.db, survivor.db = db, db

	release := doomed.blockInserts(t, "orders")
	go func() { _, _ = doomed.send(t, context.Background(), ordersRequest("killed", teaOrder)) }()
	doomed.waitForBlockedInserts(t, "orders", 1)
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = doomed.cmd.Wait()
	release()

	retried, result, err := retryingClient(t, survivor.URL).CreateOrder(context.Background(),
		apiclient.CreateOrderRequest{Amount: 1999, Currency: "usd", Description: ptr("Tea")}, client.WithIdempotencyKey("killed"))
	if err != nil || result.Replayed {
		t.Fatalf("retry after the crash: %+v, %v; want a fresh 201", result, err)
	}
	res := survivor.createOrder(t, "killed", teaOrder) // the stored answer, replayed
	if res.Status != http.StatusCreated || !strings.Contains(string(res.Body), retried.Id) {
		t.Fatalf("replay: %d %s", res.Status, res.Body)
	}
	if status := keyStatus(t, db, "killed"); status != "completed" {
		t.Errorf("record %s; want completed", status)
	}
	if n := survivor.count(t, "orders"); n != 1 {
		t.Fatalf("%d orders; want exactly 1", n)
	}
}

// TestChargeCrashAtEveryPhaseBoundary kills the server (a real SIGKILL, at
// a named crash point) at each boundary of a charge, with the processor
// running as its own process so it outlives the crash, and restarts it.
// Then either the client retries with the same key, or nobody does and the
// reconciler alone must finish the charge. Either way: the processor's
// ledger shows exactly one effect for the downstream key, the order is
// paid once, and the stored answer replays byte for byte.
func TestChargeCrashAtEveryPhaseBoundary(t *testing.T) {
	t.Parallel()
	for _, point := range CrashPointNames {
		for _, finisher := range []string{"client retry", "reconciler alone"} {
			t.Run(point+"/"+finisher, func(t *testing.T) {
				t.Parallel()
				crashAndRecover(t, point, finisher == "reconciler alone")
			})
		}
	}
}

// retryingClient is the project's client, patient enough to outlast a dead
// owner's lease.
func retryingClient(t testing.TB, baseURL string) *client.Client {
	t.Helper()
	c, err := client.New(baseURL, "sk_test_acme", client.Policy{MaxAttempts: 20, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func crashAndRecover(t *testing.T, point string, reconcilerAlone bool) {
	processorURL := startProcessorProcess(t)
	dbURL := testdb.New(t)
	db := testdb.Pool(t, dbURL)
	common := []string{"PROCESSOR_URL=" + processorURL, "IDEMPOTENCY_LEASE=2s", "PROCESSOR_TIMEOUT=1s"}

	doomed := startServerProcess(t, dbURL, append(common, "FAULT_CRASH_POINTS="+point, "RECONCILER_ENABLED=false")...)
	doomed.db, doomed.processorURL = db, processorURL
	o := doomed.newOrder(t, "sk_test_acme", 2500)
	key := "crash-" + point
	if _, err := doomed.send(t, context.Background(), chargeRequest(o.ID, key, "pm_card_visa")); err == nil {
		t.Fatal("the request got an answer; the server should have died at the crash point")
	}
	if err := doomed.cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("server exit: %v; want killed", err)
	}

	var res response
	var restarted *serverProcess
	if reconcilerAlone {
		restarted = startServerProcess(t, dbURL, append(common, "RECONCILER_INTERVAL=100ms")...)
		restarted.db, restarted.processorURL = db, processorURL
		// Nobody retries: wait for the reconciler to complete the record.
		waitFor(t, 20*time.Second, "the reconciler completes the charge", func() bool { return keyStatus(t, db, key) == "completed" })
		// The client comes back later and gets the stored answer.
		res = restarted.do(t, chargeRequest(o.ID, key, "pm_card_visa"))
		if res.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the reconciler's result should replay: %d %v", res.Status, res.Header)
		}
	} else {
		restarted = startServerProcess(t, dbURL, append(common, "RECONCILER_ENABLED=false")...)
		restarted.db, restarted.processorURL = db, processorURL
		// The project's client retries with the same key, waiting as told
		// while the dead owner's lease runs out.
		if _, _, err := retryingClient(t, restarted.URL).Charge(context.Background(), o.ID, apiclient.PmCardVisa, client.WithIdempotencyKey(key)); err != nil {
			t.Fatalf("the client's retry after the crash: %v", err)
		}
		res = restarted.do(t, chargeRequest(o.ID, key, "pm_card_visa"))
	}
	if res.Status != http.StatusCreated {
		t.Fatalf("after the crash at %s: %d %s", point, res.Status, res.Body)
	}
	var downstream string
	if err := db.QueryRow(context.Background(), `SELECT downstream_key FROM charges WHERE order_id = $1 AND status = 'succeeded'`, o.ID).Scan(&downstream); err != nil {
		t.Fatal(err)
	}
	effects := restarted.effects(t)
	if len(effects) != 1 || effects[0].IdempotencyKey != downstream {
		t.Fatalf("processor ledger %+v; want exactly one effect, under %s", effects, downstream)
	}
	if s := restarted.orderStatus(t, o.ID); s != "paid" {
		t.Errorf("order is %s; want paid", s)
	}
	if replay := restarted.do(t, chargeRequest(o.ID, key, "pm_card_visa")); !bytes.Equal(replay.Body, res.Body) {
		t.Errorf("replay differs: %s vs %s", replay.Body, res.Body)
	}
}

// TestKilledPayoutJobIsRescuedByRiver runs three replicas on one database,
// with the processor as its own process: api serves the API but runs no
// jobs (PAYOUT_WORKERS=0), worker runs the payout job and is killed
// (SIGKILL, at the crash point) right after the processor started the
// transfer, before anything of its answer is recorded. A fresh replica's
// River rescues the abandoned job and runs it again: its call under the
// same downstream key replays the processor's first answer, so the
// processor's ledger shows one transfer, and the payout is paid once. The
// project's client polls it to the end, honouring Retry-After.
func TestKilledPayoutJobIsRescuedByRiver(t *testing.T) {
	t.Parallel()
	processorURL := startProcessorProcess(t, "PROCESSOR_PAYOUT_DELAY=500ms")
	dbURL := testdb.New(t)
	db := testdb.Pool(t, dbURL)
	// A job is rescued once it has been running for PAYOUT_RESCUE_AFTER,
	// which must exceed its timeout (PROCESSOR_TIMEOUT + 5s).
	common := []string{"PROCESSOR_URL=" + processorURL, "PROCESSOR_TIMEOUT=1s", "PAYOUT_RESCUE_AFTER=7s"}

	api := startServerProcess(t, dbURL, append(common, "PAYOUT_WORKERS=0")...)
	api.db, api.processorURL = db, processorURL
	api.fund(t, "sk_test_acme", 4000)
	worker := startServerProcess(t, dbURL, append(common, "FAULT_CRASH_POINTS="+AfterProcessorCall)...)

	c := retryingClient(t, api.URL)
	accepted, _, err := c.Payout(context.Background(), apiclient.CreatePayoutRequest{Amount: 2500, Currency: "usd"}, client.WithIdempotencyKey("payout-killed"))
	if err != nil || accepted.Status != apiclient.PayoutStatusPending {
		t.Fatalf("payout: %+v, %v", accepted, err)
	}
	if err := worker.cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("worker exit: %v; want killed at the crash point", err)
	}
	// The processor acted; we recorded nothing of it.
	if tr := api.payoutTransfers(t); len(tr) != 1 {
		t.Fatalf("processor payouts %+v; want the one transfer the dead worker started", tr)
	}
	if po, _, err := c.GetPayout(context.Background(), accepted.Id); err != nil || po.Status != apiclient.PayoutStatusPending {
		t.Fatalf("payout after the crash: %+v, %v; want still pending", po, err)
	}

	startServerProcess(t, dbURL, common...) // the replica whose River rescues the job
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var seen []apiclient.PayoutStatus
	final, err := c.WaitForPayout(ctx, accepted.Id, func(po apiclient.Payout) { seen = append(seen, po.Status) })
	if err != nil || final.Status != apiclient.PayoutStatusPaid {
		t.Fatalf("payout %+v (%v), seen %v; want paid", final, err, seen)
	}
	transfers := api.payoutTransfers(t)
	if key := api.payoutDownstreamKey(t, accepted.Id); len(transfers) != 1 || transfers[0].IdempotencyKey != key || transfers[0].Status != "paid" {
		t.Fatalf("processor payouts %+v; want exactly one, paid, under %s", transfers, key)
	}
	// Runs as River fetched them: attempt would not do, as a snooze (in
	// transit) takes its run back from it.
	var runs int
	if err := db.QueryRow(context.Background(), `SELECT cardinality(attempted_by) FROM river.river_job WHERE kind = 'payout'`).Scan(&runs); err != nil || runs < 2 {
		t.Errorf("job runs %d (%v); want the dead run and the rescue", runs, err)
	}
	b, err := c.Balance(context.Background())
	if err != nil || len(b.Available) != 1 || b.Available[0].Amount != 1500 || b.Pending[0].Amount != 0 {
		t.Errorf("balance %+v (%v); want 1500 available, nothing pending", b, err)
	}
	if n := api.countEvents(t, "payout.paid"); n != 1 {
		t.Errorf("%d payout.paid events; want 1", n)
	}
}

func ptr[T any](v T) *T { return &v }
