package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
