package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/testdb"
)

// These tests run the real server binary as separate processes sharing one
// database: the guarantees must hold across replicas, and a crash is a real
// SIGKILL, not a simulated one.

var (
	buildOnce   sync.Once
	binary      string
	buildErr    error
	buildOutput []byte
)

// serverBinary builds cmd/server once per test run.
func serverBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "payments-server-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "server")
		buildOutput, buildErr = exec.Command("go", "build", "-o", binary, "github.com/retrysafe/payments/cmd/server").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build cmd/server: %v\n%s", buildErr, buildOutput)
	}
	return binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// serverProcess is one running server process.
type serverProcess struct {
	*testServer
	cmd *exec.Cmd
}

// startServerProcess starts the server binary on dbURL, listening on a free
// port, and waits until it says where.
func startServerProcess(t *testing.T, dbURL string, env ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(serverBinary(t))
	cmd.Env = append(os.Environ(), append([]string{"DATABASE_URL=" + dbURL, "HTTP_ADDR=127.0.0.1:0"}, env...)...)
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
	addr := make(chan string, 1)
	go func() {
		// Read the log until the "listening" line, then keep draining it so
		// the process never blocks on a full pipe.
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("server process exited before listening")
		}
		return &serverProcess{testServer: &testServer{URL: "http://" + a}, cmd: cmd}
	case <-time.After(30 * time.Second):
		t.Fatal("server process did not start listening within 30s")
	}
	return nil
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
// request is inside the effect transaction (key claimed, order insert
// waiting on a lock, nothing committed), then retries with the same key
// against another server process: once the dead owner's lease expires the
// retry takes over and the order is created exactly once.
func TestKilledMidEffectIsRecoveredOnce(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	const lease = "2s"
	doomed := startServerProcess(t, dbURL, "IDEMPOTENCY_LEASE="+lease, "PROCESSOR_TIMEOUT=1s")
	survivor := startServerProcess(t, dbURL, "IDEMPOTENCY_LEASE="+lease, "PROCESSOR_TIMEOUT=1s")
	db := testdb.Pool(t, dbURL)
	doomed.db, survivor.db = db, db

	release := doomed.blockOrderInserts(t)
	go func() { _, _ = doomed.send(t, context.Background(), ordersRequest("killed", teaOrder)) }()
	doomed.waitForBlockedOrderInsert(t, 1)
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = doomed.cmd.Wait()
	release()

	// The client retries with the same key, honouring Retry-After, as the
	// contract tells it to; the dead owner's lease runs out on the way.
	var res response
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 1; ; attempt++ {
		res = survivor.createOrder(t, "killed", teaOrder)
		if res.Status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		wait, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		time.Sleep(time.Duration(wait) * time.Second)
	}
	if res.Status != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the crash: %d %s; want the takeover's fresh 201", res.Status, res.Body)
	}
	var attempt int
	if err := db.QueryRow(context.Background(), `SELECT attempt FROM idempotency_keys WHERE key = 'killed' AND status = 'completed'`).Scan(&attempt); err != nil || attempt != 2 {
		t.Errorf("record attempt %d (%v); want completed at attempt 2", attempt, err)
	}
	if n := survivor.count(t, "orders"); n != 1 {
		t.Fatalf("%d orders; want exactly 1", n)
	}
	if replay := survivor.createOrder(t, "killed", teaOrder); string(replay.Body) != string(res.Body) {
		t.Errorf("replay differs: %s vs %s", replay.Body, res.Body)
	}
}
