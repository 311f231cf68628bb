package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// pipelineFixture is a database with a claimed idempotency key, whose
// record a phase can complete, and a pool that counts its round trips.
type pipelineFixture struct {
	pool    *pgxpool.Pool
	counter *testdb.Counter
	key     dbsqlc.IdempotencyKey
}

func newPipelineFixture(t *testing.T) *pipelineFixture {
	t.Helper()
	counter := &testdb.Counter{}
	pool := testdb.Pool(t, testdb.New(t), func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = counter
		c.MaxConns = 1 // one connection: the tests see what it was left in
	})
	if _, err := pool.Exec(context.Background(), `INSERT INTO callers (id, name, api_key_hash) VALUES ('acme', 'Acme', 'x')`); err != nil {
		t.Fatal(err)
	}
	return &pipelineFixture{pool: pool, counter: counter, key: claim(t, pool, "k1")}
}

// phase runs a phase as a keyed create does: the order insert, held for
// later, then the record's fenced completion under attempt, sent with it
// and COMMIT.
func (f *pipelineFixture) phase(ctx context.Context, orderID string, attempt int32) error {
	q := dbsqlc.New()
	return postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, heldInsert, orderID); err != nil {
			return err
		}
		status := int32(201)
		return q.CompleteIdempotencyKey(ctx, tx, dbsqlc.CompleteIdempotencyKeyParams{
			ResponseStatus: &status, ResponseHeaders: []byte(`{}`), ResponseBody: []byte(`{}`),
			CallerID: "acme", ID: f.key.ID, Attempt: attempt,
		})
	})
}

// insertOrder inserts the order $1, for the tests that write SQL of their own.
const insertOrder = `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', $1, 100, 'usd')`

// heldInsert is insertOrder as sqlc writes an :exec query, which a
// PipelinedTx holds for the next round trip.
const heldInsert = "-- name: InsertOrder :exec\n" + insertOrder

func (f *pipelineFixture) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// idle says whether the pool's one connection is outside any transaction.
func (f *pipelineFixture) idle(t *testing.T) bool {
	t.Helper()
	conn, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	return conn.Conn().PgConn().TxStatus() == 'I'
}

// A phase's two statements (the insert, held, and the fenced completion)
// take one round trip, with no BEGIN or COMMIT, and commit together.
func TestPipelinedPhaseTakesOneRoundTrip(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	// A first phase on the connection prepares its statements (pgx's
	// statement cache): run one, then count the next.
	if err := f.phase(ctx, "ord_1", f.key.Attempt); err != nil {
		t.Fatal(err)
	}
	f.key = claim(t, f.pool, "k2")
	f.counter.Reset()
	if err := f.phase(ctx, "ord_2", f.key.Attempt); err != nil {
		t.Fatal(err)
	}
	if got := f.counter.Load(); got.Statements != 2 || got.RoundTrips != 1 {
		t.Errorf("a phase sent %d statements in %d round trips, want 2 in 1", got.Statements, got.RoundTrips)
	}
	if n := f.orders(t); n != 2 {
		t.Errorf("%d orders committed, want 2", n)
	}
	var status string
	if err := f.pool.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE id = $1`, f.key.ID).Scan(&status); err != nil || status != "completed" {
		t.Errorf("record: %q, %v; want completed", status, err)
	}
	if !f.idle(t) {
		t.Error("the connection went back to the pool inside a transaction")
	}
}

// The point of the fence raising an error: a completion that has lost its
// fence is sent with COMMIT, and must stop it. The order inserted before it
// must not commit, and the error says the lease was lost.
func TestPipelinedPhaseThatLostItsFenceCommitsNothing(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	err := f.phase(ctx, "ord_1", f.key.Attempt+1) // as a fenced-out owner: another attempt's
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "RS001" {
		t.Fatalf("a completion under a lost fence: %v; want SQLSTATE RS001", err)
	}
	if n := f.orders(t); n != 0 {
		t.Errorf("%d orders committed by a phase whose fence was lost, want 0", n)
	}
	if !f.idle(t) {
		t.Error("the connection went back to the pool inside a transaction")
	}
	// The record is untouched, and its owner can still complete it.
	if err := f.phase(ctx, "ord_2", f.key.Attempt); err != nil {
		t.Fatalf("the owner's own completion afterwards: %v", err)
	}
	if n := f.orders(t); n != 1 {
		t.Errorf("%d orders, want the owner's 1", n)
	}
}

// So does a lease that ran out, with nobody else holding the record.
func TestPipelinedPhaseAfterItsLeaseRanOutCommitsNothing(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE id = $1`, f.key.ID); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := f.phase(ctx, "ord_1", f.key.Attempt); !errors.As(err, &pgErr) || pgErr.Code != "RS001" {
		t.Fatalf("a completion after the lease ran out: %v; want SQLSTATE RS001", err)
	}
	if n := f.orders(t); n != 0 {
		t.Errorf("%d orders committed, want 0", n)
	}
}

// A first statement that fails rolls everything back and leaves the
// connection clean; a transaction that sent nothing sends nothing.
func TestPipelinedTxFailuresAndNothingToSend(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', 'ord_1', 100, 'usd')`); err != nil {
			return err
		}
		// The same id again: a unique violation, in the second statement.
		if _, err := tx.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', 'ord_1', 100, 'usd')`); err == nil {
			t.Error("a duplicate primary key was accepted")
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want fn's error", err)
	}
	if n := f.orders(t); n != 0 {
		t.Errorf("%d orders committed by a failed transaction, want 0", n)
	}
	if !f.idle(t) {
		t.Error("a failed transaction left its connection inside a transaction")
	}

	f.counter.Reset()
	if err := postgres.TransactPipelined(ctx, f.pool, func(*postgres.PipelinedTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if trips := f.counter.Load().RoundTrips; trips != 0 {
		t.Errorf("a transaction with no statement took %d round trips, want 0", trips)
	}
}

// A caller that ignores an error and goes on sends nothing more: not after
// a first batch that failed before its BEGIN ran (here, a statement that
// cannot be prepared), not after a COMMIT that failed, and not after a
// generated query failed to be prepared. Outside a
// transaction its last statement would commit on its own.
func TestPipelinedTxSendsNothingOnceItIsOver(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	err := postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, `SELEC 1`); err == nil {
			t.Error("a statement that cannot be parsed ran")
		}
		// The error ignored: BEGIN never ran, so neither may these.
		if _, err := tx.Exec(ctx, insertOrder, "ord_after_failure"); err == nil {
			t.Error("a statement after the failed BEGIN was sent")
		}
		_, err := tx.Exec(ctx, heldInsert, "ord_last")
		return err
	})
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("got %v, want pgx.ErrTxClosed", err)
	}

	// A COMMIT that fails (a deferred constraint, checked at commit): the
	// transaction is over, and a later Commit says so rather than succeed.
	if _, err := f.pool.Exec(ctx, `CREATE TABLE deferred_check (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	err = postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO deferred_check VALUES (1), (1)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, heldInsert, "ord_in_failed_commit"); err != nil {
			return err
		}
		var pgErr *pgconn.PgError
		if err := tx.Commit(ctx); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Errorf("a COMMIT that breaks a deferred constraint: %v, want its unique violation", err)
		}
		if _, err := tx.Exec(ctx, insertOrder, "ord_after_commit"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("a statement after a failed COMMIT: %v, want pgx.ErrTxClosed", err)
		}
		return nil // the error ignored: TransactPipelined's Commit must not report success
	})
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("got %v, want pgx.ErrTxClosed from the second Commit", err)
	}

	// A generated query that cannot be prepared (say, on a schema that a
	// deploy changed) ends it before anything was sent.
	err = postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if err := tx.QueryRow(ctx, "-- name: Broken :one\nSELEC 1").Scan(new(int)); err == nil {
			t.Error("a query that cannot be prepared ran")
		}
		_, err := tx.Exec(ctx, insertOrder, "ord_after_prepare")
		return err
	})
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("a statement after a failed prepare: %v, want pgx.ErrTxClosed", err)
	}
	if n := f.orders(t); n != 0 {
		t.Errorf("%d orders committed, want 0", n)
	}
	if !f.idle(t) {
		t.Error("the connection went back to the pool inside a transaction")
	}
}

// An :exec query is held and sent, in order, before the next statement,
// and its failure is that statement's: a held insert that breaks the
// primary key stops the COMMIT sent with the statement after it. Held
// statements with nothing after them are the whole transaction: one round
// trip. Any other Exec is sent at once, with its own error.
func TestPipelinedTxSendsHeldStatementsFirst(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	err := postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, heldInsert, "ord_1"); err != nil {
			return err
		}
		var seen int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&seen); err != nil || seen != 1 {
			t.Errorf("a read after a held insert saw %d orders (%v), want 1", seen, err)
		}
		if _, err := tx.Exec(ctx, heldInsert, "ord_1"); err != nil { // held: no error yet
			return err
		}
		_, err := tx.Exec(ctx, heldInsert, "ord_2")
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Errorf("got %v, want the held insert's unique violation", err)
	}
	if n := f.orders(t); n != 0 {
		t.Errorf("%d orders committed, want 0", n)
	}

	f.counter.Reset()
	err = postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		_, err := tx.Exec(ctx, heldInsert, "ord_3")
		return err
	})
	if err != nil || f.counter.Load().RoundTrips != 1 || f.orders(t) != 1 {
		t.Errorf("a held insert alone: %v, %d round trips, %d orders; want it committed in 1", err, f.counter.Load().RoundTrips, f.orders(t))
	}
	err = postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		if _, err := tx.Exec(ctx, insertOrder, "ord_3"); err == nil { // not :exec: sent now
			t.Error("an unmarked Exec's unique violation did not come back at once")
		}
		return nil
	})
	if err == nil {
		t.Error("a transaction whose statement failed committed")
	}
	if !f.idle(t) {
		t.Error("the connection went back to the pool inside a transaction")
	}
}

// Whatever comes first, the transaction is one: a Query, a QueryRow, a
// savepoint (as River's InsertTx may make), and a plain commit at the end.
func TestPipelinedTxIsOneTransaction(t *testing.T) {
	t.Parallel()
	f := newPipelineFixture(t)
	ctx := context.Background()
	err := postgres.TransactPipelined(ctx, f.pool, func(tx *postgres.PipelinedTx) error {
		var first, second int64
		if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&first); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT txid_current()`)
		if err != nil {
			return err
		}
		second, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if first != second {
			t.Errorf("two statements ran in transactions %d and %d, want one", first, second)
		}
		nested, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := nested.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', 'ord_nested', 100, 'usd')`); err != nil {
			return err
		}
		if err := nested.Rollback(ctx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', 'ord_kept', 100, 'usd')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	rows, _ := f.pool.Query(ctx, `SELECT id FROM orders ORDER BY id`)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != 1 || ids[0] != "ord_kept" {
		t.Errorf("orders %v (%v), want only ord_kept: the savepoint's insert rolled back, the rest committed", ids, err)
	}
	if !f.idle(t) {
		t.Error("the connection went back to the pool inside a transaction")
	}

}

func claim(t *testing.T, pool *pgxpool.Pool, key string) dbsqlc.IdempotencyKey {
	t.Helper()
	row, err := dbsqlc.New().InsertIdempotencyKey(context.Background(), pool, dbsqlc.InsertIdempotencyKeyParams{
		CallerID: "acme", Key: key, Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
		RequestFingerprint: []byte("fp"), LeaseSeconds: 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	return row
}
