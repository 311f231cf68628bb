package idempotency

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// A replay never answers with a record the synchronous standby does not
// have yet. On a primary shutting down for a failover, a commit whose wait
// for the standby is cut short is visible to other sessions before the
// standby has it; the failover soak once saw a replay answer with such a
// record, and the new primary never had it. Here the record is committed
// with synchronous_commit = local on a server whose synchronous standby
// never answers: the replay must wait for that standby (PostgreSQL shows
// its backend waiting in SyncRep), and answer once the standby is no
// longer required.
func TestReplayWaitsUntilTheRecordIsReplicated(t *testing.T) {
	t.Parallel()
	bin := testdb.PGBin()
	if bin == "" {
		msg := "this test runs a PostgreSQL of its own: it needs PostgreSQL's server binaries"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cluster := testdb.NewCluster(t, bin)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := postgres.Migrate(pool); err != nil {
		t.Fatal(err)
	}
	if err := auth.SeedDemoCallers(ctx, pool); err != nil {
		t.Fatal(err)
	}
	standby := func(names string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		for range 100 { // the reload reaches every backend within moments
			var now string
			if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&now); err == nil && now == names {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("synchronous_standby_names never became %q", names)
	}
	standby("nobody")
	// The checkpointer, not the backend that reloaded, decides when commits
	// start waiting for the standby: a probe commit waiting in SyncRep says
	// they do. (It is released at the end, with everything else.)
	// Whatever happens, nothing is left waiting when the test ends (the
	// pool's Close would wait for it).
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
		_, _ = pool.Exec(ctx, `SELECT pg_reload_conf()`)
	})
	// A probe that commits before commits start waiting comes back at
	// once: then another is sent, until one waits.
	var probePID uint32
	probe := make(chan error, 1)
	sendProbe := func() {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		probePID = conn.Conn().PgConn().PID()
		go func() {
			_, err := conn.Exec(ctx, `SELECT pg_logical_emit_message(true, 'probe', '')`)
			conn.Release()
			probe <- err
		}()
	}
	sendProbe()
	deadline := time.Now().Add(time.Minute)
	waitInSyncRep := func(answered <-chan struct{}) {
		t.Helper()
		for waiting := false; !waiting; {
			if time.Now().After(deadline) {
				t.Fatal("no backend waits for the standby")
			}
			select {
			case <-answered:
				t.Fatal("answered without waiting for the standby")
			case <-time.After(50 * time.Millisecond):
			}
			if err := pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid <> $1`, probePID).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
	}
	for waiting := false; !waiting; {
		if time.Now().After(deadline) {
			t.Fatal("no probe ever waited for the standby: synchronous replication is not on")
		}
		select {
		case err := <-probe: // committed before commits began to wait
			if err != nil {
				t.Fatal(err)
			}
			sendProbe()
			continue
		case <-time.After(50 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid = $1`, probePID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}

	req := testRequest(t, "not-yet-replicated")
	if _, err := pool.Exec(ctx, `
		BEGIN;
		SET LOCAL synchronous_commit = local;
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path,
		                              request_fingerprint, response_status, response_headers, response_body, completed_at)
		VALUES ('acme', 'not-yet-replicated', 'completed', 'finished', 1, 'createOrder', 'POST', '/v1/orders',
		        '\x`+fmt.Sprintf("%x", req.Fingerprint)+`', 201, '{"Content-Type":["application/json"]}', '{"id":"ord_x"}', now());
		COMMIT`); err != nil {
		t.Fatal(err)
	}

	s := NewStore(pool, StoreConfig{Lease: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	type answer struct {
		resp *Response
		err  error
	}
	answered := make(chan answer, 1)
	done := make(chan struct{})
	go func() {
		// It runs (there is no look-up first) and rolls back: the key is taken.
		resp, err := s.serveLocal(ctx, req, func(context.Context, pgx.Tx) (*Response, error) {
			return JSONResponse(201, nil, map[string]string{"id": "ord_again"})
		})
		answered <- answer{resp, err}
		close(done)
	}()
	// The replay waits for the standby: a backend of its own in SyncRep,
	// and no answer meanwhile.
	waitInSyncRep(done)
	standby("")
	if err := <-probe; err != nil {
		t.Fatal(err)
	}
	a := <-answered
	if a.err != nil || a.resp == nil || !a.resp.Replayed || string(a.resp.Body) != `{"id":"ord_x"}` {
		t.Fatalf("once the standby is no longer required: %+v, %v; want the stored answer, replayed", a.resp, a.err)
	}
}
