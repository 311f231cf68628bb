package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/ledger"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

// TestMoneyIsExactUnderConcurrency runs credits, debits, settlements,
// restores and roll-ups of one caller's balance at once, on many
// connections, then checks what the ledger promises: the balance read
// through the checkpoint equals the sum of every entry, available was never
// overdrawn, and every account's entries sum to zero across the accounts.
func TestMoneyIsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO callers (id, name, api_key_hash) VALUES ('c1', 'C1', 'x')`); err != nil {
		t.Fatal(err)
	}
	tx := func(f func(tx pgx.Tx) error) error { return postgres.Transact(ctx, pool, f) }

	// First credits, then debits that ask for three times as much, so that
	// the balance runs dry while they race: an overdraw would leave
	// available below zero, since no credit comes after. Roll-ups run
	// throughout.
	const workers, rounds = 16, 20
	var refused, debited sync.Map
	run := func(step func(w, i int) error) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range rounds {
					var err error
					if rand.IntN(4) == 0 {
						_, err = pool.Exec(ctx, `SELECT ledger_roll_up('c1', 'usd')`)
					} else {
						err = step(w, i)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	run(func(w, i int) error {
		return tx(func(tx pgx.Tx) error { return ledger.Credit(ctx, tx, "c1", "usd", 100, fmt.Sprintf("ch_%d_%d", w, i)) })
	})
	run(func(w, i int) error {
		id := fmt.Sprintf("po_%d_%d", w, i)
		err := tx(func(tx pgx.Tx) error { return ledger.Debit(ctx, tx, "c1", "usd", 300, id) })
		if errors.As(err, new(*problem.Error)) {
			refused.Store(id, true)
			return nil
		}
		if err != nil {
			return err
		}
		debited.Store(id, true)
		return tx(func(tx pgx.Tx) error { // paid, or failed and given back
			if i%4 == 0 {
				return ledger.Restore(ctx, tx, "c1", "usd", 300, id)
			}
			return ledger.Settle(ctx, tx, "c1", "usd", 300, id)
		})
	})

	b := balance(t, pool)
	var available, pending, world int64
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(sum(amount) FILTER (WHERE to_account = 'available'), 0) - coalesce(sum(amount) FILTER (WHERE from_account = 'available'), 0),
		       coalesce(sum(amount) FILTER (WHERE to_account = 'pending'), 0) - coalesce(sum(amount) FILTER (WHERE from_account = 'pending'), 0),
		       coalesce(sum(amount) FILTER (WHERE to_account = 'processor'), 0) - coalesce(sum(amount) FILTER (WHERE from_account = 'processor'), 0)
		FROM ledger_entries WHERE caller_id = 'c1' AND currency = 'usd'`).Scan(&available, &pending, &world); err != nil {
		t.Fatal(err)
	}
	if b.Available != available || b.Pending != pending {
		t.Errorf("balance through the checkpoint: %d available, %d pending; the entries sum to %d and %d", b.Available, b.Pending, available, pending)
	}
	if available < 0 || pending != 0 {
		t.Errorf("%d available, %d pending: overdrawn, or money held with every payout final", available, pending)
	}
	if available+pending+world != 0 {
		t.Errorf("the accounts sum to %d, not zero", available+pending+world)
	}
	var horizon int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_checkpoints WHERE horizon > '0'`).Scan(&horizon); err != nil || horizon != 1 {
		t.Errorf("%d rolled-up checkpoints (err %v); want 1: the roll-ups never ran", horizon, err)
	}
	n := func(m *sync.Map) (n int) {
		m.Range(func(any, any) bool { n++; return true })
		return n
	}
	t.Logf("%d payouts debited, %d refused", n(&debited), n(&refused))
}

// TestDebitRefusesWhatTheBalanceDoesNotCover: the refusal is the caller's
// insufficient_balance, and it writes nothing.
func TestDebitRefusesWhatTheBalanceDoesNotCover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO callers (id, name, api_key_hash) VALUES ('c1', 'C1', 'x')`); err != nil {
		t.Fatal(err)
	}
	err := postgres.Transact(ctx, pool, func(tx pgx.Tx) error {
		if err := ledger.Credit(ctx, tx, "c1", "eur", 500, "ch_1"); err != nil {
			return err
		}
		return ledger.Debit(ctx, tx, "c1", "eur", 501, "po_1")
	})
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != ledger.InsufficientBalance {
		t.Fatalf("debit of 501 from 500: %v; want insufficient_balance", err)
	}
	if b := balance(t, pool); b != (usd{}) {
		t.Errorf("balance after the rolled-back transaction: %+v; want none", b)
	}
	// An entry that moves nothing is not an entry.
	if _, err := pool.Exec(ctx, `INSERT INTO ledger_entries (caller_id, id, currency, amount, from_account, to_account, object_id)
		VALUES ('c1', 'le_x', 'eur', 1, 'available', 'available', 'x')`); err == nil {
		t.Error("the database took an entry from an account to itself")
	}
}

// usd is one currency's balance.
type usd struct{ Available, Pending int64 }

// balance is c1's balance in its one currency (usd, or eur in the test
// that uses it), as the API reads it.
func balance(t *testing.T, pool *pgxpool.Pool) usd {
	t.Helper()
	b, err := ledger.Get(context.Background(), pool, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Available) == 0 {
		return usd{}
	}
	return usd{b.Available[0].Amount, b.Pending[0].Amount}
}
