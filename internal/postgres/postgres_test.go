package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/retrysafe/payments/db"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// A panic inside a transaction must not leak its connection or leave the
// transaction open with its locks held.
func TestTransactRollsBackOnPanic(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	ctx := context.Background()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		_ = postgres.Transact(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE orders IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			panic("handler bug")
		})
	}()
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still checked out after the panic", n)
	}
	var open int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Errorf("%d transactions left open after the panic", open)
	}
}

func TestTransactCommitsAndRollsBack(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	ctx := context.Background()
	insert := func(id string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO callers (id, name, api_key_hash) VALUES ($1, $1, $2)`, id, []byte(id))
			return err
		}
	}
	if err := postgres.Transact(ctx, pool, insert("kept")); err != nil {
		t.Fatal(err)
	}
	failing := func(tx pgx.Tx) error {
		if err := insert("dropped")(tx); err != nil {
			return err
		}
		return context.Canceled // any error
	}
	if err := postgres.Transact(ctx, pool, failing); err == nil {
		t.Fatal("Transact swallowed fn's error")
	}
	rows, _ := pool.Query(ctx, `SELECT id FROM callers ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != 1 || ids[0] != "kept" {
		t.Errorf("callers %v (%v); want only the committed one", ids, err)
	}
}

func TestIsTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{context.Canceled, true}, // a worker stopped mid-operation: not a final failure
		{fmt.Errorf("wrapped: %w", io.ErrUnexpectedEOF), true},
		{&pgconn.PgError{Code: "40001"}, true},  // serialization_failure
		{&pgconn.PgError{Code: "40P01"}, true},  // deadlock_detected
		{&pgconn.PgError{Code: "57P01"}, true},  // admin_shutdown
		{&pgconn.PgError{Code: "08006"}, true},  // connection_failure
		{&pgconn.PgError{Code: "57P03"}, true},  // cannot_connect_now: starting up, or in recovery
		{&pgconn.PgError{Code: "25006"}, true},  // read_only_sql_transaction: a standby, or a fenced primary
		{&pgconn.ConnectError{}, true},          // no host took the connection (none read-write, say)
		{&pgconn.PgError{Code: "23505"}, false}, // unique_violation: a real answer
		{&pgconn.PgError{Code: "P0001"}, false}, // raise_exception
		{errors.New("a bug"), false},
		{nil, false},
	} {
		if got := postgres.IsTransient(tc.err); got != tc.want {
			t.Errorf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// openOne opens the service's pool, of one connection, on a database of
// the test's own; it is closed when t ends.
func openOne(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Open(context.Background(), testdb.New(t)+"&pool_max_conns=1", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The pool's connections plan every run of a prepared statement for its
// arguments and the table as it is (custom plans), never settling on a
// generic plan: one made while a table is empty can use any index that
// matches caller_id alone, and would be kept as the table grows.
func TestPoolNeverKeepsAGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openOne(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const find = "SELECT id FROM orders WHERE caller_id = $1 AND id = $2"
	for range 10 { // PostgreSQL considers a generic plan from the sixth run
		if _, err := conn.Exec(ctx, find, "acme", "ord_missing"); err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", find).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic != 0 || custom != 10 {
		t.Errorf("%d generic and %d custom plans for 10 runs; want 0 and 10", generic, custom)
	}
}

// A server that has turned read-only under an open connection (here the
// session's default_transaction_read_only, as a fenced primary's would be)
// fails a write with read_only_sql_transaction, which is transient (a 503),
// and the pool closes that connection instead of handing it out again: the
// next write gets a new connection, which target_session_attrs=read-write
// would send to the new primary.
func TestReadOnlyServerIsTransientAndItsConnectionIsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openOne(t)
	// Released before any check can end the test (pool.Close waits for it).
	pid, writeErr, readOnly := func() (uint32, error, bool) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "CREATE TABLE t (x int)")
		return conn.Conn().PgConn().PID(), err, postgres.ReadOnly(conn.Conn().PgConn())
	}()
	if !isCode(writeErr, "25006") || !postgres.IsTransient(writeErr) {
		t.Fatalf("write on a read-only session: %v; want a transient read_only_sql_transaction", writeErr)
	}
	if !readOnly {
		t.Fatal("the connection does not know its server is read-only")
	}
	var again uint32
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again == pid {
		t.Fatalf("the pool handed out the read-only connection (backend %d) again", pid)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatalf("write on a new connection: %v", err)
	}
}

// A server that is read-only for every connection, new ones included (one
// host, or a proxy still sending them to a demoted primary): each write
// is a transient failure, a 503, and nothing else breaks. Reads still
// work, and the pool keeps answering. (Refusing read-only connections
// when they are handed out, instead of dropping the one that found out,
// would make the pool dial and refuse new ones until Acquire gave up with
// an error that is no 503, and fail reads too.)
func TestServerReadOnlyForEveryConnectionFailsOnlyWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	readOnly(t, url, true)
	pool, err := postgres.Open(ctx, url+"&pool_max_conns=2", false)
	if err != nil {
		t.Fatalf("open a pool on a read-only server: %v", err)
	}
	t.Cleanup(pool.Close)
	for i := range 5 {
		_, err := pool.Exec(ctx, "CREATE TABLE t (x int)")
		if !isCode(err, "25006") || !postgres.IsTransient(err) {
			t.Fatalf("write %d: %v; want a transient read_only_sql_transaction", i, err)
		}
		var one int
		if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("read %d on a read-only server: %d, %v", i, one, err)
		}
	}
}

// While no node takes writes (here the one node refuses
// target_session_attrs=read-write, as a standby does), a pool dials once,
// and for the next second answers ErrNoPrimary, a transient error, without
// dialling; once the node takes writes again, the pool is soon back.
func TestPoolStopsDiallingWhileNoNodeIsWritable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool, err := postgres.Open(ctx, url+"&target_session_attrs=read-write", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	readOnly(t, url, true)
	pool.Reset() // the setting reaches new sessions only
	var connectErr *pgconn.ConnectError
	if err := pool.Ping(ctx); !errors.As(err, &connectErr) {
		t.Fatalf("ping of a read-only node: %v; want its connection refused", err)
	}
	if err := pool.Ping(ctx); !errors.Is(err, postgres.ErrNoPrimary) || !postgres.IsTransient(err) {
		t.Fatalf("ping right after: %v; want ErrNoPrimary, without a dial", err)
	}
	readOnly(t, url, false)
	deadline := time.Now().Add(5 * time.Second)
	for err := pool.Ping(ctx); err != nil; err = pool.Ping(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("5s after the node took writes again: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling the pool
	}
}

// readOnly makes the sessions that start on url's database from now on
// read-only, as on a standby or a fenced primary, or writable again.
func readOnly(t *testing.T, url string, on bool) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{"SET default_transaction_read_only = off", fmt.Sprintf(
		"DO $$ BEGIN EXECUTE format('ALTER DATABASE %%I SET default_transaction_read_only = %v', current_database()); END $$", on)} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// migrator returns golang-migrate over the pool's database.
func migrator(t *testing.T, pool *pgxpool.Pool) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(db.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqlDB.Close() })
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Every migration can be undone and applied again: the down files are
// real, River's generated ones included.
func TestMigrationsGoDownAndUpAgain(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t) // migrated up by testdb
	m := migrator(t, pool)
	if err := m.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	var tables int
	if err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_tables
		WHERE schemaname IN ('public', 'river') AND tablename <> 'schema_migrations'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d tables left after migrating down", tables)
	}
	if err := m.Up(); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// Migration 0020 starts each caller's balance from the charges and refunds
// made before it: succeeded charges less what refunds reserved, with the
// pending refunds pending; migration 0026 turns those balances into opening
// ledger entries that sum to the same.
func TestBalancesStartFromEarlierChargesAndRefunds(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	m := migrator(t, pool)
	if err := m.Migrate(19); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO callers (id, name, api_key_hash) VALUES ('c1', 'C1', 'x'), ('c2', 'C2', 'y');
		INSERT INTO orders (caller_id, id, amount, currency) VALUES
			('c1', 'o1', 1000, 'usd'), ('c1', 'o2', 500, 'usd'), ('c1', 'o3', 700, 'eur'), ('c1', 'o4', 300, 'usd'), ('c2', 'o1', 900, 'usd');
		INSERT INTO charges (caller_id, id, order_id, idempotency_key_id, amount, currency, payment_method, status, failure_code, downstream_key, amount_refunded) VALUES
			('c1', 'ch1', 'o1', 1, 1000, 'usd', 'pm', 'succeeded', NULL, 'k1', 400),
			('c1', 'ch2', 'o2', 2, 500, 'usd', 'pm', 'succeeded', NULL, 'k2', 0),
			('c1', 'ch3', 'o3', 3, 700, 'eur', 'pm', 'succeeded', NULL, 'k3', 0),
			('c1', 'ch4', 'o4', 4, 300, 'usd', 'pm', 'failed', 'generic_decline', 'k4', 0),
			('c2', 'ch1', 'o1', 1, 900, 'usd', 'pm', 'pending', NULL, 'k1', 0);
		INSERT INTO refunds (caller_id, id, charge_id, idempotency_key_id, amount, status, downstream_key) VALUES
			('c1', 're1', 'ch1', 5, 300, 'succeeded', 'k5'),
			('c1', 're2', 'ch1', 6, 100, 'pending', 'k6'),
			('c1', 're3', 'ch1', 7, 200, 'failed', 'k7');`)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Up(); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
		SELECT c.caller_id || ' ' || c.currency || ' ' || b.available || ' ' || b.pending
		FROM (SELECT DISTINCT caller_id, currency FROM ledger_entries) c, ledger_balance(c.caller_id, c.currency) b ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// c1 usd: 1000 + 500 succeeded, 400 reserved by refunds (100 of it pending).
	want := []string{"c1 eur 700 0", "c1 usd 1100 100"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("balances %q; want %q", got, want)
	}
}

// A table's id prefix is its own: declaring one a second time stops the
// program (at start-up, where package variables declare them).
func TestAnIDPrefixDeclaredTwicePanics(t *testing.T) {
	prefix := fmt.Sprintf("t%d", time.Now().UnixNano()) // one of its own, under -count too
	if id := postgres.IDs(prefix)(); !strings.HasPrefix(id, prefix+"_") || len(id) != len(prefix)+1+24 {
		t.Errorf("id %q; want %s_ and 24 characters", id, prefix)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("a second IDs(%q) did not panic", prefix)
		}
	}()
	postgres.IDs(prefix)
}
