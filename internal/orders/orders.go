// Package orders holds the order rules: creation, lookup, listing and
// cancellation. Functions take the connection or transaction to run on, so
// the idempotency layer can put an order's insert and its stored response in
// one transaction.
package orders

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/ids"
	"github.com/retrysafe/payments/internal/problem"
)

// Order status values.
const (
	StatusPending  = "pending"
	StatusPaid     = "paid"
	StatusCanceled = "canceled"
)

var queries = dbsqlc.New() // stateless: sqlc's queries take the connection per call

// NewOrder is what a caller asks for. Amount and currency were validated
// against the contract before any of this runs.
type NewOrder struct {
	Amount      int64
	Currency    string
	Description *string
}

// Create inserts a pending order for callerID.
func Create(ctx context.Context, db dbsqlc.DBTX, callerID string, n NewOrder) (dbsqlc.Order, error) {
	return queries.CreateOrder(ctx, db, dbsqlc.CreateOrderParams{
		CallerID: callerID, ID: ids.New(ids.Order),
		Amount: n.Amount, Currency: n.Currency, Description: n.Description,
	})
}

// Get returns the caller's order id. Another caller's order is "not found",
// exactly like one that does not exist, so ids leak nothing across tenants.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (dbsqlc.Order, error) {
	o, err := queries.GetOrder(ctx, db, dbsqlc.GetOrderParams{CallerID: callerID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return o, problem.New(problem.NotFound, "no order %q", id)
	}
	return o, err
}

// List returns up to limit of the caller's orders, newest first, starting
// after the order startingAfter when it is not empty, and whether more exist.
func List(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int, startingAfter string) ([]dbsqlc.Order, bool, error) {
	p := dbsqlc.ListOrdersParams{CallerID: callerID, RowLimit: int32(limit) + 1}
	if startingAfter != "" {
		cursor, err := queries.GetOrder(ctx, db, dbsqlc.GetOrderParams{CallerID: callerID, ID: startingAfter})
		if errors.Is(err, pgx.ErrNoRows) {
			e := problem.New(problem.InvalidRequest, "starting_after names no order of yours")
			e.Errors = []problem.FieldError{{Field: "starting_after", Message: "no such order"}}
			return nil, false, e
		}
		if err != nil {
			return nil, false, err
		}
		p.HasCursor, p.CursorCreatedAt, p.CursorID = true, cursor.CreatedAt, cursor.ID
	}
	rows, err := queries.ListOrders(ctx, db, p)
	if err != nil {
		return nil, false, err
	}
	// One extra row was asked for: its presence is has_more.
	if len(rows) > limit {
		return rows[:limit], true, nil
	}
	return rows, false, nil
}

// Cancel cancels the caller's order. It is naturally idempotent: canceling a
// canceled order returns it unchanged. A paid order cannot be canceled.
//
// The UPDATE is the decision (only a pending row matches), so a charge that
// pays the order concurrently cannot slip between a check and a write.
func Cancel(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (dbsqlc.Order, error) {
	o, err := queries.CancelOrder(ctx, db, dbsqlc.CancelOrderParams{CallerID: callerID, ID: id})
	if !errors.Is(err, pgx.ErrNoRows) {
		return o, err
	}
	if o, err = Get(ctx, db, callerID, id); err != nil {
		return o, err
	}
	if o.Status == StatusCanceled {
		return o, nil
	}
	return o, problem.New(problem.OrderNotCancelable, "order %s is %s; only a pending order can be canceled", id, o.Status)
}
