package payouts

// The balance is what each caller can pay out, per currency, kept in the
// transactions that move the money (see migration 0020):
//
//	a charge succeeds          CreditBalance   available += amount
//	a refund or payout starts  DebitBalance    available -= amount, pending += amount
//	it succeeds                SettleBalance   pending -= amount
//	it fails                   RestoreBalance  available += amount, pending -= amount
//
// The debit is where overdrawing is refused, by the database: the CHECK
// balance_not_overdrawn (available >= 0) fails the UPDATE, and concurrent
// debits queue on the balance row's lock, so no interleaving of payouts
// and refunds can take available below zero.

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

// CreditBalance adds a succeeded charge's amount to the caller's available
// balance.
func CreditBalance(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "CreditBalance(%s, %s, %d)", callerID, currency, amount)
	return queries.CreditBalance(ctx, tx, dbsqlc.CreditBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// DebitBalance takes amount from the available balance into pending, for a
// refund or payout being created in tx. When the balance does not cover
// it, it returns a *problem.Error (insufficient_balance) and tx is
// aborted: the caller returns the problem, and the whole phase rolls back.
func DebitBalance(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, what string) error {
	n, err := queries.DebitBalance(ctx, tx, dbsqlc.DebitBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
	var pgErr *pgconn.PgError
	if (err == nil && n == 0) || (errors.As(err, &pgErr) && pgErr.ConstraintName == "balance_not_overdrawn") {
		// No row: nothing was ever charged in this currency.
		return problem.New(problem.InsufficientBalance, "the %s of %d %s is more than the available balance", what, amount, currency)
	}
	if err != nil {
		return fmt.Errorf("DebitBalance(%s, %s, %d): %w", callerID, currency, amount, err)
	}
	return nil
}

// SettleBalance records that a debited refund or payout succeeded.
func SettleBalance(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "SettleBalance(%s, %s, %d)", callerID, currency, amount)
	return queries.SettleBalance(ctx, tx, dbsqlc.SettleBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// RestoreBalance gives a failed refund's or payout's debit back to available.
func RestoreBalance(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64) (err error) {
	defer postgres.Wrap(&err, "RestoreBalance(%s, %s, %d)", callerID, currency, amount)
	return queries.RestoreBalance(ctx, tx, dbsqlc.RestoreBalanceParams{CallerID: callerID, Currency: currency, Amount: amount})
}

// Balance is one currency of a caller's balance: what can be paid out
// (Available), and what refunds and payouts in flight hold (Pending).
type Balance struct {
	Currency  string
	Available int64
	Pending   int64
}

// Balances is a caller's balance in every currency it has one in.
type Balances []Balance

// API is the balance as the contract shows it: one list of available
// amounts and one of pending, a currency each.
func (bs Balances) API() apigen.Balance {
	out := apigen.Balance{Available: []apigen.BalanceAmount{}, Pending: []apigen.BalanceAmount{}}
	for _, b := range bs {
		out.Available = append(out.Available, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Available})
		out.Pending = append(out.Pending, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Pending})
	}
	return out
}

// GetBalance returns the caller's balance.
func GetBalance(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ Balances, err error) {
	defer postgres.Wrap(&err, "GetBalance(%s)", callerID)
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
