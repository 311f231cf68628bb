// Package ledger moves money as immutable entries, written in the
// transactions that move it, and derives each caller's balance from them.
// It owns ledger_entries and ledger_checkpoints (migration 0026). Each
// entry moves an amount between two of the caller's accounts:
//
//	a charge succeeds          Credit    processor -> available
//	a refund or payout starts  Debit     available -> pending
//	it succeeds                Settle    pending   -> processor
//	it fails                   Restore   pending   -> available
//
// Credits only insert. A debit (ledger_debit) locks the caller's checkpoint
// row to the commit, so send it last (docs/design.md, "The ledger").
package ledger

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

var newEntryID = postgres.IDs("le") // le_…

// InsufficientBalance answers a debit the balance does not cover.
var InsufficientBalance = problem.Define("insufficient_balance", http.StatusConflict, "Insufficient balance")

// The accounts an entry moves money between.
const (
	Processor = "processor" // the world outside
	Available = "available" // what a payout can take
	Pending   = "pending"   // refunds and payouts on their way out
)

// move writes one entry: amount from one account to another, for object (a charge, refund or payout id).
func move(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, from, to, object string) (err error) {
	defer postgres.Wrap(&err, "ledger: move %d %s of %s from %s to %s for %s", amount, currency, callerID, from, to, object)
	return queries.InsertLedgerEntry(ctx, tx, dbsqlc.InsertLedgerEntryParams{CallerID: callerID, ID: newEntryID(),
		Currency: currency, Amount: amount, FromAccount: from, ToAccount: to, ObjectID: object})
}

// Credit records a succeeded charge's amount as available.
func Credit(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, chargeID string) error {
	return move(ctx, tx, callerID, currency, amount, Processor, Available, chargeID)
}

// Settle records that a debited refund or payout succeeded: the money left.
func Settle(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, objectID string) error {
	return move(ctx, tx, callerID, currency, amount, Pending, Processor, objectID)
}

// Restore gives a failed refund's or payout's debit back to available.
func Restore(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, objectID string) error {
	return move(ctx, tx, callerID, currency, amount, Pending, Available, objectID)
}

// Debit moves amount from available to pending for the refund or payout
// objectID, created in tx. A balance that does not cover it aborts tx with
// an insufficient_balance problem (declared below), here or, if the
// statement was held for the commit, there.
func Debit(ctx context.Context, tx pgx.Tx, callerID, currency string, amount int64, objectID string) (err error) {
	defer postgres.Wrap(&err, "ledger.Debit(%s, %s, %d)", callerID, currency, amount)
	return queries.DebitLedger(ctx, tx, dbsqlc.DebitLedgerParams{CallerID: callerID, Currency: currency, Amount: amount,
		ID: newEntryID(), ObjectID: objectID})
}

func init() {
	// ledger_debit's refusal: stored and replayed like a decline.
	postgres.Refuse("RS002", InsufficientBalance, "")
}

// rollUpAfter is how many entries past its checkpoint a balance read
// tolerates before it rolls the checkpoint up: what bounds a read's cost.
const rollUpAfter = 1000

// Get returns the caller's balance in every currency it has entries in,
// as the contract shows it: each currency's checkpoint plus the entries
// since. A long tail of entries is rolled up, so that the next read (and
// debit) is short again.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ apigen.Balance, err error) {
	defer postgres.Wrap(&err, "ledger.Get(%s)", callerID)
	rows, err := queries.ListBalances(ctx, db, callerID)
	out := apigen.Balance{Available: []apigen.BalanceAmount{}, Pending: []apigen.BalanceAmount{}}
	for _, b := range rows {
		out.Available = append(out.Available, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Available})
		out.Pending = append(out.Pending, apigen.BalanceAmount{Currency: apigen.Currency(b.Currency), Amount: b.Pending})
		if err == nil && b.SinceEntries > rollUpAfter {
			err = queries.RollUpLedger(ctx, db, dbsqlc.RollUpLedgerParams{CallerID: callerID, Currency: b.Currency})
		}
	}
	return out, err
}

// List returns up to limit of the caller's entries, newest first, after
// the entry startingAfter when it is not empty, and whether more exist.
func List(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int, startingAfter string) (_ []apigen.LedgerEntry, _ bool, err error) {
	defer postgres.Wrap(&err, "ledger.List(%s)", callerID)
	return postgres.Page(limit, startingAfter, "ledger entry of yours",
		func(id string) (postgres.Cursor, error) {
			e, err := queries.GetLedgerEntry(ctx, db, dbsqlc.GetLedgerEntryParams{CallerID: callerID, ID: id})
			return postgres.Cursor{CreatedAt: e.CreatedAt, ID: e.ID}, err
		},
		func(c postgres.Cursor, rowLimit int32) ([]dbsqlc.ListLedgerEntriesRow, error) {
			return queries.ListLedgerEntries(ctx, db, dbsqlc.ListLedgerEntriesParams{CallerID: callerID, RowLimit: rowLimit,
				HasCursor: c.Set, CursorCreatedAt: c.CreatedAt, CursorID: c.ID})
		},
		func(r dbsqlc.ListLedgerEntriesRow) apigen.LedgerEntry {
			return apigen.LedgerEntry{Id: r.ID, ObjectId: r.ObjectID, Amount: r.Amount, Currency: apigen.Currency(r.Currency),
				FromAccount: apigen.LedgerAccount(r.FromAccount), ToAccount: apigen.LedgerAccount(r.ToAccount), CreatedAt: r.CreatedAt}
		})
}
