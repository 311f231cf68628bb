package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/config"
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
	err = run(context.Background(), nil, env(map[string]string{"HTTP_WRITE_TIMEOUT": "20s"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "HTTP_WRITE_TIMEOUT") {
		t.Errorf("a write timeout shorter than the lease: %v", err)
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

	base, stop, done := startServer(t, map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0"})

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
	// By default (no DEMO_MODE, no SEED_DEMO_CALLERS) nothing published
	// works: the demo callers are not seeded, and their keys are refused.
	if status := getWithKey(t, base+"/v1/orders", "sk_test_globex"); status != http.StatusUnauthorized {
		t.Errorf("demo caller globex on a default server: %d; want 401", status)
	}
	// And the in-process processor's webhook secret is one made at
	// start-up, not the published one: a webhook signed with that is
	// refused, as a forgery.
	body := `{"id":"pevt_forged","type":"payout.failed","created":1,"data":{"id":"ppo_1","downstream_key":"acme-po_x","status":"failed","failure_code":"account_closed"}}`
	req, _ := http.NewRequest("POST", base+"/webhooks/processor", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Processor-Signature", cardprocessor.Sign([]byte(config.DemoProcessorWebhookSecret), time.Now(), []byte(body)))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(answer), "invalid_signature") {
		t.Errorf("a webhook signed with the published secret: %d %s; want 400 invalid_signature", res.StatusCode, answer)
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

// getWithKey GETs url with apiKey and returns the status.
func getWithKey(t *testing.T, url, apiKey string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// The demo callers are seeded when asked for (as the tests and the soak
// do), or in DEMO_MODE; then their keys work.
func TestDemoCallersWhenAskedFor(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	var logs syncBuffer
	base, _, _ := startServer(t, map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "SEED_DEMO_CALLERS": "true"}, &logs)
	if status := getWithKey(t, base+"/v1/orders", "sk_test_globex"); status != http.StatusOK {
		t.Errorf("demo caller globex with SEED_DEMO_CALLERS=true: %d", status)
	}
	// Outside the demo, each start says the published keys work.
	if !strings.Contains(logs.String(), "SEED_DEMO_CALLERS is on outside the demo") {
		t.Errorf("no warning at start-up; the server logged:\n%s", logs.String())
	}
	// A default server later, on the same database: the keys are in the
	// table, and still refused.
	base, _, _ = startServer(t, map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0"})
	if status := getWithKey(t, base+"/v1/orders", "sk_test_globex"); status != http.StatusUnauthorized {
		t.Errorf("demo caller globex on a default server after a demo: %d; want 401", status)
	}
}

// A real deployment's callers are made with `server callers add`, which
// prints a fresh key once; the key works, and only its hash is stored.
func TestCallersAddAndList(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	vars := map[string]string{"DATABASE_URL": dbURL}
	var out strings.Builder
	if err := run(context.Background(), []string{"callers", "add", "initech", "--name", "Initech", "--webhook-url", "https://93.184.216.34/hook?token=s3cr3t"}, env(vars), &out); err != nil {
		t.Fatal(err)
	}
	key := ""
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "sk_live_") {
			key = strings.TrimSpace(line)
		}
	}
	if len(key) < 40 {
		t.Fatalf("no API key printed:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"callers", "add", "initech"}, env(vars), io.Discard); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("adding initech twice: %v; want it refused", err)
	}
	if err := run(context.Background(), []string{"callers", "add", "Bad Name"}, env(vars), io.Discard); err == nil {
		t.Error("a caller id with a space and capitals was accepted")
	}
	out.Reset()
	if err := run(context.Background(), []string{"callers", "list"}, env(vars), &out); err != nil {
		t.Fatal(err)
	}
	// The webhook URL is shown without its query, where a receiver may keep a token.
	if !strings.Contains(out.String(), "initech") || strings.Contains(out.String(), key) ||
		!strings.Contains(out.String(), "https://93.184.216.34/hook") || strings.Contains(out.String(), "s3cr3t") {
		t.Errorf("callers list:\n%s\nwant initech and its endpoint listed, and never its key or the endpoint's token", out.String())
	}
	var stored []byte
	if err := testdb.Pool(t, dbURL).QueryRow(context.Background(), `SELECT api_key_hash FROM callers WHERE id = 'initech'`).Scan(&stored); err != nil || strings.Contains(string(stored), key) {
		t.Fatalf("stored %q, %v: want only a hash", stored, err)
	}
	base, _, _ := startServer(t, map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0"})
	if status := getWithKey(t, base+"/v1/orders", key); status != http.StatusOK {
		t.Errorf("the new key: %d; want 200", status)
	}
}

// startServer runs the server with vars as its environment until stop is
// called; done receives what run returned.
func startServer(t *testing.T, vars map[string]string, logs ...io.Writer) (base string, stop func(), done <-chan error) {
	t.Helper()
	var copyTo io.Writer = io.Discard // where the server's log lines are copied
	if len(logs) > 0 {
		copyTo = logs[0]
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	logged, logWriter := io.Pipe()
	result := make(chan error, 1)
	go func() {
		result <- run(ctx, nil, env(vars), logWriter)
		logWriter.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logged)
		for sc.Scan() {
			fmt.Fprintln(copyTo, sc.Text())
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a, stop, result
	case err := <-result:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not listening after 30s")
	}
	return "", nil, nil
}

// A client that sends its headers and then trickles its body, one byte at a
// time, is cut off by the read timeout, whether or not it has credentials:
// it never holds its connection for ever. With credentials the body is read
// and the answer is a 408; without, the answer (401) comes at once, and the
// connection is closed once the rest of the body fails to arrive in time.
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	base, _, _ := startServer(t, map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "SEED_DEMO_CALLERS": "true",
		"HTTP_READ_HEADER_TIMEOUT": "1s", "HTTP_READ_TIMEOUT": "1s",
	})
	for auth, want := range map[string]string{
		"Authorization: Bearer sk_test_acme\r\n": "request_timeout",
		"":                                       "unauthorized",
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\n%sIdempotency-Key: trickle\r\n"+
			"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", auth)
		// Trickle until the server hangs up (bounded, so a server that
		// never does fails the test instead of hanging it).
		go func() {
			for range 300 {
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		conn.SetReadDeadline(time.Now().Add(25 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("auth %q: no answer to a trickled body: %v", auth, err)
		}
		body, _ := io.ReadAll(res.Body)
		if !strings.Contains(string(body), `"code":"`+want+`"`) {
			t.Errorf("auth %q: %d %s; want %s", auth, res.StatusCode, body, want)
		}
		// Closed: an EOF, or a reset when the trickle's next byte reached
		// the closed socket before this read did (TCP's answer to data
		// sent to a socket that has been closed).
		if _, err := io.ReadAll(conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("auth %q: the connection was not closed: %v", auth, err)
		}
	}
}

// An idle keep-alive connection is closed after the idle timeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	base, _, _ := startServer(t, map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "HTTP_IDLE_TIMEOUT": "1s",
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(conn)
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusOK || res.Close {
		t.Fatalf("healthz: %d, close %v; want 200 on a kept-alive connection", res.StatusCode, res.Close)
	}
	// Send nothing more: the server must hang up (EOF), well before the
	// read deadline that keeps a broken server from hanging the test.
	conn.SetReadDeadline(time.Now().Add(25 * time.Second))
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %d bytes, %v; want the server to close it (EOF)", n, err)
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
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path, request_fingerprint)
		VALUES ('globex', 'given-up', 'dead', 'charge_created', 11, 'createCharge', 'POST', '/v1/orders/ord_x/charges', '\x00'),
		       ('acme', 'fine', 'in_progress', 'started', 1, 'createOrder', 'POST', '/v1/orders', '\x00')`)
	if err == nil {
		t.Fatal("an in-progress record without a lease was accepted") // the CHECK constraint
	}
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path, request_fingerprint)
		VALUES ('globex', 'given-up', 'dead', 'charge_created', 11, 'createCharge', 'POST', '/v1/orders/ord_x/charges', '\x00')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO processor_events (caller_id, event_id, type, contradiction)
		VALUES ('acme', 'pevt_contra', 'charge.succeeded', 'charge ch_x is recorded as failed but the processor reports succeeded'),
		       ('acme', 'pevt_fine', 'charge.succeeded', NULL)`); err != nil {
		t.Fatal(err)
	}
	// River's jobs: one it gave up on, one completed.
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO river.river_job (kind, args, state, attempt, max_attempts, finalized_at, queue, priority)
		VALUES ('payout', '{"caller_id":"acme","payout_id":"po_stuck"}', 'discarded', 200, 200, now(), 'default', 1),
		       ('payout', '{"caller_id":"acme","payout_id":"po_done"}', 'completed', 1, 200, now(), 'default', 1)`); err != nil {
		t.Fatal(err)
	}
	// One the job gave up on itself, with its reason.
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO river.river_job (kind, args, state, attempt, max_attempts, finalized_at, queue, priority, errors)
		VALUES ('payout', '{"caller_id":"globex","payout_id":"po_rejected"}', 'cancelled', 1, 200, now(), 'default', 1,
		        ARRAY['{"at":"2026-01-01T00:00:00Z","attempt":1,"error":"processor rejected the downstream key (422 idempotency_key_reused)"}'::jsonb])`); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"dead-letters"}, env(vars), &out); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["kind"] != nil {
			lines = append(lines, m)
		}
	}
	var ops, events, jobs []map[string]any
	for _, l := range lines {
		switch l["kind"] {
		case "operation":
			ops = append(ops, l)
		case "processor_event":
			events = append(events, l)
		case "payout_job":
			jobs = append(jobs, l)
		}
	}
	if len(jobs) != 2 || jobs[0]["payout_id"] != "po_stuck" || jobs[0]["caller"] != "acme" || jobs[0]["attempts"] != float64(200) || jobs[0]["state"] != "discarded" {
		t.Errorf("payout jobs given up on %v; want the one River gave up on first", jobs)
	}
	if len(jobs) == 2 && (jobs[1]["payout_id"] != "po_rejected" || jobs[1]["state"] != "cancelled" || !strings.Contains(fmt.Sprint(jobs[1]["reason"]), "422")) {
		t.Errorf("the cancelled payout job %v; want it listed with its reason", jobs[1])
	}
	if len(ops) != 1 || ops[0]["caller"] != "globex" || ops[0]["key"] != "given-up" || ops[0]["recovery_point"] != "charge_created" {
		t.Errorf("dead operations %v; want the one dead globex record", ops)
	}
	if len(events) != 1 || events[0]["event_id"] != "pevt_contra" || events[0]["contradiction"] == nil {
		t.Errorf("set-aside processor events %v; want the one contradicting event", events)
	}
}

// The database's password is never printed, whichever way DATABASE_URL
// gives it: in the URL's user part, as a password query parameter, or as
// password= in pgx's key=value form; not at start-up, and not in the error
// that says the database is not answering.
func TestDatabasePasswordIsNeverPrinted(t *testing.T) {
	t.Parallel()
	c, err := pgconn.ParseConfig(testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	const secret = "S3cretPW-never-printed"
	forms := func(host string, port uint16) []string {
		return []string{
			fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable&connect_timeout=2", c.User, secret, host, port, c.Database),
			fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&connect_timeout=2&password=%s", c.User, host, port, c.Database, secret),
			fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=2", host, port, c.User, secret, c.Database),
		}
	}
	for _, dbURL := range forms(c.Host, c.Port) { // trust auth: the password is not needed, only given
		var out bytes.Buffer
		if err := run(context.Background(), []string{"migrate"}, env(map[string]string{"DATABASE_URL": dbURL}), &out); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if !strings.Contains(out.String(), "database migrated") || strings.Contains(out.String(), secret) {
			t.Errorf("%s: start-up printed\n%s\nwant the database named, without its password", dbURL, out.String())
		}
	}
	for _, dbURL := range forms("127.0.0.1", 1) { // nothing listens there
		var out bytes.Buffer
		err := run(context.Background(), []string{"migrate"}, env(map[string]string{"DATABASE_URL": dbURL}), &out)
		if err == nil || !strings.Contains(err.Error(), "not answering") || strings.Contains(err.Error()+out.String(), secret) {
			t.Errorf("%s: %v\n%s\nwant the database not answering, without its password", dbURL, err, out.String())
		}
	}
}

// syncBuffer is a bytes.Buffer that a server's log and a test may use at
// once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestTransferEncodingIsRefusedAndCloses: a request with both
// Transfer-Encoding and Content-Length (the request-smuggling pair) is a
// 400, and the connection closes, so the request pipelined behind it is
// never answered.
func TestTransferEncodingIsRefusedAndCloses(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	base, _, _ := startServer(t, map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0", "SEED_DEMO_CALLERS": "true",
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"amount":100,"currency":"usd"}`
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_acme\r\n"+
		"Idempotency-Key: smuggled\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"+
		"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"+
		"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", len(body)+10, len(body), body)
	conn.SetReadDeadline(time.Now().Add(25 * time.Second))
	r := bufio.NewReader(conn)
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusBadRequest || !res.Close || !strings.Contains(string(got), "Transfer-Encoding") {
		t.Errorf("TE+CL: %d, close %v, %s; want a 400 problem and Connection: close", res.StatusCode, res.Close, got)
	}
	if rest, err := io.ReadAll(r); len(rest) > 0 || err != nil {
		t.Errorf("after the refusal: %q, %v; want the connection closed, the pipelined request unanswered", rest, err)
	}
	// Nothing was created or claimed.
	var n int
	if err := testdb.Pool(t, dbURL).QueryRow(context.Background(), "SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM idempotency_keys)").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows, %v; want nothing written", n, err)
	}
}

// TestIdleConnectionsMakeRoom: with HTTP_MAX_CONNECTIONS=40, 40
// connections kept open with a request every 2 s, all from this machine's
// one address, hold every place; a newcomer from the same address is still
// answered within 5 s, since the connection idle longest is closed to make
// room. And the cap holds: of 60 connections each answered once, at most
// 40 stay open, or 10 with the default share of one address (a quarter).
func TestIdleConnectionsMakeRoom(t *testing.T) {
	t.Parallel()
	for perAddress, wantOpen := range map[string]int{"40": 40, "": 10} {
		t.Run("per_address="+perAddress, func(t *testing.T) {
			t.Parallel()
			base, _, _ := startServer(t, map[string]string{"DATABASE_URL": testdb.New(t), "HTTP_ADDR": "127.0.0.1:0",
				"HTTP_MAX_CONNECTIONS": "40", "HTTP_MAX_CONNECTIONS_PER_ADDRESS": perAddress})
			addr := strings.TrimPrefix(base, "http://")
			healthz := func(conn net.Conn) error {
				conn.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					return err
				}
				res, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err == nil {
					res.Body.Close()
				}
				return err
			}
			// The hoarders: each reconnects whenever its connection is closed.
			ctx, stop := context.WithCancel(context.Background())
			var hoarders sync.WaitGroup
			defer func() { stop(); hoarders.Wait() }()
			var answered sync.WaitGroup
			for range 40 {
				answered.Add(1)
				hoarders.Go(func() {
					first := true
					for ctx.Err() == nil {
						conn, err := net.Dial("tcp", addr)
						for err == nil && ctx.Err() == nil {
							if err = healthz(conn); err == nil && first {
								first = false
								answered.Done()
							}
							select {
							case <-ctx.Done():
							case <-time.After(2 * time.Second):
							}
						}
						if conn != nil {
							conn.Close()
						}
					}
				})
			}
			answered.Wait()
			start := time.Now()
			res, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/healthz")
			if err != nil {
				t.Fatalf("a newcomer while 40 connections are held: %v; want it answered within 5 s", err)
			}
			res.Body.Close()
			t.Logf("the newcomer was answered in %v", time.Since(start))
			stop()
			hoarders.Wait()

			conns := make([]net.Conn, 60)
			for i := range conns {
				conn, err := net.Dial("tcp", addr)
				if err == nil {
					err = healthz(conn)
				}
				if err != nil {
					t.Fatalf("connection %d: %v; want each answered", i, err)
				}
				defer conn.Close()
				conns[i] = conn
			}
			open := 0
			for _, conn := range conns {
				conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				if _, err := conn.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
					open++ // not closed by the server
				}
			}
			if open != wantOpen {
				t.Errorf("%d of 60 connections left open; want %d", open, wantOpen)
			}
		})
	}
}

// TestAWaitingNewcomerIsServedWhenASlotGoesIdle: with every slot busy
// (two connections with a body on its way), a newcomer waits; it is served
// as soon as one of them is answered and goes idle, not when one closes
// (the idle timeout, here an hour; a busy one is cut off after a minute).
// And a server stopped while a newcomer
// waits for room stops within its shutdown timeout.
func TestAWaitingNewcomerIsServedWhenASlotGoesIdle(t *testing.T) {
	t.Parallel()
	base, stop, done := startServer(t, map[string]string{"DATABASE_URL": testdb.New(t), "HTTP_ADDR": "127.0.0.1:0",
		"HTTP_MAX_CONNECTIONS": "2", "HTTP_MAX_CONNECTIONS_PER_ADDRESS": "2", "HTTP_IDLE_TIMEOUT": "1h",
		"HTTP_READ_TIMEOUT": "1m", "HTTP_WRITE_TIMEOUT": "2m", "SHUTDOWN_TIMEOUT": "5s"})
	addr := strings.TrimPrefix(base, "http://")
	busy := func() net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// The webhook reads its body (to check its signature) before answering.
		fmt.Fprint(conn, "POST /webhooks/processor HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
		// The server asks for the body once it reads it: busy from then on.
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("a busy connection: %q, %v; want 100 Continue", line, err)
		}
		return conn
	}
	first, _ := busy(), busy()
	newcomer := make(chan error, 1)
	go func() {
		res, err := (&http.Client{Timeout: 10 * time.Second}).Get(base + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		newcomer <- err
	}()
	select {
	case err := <-newcomer:
		t.Fatalf("the newcomer was answered (%v) while every slot was busy", err)
	case <-time.After(300 * time.Millisecond):
	}
	fmt.Fprint(first, "{}") // its answer (a 400, unsigned) leaves it idle
	start := time.Now()
	if err := <-newcomer; err != nil || time.Since(start) > 3*time.Second {
		t.Fatalf("the newcomer: %v after %v; want it answered once a slot went idle", err, time.Since(start))
	}
	// Every slot busy again, a newcomer waiting, and the server told to stop.
	busy()
	go func() {
		if res, err := (&http.Client{Timeout: 30 * time.Second}).Get(base + "/healthz"); err == nil {
			res.Body.Close()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	stop()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the server did not stop within 15 s of being told to, with a newcomer waiting for room")
	}
}

// TestInProcessProcessorHasNoAdminOutsideTheDemo: the in-process
// processor's URL is in the log, and any local process may call it; outside
// the demo its chaos switch and its ledger of every caller's charges are
// not served.
func TestInProcessProcessorHasNoAdminOutsideTheDemo(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	startServer(t, map[string]string{"DATABASE_URL": testdb.New(t), "HTTP_ADDR": "127.0.0.1:0"}, &logs)
	var processorURL string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var l struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "in-process card processor" {
			processorURL = l.URL
		}
	}
	for _, c := range []struct{ method, path string }{{"PUT", "/admin/chaos"}, {"GET", "/admin/chaos"}, {"GET", "/v1/ledger"}, {"GET", "/healthz"}} {
		req, _ := http.NewRequest(c.method, processorURL+c.path, strings.NewReader(`{"error_rate":1}`))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[c.path == "/healthz"]; res.StatusCode != want {
			t.Errorf("%s %s on the in-process processor: %d; want %d", c.method, c.path, res.StatusCode, want)
		}
	}
}

// TestMetricsOnTheirOwnAddress: with METRICS_ADDR, /metrics is served there
// and no longer on the API's address.
func TestMetricsOnTheirOwnAddress(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	base, _, _ := startServer(t, map[string]string{
		"DATABASE_URL": testdb.New(t), "HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": "127.0.0.1:0",
	}, &logs)
	var metricsAddr string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var l struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving metrics" {
			metricsAddr = l.Addr
		}
	}
	if metricsAddr == "" {
		t.Fatalf("no \"serving metrics\" line in\n%s", logs.String())
	}
	if status := getWithKey(t, base+"/healthz", ""); status != http.StatusOK {
		t.Fatalf("healthz: %d", status)
	}
	res, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `_http_requests_total{method="GET",route="/healthz",status="200"}`) {
		t.Errorf("METRICS_ADDR /metrics: %d; want the service's metrics", res.StatusCode)
	}
	res, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode == http.StatusOK {
		t.Errorf("the API's /metrics: %d; want it gone when METRICS_ADDR is set", res.StatusCode)
	}
}

// TestTakenPortSaysHowToPickAnother: a busy port names the settings that
// pick another, for the server and for `make run`'s demo.
func TestTakenPortSaysHowToPickAnother(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, command := range []string{"serve", "demo"} {
		err := run(context.Background(), []string{command}, env(map[string]string{
			"DATABASE_URL": testdb.New(t), "HTTP_ADDR": taken.Addr().String(),
		}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "HTTP_ADDR") || !strings.Contains(err.Error(), "make run PORT=") {
			t.Errorf("%s on a taken port: %v; want the settings that pick another", command, err)
		}
	}
}
