// Package ledger keeps each caller's balance: what it can pay out, per
// currency, written in the transactions that move the money (see migration
// 0020), by whichever operation moves it. It owns the balances table.
//
//	a charge succeeds          Credit    available += amount
//	a refund or payout starts  Debit     available -= amount, pending += amount
//	it succeeds                Settle    pending -= amount
//	it fails                   Restore   available += amount, pending -= amount
//
// The database refuses overdrawing at the debit: the CHECK
// balance_not_overdrawn (available >= 0) fails the UPDATE, and concurrent
// debits queue on the balance row's lock, so no interleaving of payouts and
// refunds takes available below zero.
package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

// Credit adds a succeeded charge's amount to the caller's available balance.
func Credit(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "ledger.Credit(%s, %s, %d)", callerID, currency, amount)
	return queries.CreditBalance(ctx, tx, dbsqlc.CreditBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// Debit moves amount from available to pending for a refund or payout
// created in tx. A balance that does not cover it aborts tx: it returns an
// insufficient_balance *problem.Error, and the whole phase rolls back.
func Debit(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, what string) error {
	n, err := queries.DebitBalance(ctx, tx, dbsqlc.DebitBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
	var pgErr *pgconn.PgError
	if (err == nil && n == 0) || (errors.As(err, &pgErr) && pgErr.ConstraintName == "balance_not_overdrawn") {
		// No row: nothing was ever charged in this currency.
		return problem.New(problem.InsufficientBalance, "the %s of %d %s is more than the available balance", what, amount, currency)
	}
	if err != nil {
		return fmt.Errorf("ledger.Debit(%s, %s, %d): %w", callerID, currency, amount, err)
	}
	return nil
}

// Settle records that a debited refund or payout succeeded.
func Settle(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "ledger.Settle(%s, %s, %d)", callerID, currency, amount)
	return queries.SettleBalance(ctx, tx, dbsqlc.SettleBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// Restore gives a failed refund's or payout's debit back to available.
func Restore(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "ledger.Restore(%s, %s, %d)", callerID, currency, amount)
	return queries.RestoreBalance(ctx, tx, dbsqlc.RestoreBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// Balance is one currency of a caller's balance.
type Balance struct {
	Currency  string
	Available int64 // what can be paid out
	Pending   int64 // what refunds and payouts in flight hold
}

// Balances is a caller's balance in every currency it has one in.
type Balances []Balance

// API is the balance as the contract shows it: a list of available amounts
// and one of pending, a currency each.
func (bs Balances) API() apigen.Balance {
	out := apigen.Balance{Available: []apigen.BalanceAmount{}, Pending: []apigen.BalanceAmount{}}
	for _, b := range bs {
		out.Available = append(out.Available, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Available})
		out.Pending = append(out.Pending, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Pending})
	}
	return out
}

// Get returns the caller's balance.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ Balances, err error) {
	defer postgres.Wrap(&err, "ledger.Get(%s)", callerID)
	rows, err := queries.ListBalances(ctx, db, callerID)
	if err != nil {
		return nil, err
	}
	out := make(Balances, len(rows))
	for i, b := range rows {
		out[i] = Balance{Currency: b.Currency, Available: b.Available, Pending: b.Pending}
	}
	return out, nil
}
