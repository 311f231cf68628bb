package app

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/testdb"
)

// Clock skew between replicas cannot break a lease, because no replica's
// clock takes part in one: every lease is set and compared with now() in
// SQL, on the one database's clock. Two tests show it.
//
// This one runs the service with the database's clock ten minutes ahead of
// the replicas' (a PostgreSQL of the test's own, started under libfaketime;
// the replicas are two real server processes on the machine's clock).
// Ten minutes is far more than any skew between machines, and far more
// than the lease. Replica A claims a charge's key and dies holding it. Had a
// replica computed a lease, or compared one, on its own clock, the lease
// would already have lapsed on the database's clock (a second owner let
// in at once), or would last ten minutes more (a 409 with Retry-After:
// 600). Instead, replica B answers 409 while A's lease runs, with
// Retry-After at most the lease, and takes the operation over once the
// lease lapses on the database's clock; one charge is made.
//
// Why the database, and not a replica: libfaketime moves a process's clock
// by intercepting the C library, and Go programs read the clock without
// it, so it cannot move a replica's clock. Moving the database's clock
// shows the same thing from the other side: the replicas' clocks disagree
// with the only clock a lease uses, by ten minutes, and nothing changes.
func TestClockSkewCannotBreakALease(t *testing.T) {
	t.Parallel()
	bin := testdb.PGBin()
	if bin == "" || testdb.FaketimeLib() == "" {
		msg := "this test runs a PostgreSQL of its own under faketime: it needs PostgreSQL's server binaries and faketime (apt-get install faketime)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cluster := testdb.NewCluster(t, bin, testdb.WithClock("+10m"))
	ctx := context.Background()
	db, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	var dbNow time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if skew := time.Until(dbNow); skew < 9*time.Minute {
		t.Fatalf("the database's clock is %s ahead of this process's; want about ten minutes (is faketime working?)", skew)
	}

	const lease = 3 * time.Second
	// IDEMPOTENCY_WAIT=0: B answers at once instead of waiting on the
	// server, so its answer shows the lease as it stands at that moment.
	env := []string{"DATABASE_URL=" + cluster.URL(), "HTTP_ADDR=127.0.0.1:0", "IDEMPOTENCY_LEASE=" + lease.String(), "IDEMPOTENCY_WAIT=0",
		"PROCESSOR_TIMEOUT=1s", "SEED_DEMO_CALLERS=true", "RECONCILER_ENABLED=false", "RATE_LIMIT_PER_SECOND=0"}
	addrA, replicaA := startCommand(t, "cmd/server", nil, env...)
	addrB, _ := startCommand(t, "cmd/server", nil, env...)
	post := func(addr, path, key, body string) response {
		req, err := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return response{}
		}
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return response{} // replica A, killed under its request
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return response{Status: res.StatusCode, Header: res.Header, Body: b}
	}
	var o order
	if res := post(addrB, "/v1/orders", "skewed-order", `{"amount":100,"currency":"usd"}`); res.Status != http.StatusCreated {
		t.Fatalf("order: %d %s", res.Status, res.Body)
	} else {
		res.decode(t, &o)
	}
	charge := func(addr string) response {
		return post(addr, "/v1/orders/"+o.ID+"/charges", "skewed", `{"payment_method":"pm_card_visa"}`)
	}

	// Replica A claims the charge's key and is held inside its last phase
	// (every ledger entry's insert waits on a lock the test keeps); then it
	// dies, as a crash kills it, leaving its lease to run out on its own.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // released below; this is for a test that stops early
	if _, err := tx.Exec(ctx, `LOCK TABLE ledger_entries IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	go charge(addrA)
	waitForInsertsWaiting(t, db, "ledger_entries", 1)
	if err := replicaA.Process.Kill(); err != nil {
		t.Fatal(err)
	}

	// The lease A held was set on the database's clock: it ends a lease
	// after the claim by that clock, ten minutes after the replicas' now.
	var leaseLeft time.Duration
	var lockedUntil time.Time
	if err := db.QueryRow(ctx, `SELECT locked_until, locked_until - now() FROM idempotency_keys WHERE key = 'skewed'`).Scan(&lockedUntil, &leaseLeft); err != nil {
		t.Fatal(err)
	}
	if leaseLeft <= 0 || leaseLeft > lease || lockedUntil.Before(time.Now().Add(9*time.Minute)) {
		t.Fatalf("A's lease ends at %s, %s from the database's now; want within %s of it, on the database's clock", lockedUntil, leaseLeft, lease)
	}

	// Replica B, while the dead A's lease runs: in progress, for at most
	// the lease. Nobody is working (A is dead), but no server can tell
	// that from a slow A before the lease lapses.
	res := charge(addrB)
	if res.Status != http.StatusConflict || res.Header.Get(outcomeHeader) != "in_progress" {
		t.Fatalf("B while A's lease runs: %d %s; want 409 in_progress", res.Status, res.Header.Get(outcomeHeader))
	}
	if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || ra < 1 || ra > int(lease/time.Second) {
		t.Errorf("B's Retry-After %q; want 1 to %d seconds, what is left of the lease on the database's clock", res.Header.Get("Retry-After"), int(lease/time.Second))
	}

	// Once the lease has lapsed on the database's clock, B takes over; it
	// is held at the same insert, until the test lets the inserts go.
	waitFor(t, 30*time.Second, "A's lease to lapse on the database's clock", func() bool {
		var lapsed bool
		if err := db.QueryRow(ctx, `SELECT locked_until <= now() FROM idempotency_keys WHERE key = 'skewed'`).Scan(&lapsed); err != nil {
			t.Fatal(err)
		}
		return lapsed
	})
	var taker response
	done := make(chan struct{})
	go func() {
		defer close(done)
		taker = charge(addrB)
	}()
	waitFor(t, 30*time.Second, "B's takeover to wait at the ledger insert", func() bool {
		var attempt int
		if err := db.QueryRow(ctx, `SELECT attempt FROM idempotency_keys WHERE key = 'skewed'`).Scan(&attempt); err != nil {
			t.Fatal(err)
		}
		return attempt == 2
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if taker.Status != http.StatusCreated || taker.Header.Get(outcomeHeader) != "taken_over" {
		t.Errorf("B after A's lease lapsed: %d %s; want 201 taken_over", taker.Status, taker.Header.Get(outcomeHeader))
	}
	var charges int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil || charges != 1 {
		t.Errorf("%d charges (%v); want 1", charges, err)
	}
}

// waitForInsertsWaiting waits until n inserts into table wait on a lock
// in db's database: n requests are inside a transaction that inserts there.
func waitForInsertsWaiting(t *testing.T, db *pgxpool.Pool, table string, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, "inserts into "+table+" waiting on the lock", func() bool {
		var waiting int
		err := db.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO ' || $1 || ' %'`, table).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	})
}

// No statement of the idempotency layer takes a time from the server: the
// parameters sqlc generated for the idempotency_keys queries hold no
// time.Time. A statement that did (a lease end computed by a replica)
// would bring that replica's clock into the lease, and this test fails.
// Durations, such as the lease's length in seconds, are fine: they are
// the same on every clock.
func TestLeaseStatementsTakeNoTimeFromTheServer(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../dbsqlc/idempotency_keys.sql.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	params := 0
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || !strings.HasSuffix(ts.Name.Name, "Params") {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return true
		}
		params++
		for _, field := range st.Fields.List {
			typ := types(field.Type)
			if strings.Contains(typ, "time.Time") || strings.Contains(typ, "pgtype.Timestamp") {
				t.Errorf("%s.%s is a %s: a time from the server, in a statement of the idempotency layer", ts.Name.Name, field.Names[0].Name, typ)
			}
		}
		return true
	})
	if params < 5 {
		t.Fatalf("found %d parameter structs in idempotency_keys.sql.go; the test no longer reads what it should", params)
	}
}

// types renders a field's type as written.
func types(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return "*" + types(t.X)
	case *ast.SelectorExpr:
		return types(t.X) + "." + t.Sel.Name
	case *ast.ArrayType:
		return "[]" + types(t.Elt)
	default:
		return "?"
	}
}
