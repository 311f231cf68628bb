// Package orders holds the order rules: creation, lookup, listing and
// cancellation. Functions take the connection or transaction to run on, so
// the idempotency layer can put an order's insert and its stored response
// in one transaction.
package orders

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// Order is an order as the rest of the service sees it (not the sqlc row).
type Order struct {
	ID          string
	CallerID    string
	Amount      int64 // in the currency's minor unit
	Currency    string
	Description *string
	Status      Status
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Status is where an order stands.
type Status string

const (
	StatusPending  Status = "pending"
	StatusPaid     Status = "paid"
	StatusCanceled Status = "canceled"
)

// API is the order as the contract shows it. Each domain package converts
// its own objects, not the HTTP layer: a keyed operation stores its response
// in the transaction that makes its effect, so it must be built there; reads
// use the same conversion, so a replay and a GET never disagree.
func (o Order) API() apigen.Order {
	return apigen.Order{Id: o.ID, Amount: o.Amount, Currency: apigen.Currency(o.Currency), Description: o.Description,
		Status: apigen.OrderStatus(o.Status), CreatedAt: o.CreatedAt}
}

func orderOf(r dbsqlc.Order) Order {
	return Order{ID: r.ID, CallerID: r.CallerID, Amount: r.Amount, Currency: r.Currency, Description: r.Description,
		Status: Status(r.Status), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

var newOrderID = postgres.IDs("ord") // ord_…

// NotCancelable answers a cancel of a paid order, or of one being charged.
var NotCancelable = problem.Define("order_not_cancelable", http.StatusConflict, "Order not cancelable")

// NewOrder is the body of POST /v1/orders, validated against the contract.
type NewOrder struct {
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Description *string `json:"description"`
}

// CreateOperation declares createOrder, POST /v1/orders: a local operation,
// so the order and its key's completed record, with this answer, commit in
// one transaction; a crash before it leaves nothing, and the retry runs afresh.
var CreateOperation = idempotency.Local("createOrder", func(ctx context.Context, tx pgx.Tx, in idempotency.Input[NewOrder]) (*idempotency.Response, error) {
	o, err := Create(ctx, tx, in.CallerID, in.Body)
	if err != nil {
		return nil, err
	}
	return idempotency.JSONResponse(http.StatusCreated, http.Header{"Location": {"/v1/orders/" + o.ID}}, o.API())
})

// Create inserts a pending order for callerID.
func Create(ctx context.Context, db dbsqlc.DBTX, callerID string, n NewOrder) (_ Order, err error) {
	defer postgres.Wrap(&err, "orders.Create(%s)", callerID)
	o, err := queries.CreateOrder(ctx, db, dbsqlc.CreateOrderParams{CallerID: callerID, ID: newOrderID(),
		Amount: n.Amount, Currency: n.Currency, Description: n.Description})
	return orderOf(o), err
}

// GetOperation declares getOrder, GET /v1/orders/{order_id}: a read,
// served from this declaration (idempotency.Safe) with no handler.
var GetOperation = idempotency.Safe("getOrder", func(ctx context.Context, db dbsqlc.DBTX, in idempotency.Input[struct{}]) (*idempotency.Response, error) {
	o, err := Get(ctx, db, in.CallerID, in.Path["order_id"])
	if err != nil {
		return nil, err
	}
	return idempotency.JSONResponse(http.StatusOK, nil, o.API())
})

// Get returns the caller's order id. Another caller's order is "not found",
// exactly like one that does not exist, so ids leak nothing across tenants.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (_ Order, err error) {
	defer postgres.Wrap(&err, "orders.Get(%s, %q)", callerID, id)
	o, err := queries.GetOrder(ctx, db, dbsqlc.GetOrderParams{CallerID: callerID, ID: id})
	return orderOf(o), postgres.NotFound(err, func() error { return problem.New(problem.NotFound, "no order %q", id) })
}

// List returns up to limit of the caller's orders, newest first, starting
// after the order startingAfter when it is not empty, and whether more exist.
func List(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int, startingAfter string) (_ []Order, _ bool, err error) {
	defer postgres.Wrap(&err, "orders.List(%s)", callerID)
	return postgres.Page(limit, startingAfter, "order of yours",
		func(id string) (postgres.Cursor, error) {
			o, err := queries.GetOrder(ctx, db, dbsqlc.GetOrderParams{CallerID: callerID, ID: id})
			return postgres.Cursor{CreatedAt: o.CreatedAt, ID: o.ID}, err
		},
		func(c postgres.Cursor, rowLimit int32) ([]dbsqlc.Order, error) {
			return queries.ListOrders(ctx, db, dbsqlc.ListOrdersParams{CallerID: callerID, RowLimit: rowLimit,
				HasCursor: c.Set, CursorCreatedAt: c.CreatedAt, CursorID: c.ID})
		}, orderOf)
}

// Lock locks the caller's order id until tx ends: every transaction that
// changes an order or its charges takes it first, so they queue instead of
// deadlocking (see package charges). It reads nothing, and a missing order
// is no error; Get after it, in tx, reads the order as the lock's last
// holder left it.
func Lock(ctx context.Context, tx pgx.Tx, callerID, id string) (err error) {
	defer postgres.Wrap(&err, "orders.Lock(%s, %q)", callerID, id)
	return queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: callerID, ID: id})
}

// MarkPaid moves the caller's pending order to paid, in the transaction
// that records its charge's success (which holds the order's lock).
func MarkPaid(ctx context.Context, tx pgx.Tx, callerID, id string) (err error) {
	defer postgres.Wrap(&err, "orders.MarkPaid(%s, %q)", callerID, id)
	return queries.MarkOrderPaid(ctx, tx, dbsqlc.MarkOrderPaidParams{CallerID: callerID, ID: id})
}

// A LiveCharges says, inside tx, whether the caller's order has a pending or
// succeeded charge: charges.HasLiveCharge, as charges are its rows.
type LiveCharges func(ctx context.Context, tx pgx.Tx, callerID, orderID string) (bool, error)

// Cancel cancels the caller's order; a canceled order is returned unchanged.
// A paid order, or one with a charge in progress (as live says), cannot be.
// It locks the order first, as creating a charge does: a charge being
// created is waited for, and the check after (a new statement, so a new
// snapshot) sees it. Without the lock, it could miss a charge committed a
// moment later and cancel an order about to be charged.
func Cancel(ctx context.Context, pool *pgxpool.Pool, callerID, id string, live LiveCharges) (o Order, err error) {
	defer postgres.Wrap(&err, "orders.Cancel(%s, %q)", callerID, id)
	err = postgres.TransactPipelined(ctx, pool, func(tx *postgres.PipelinedTx) error {
		if err := Lock(ctx, tx, callerID, id); err != nil {
			return err
		}
		var err error
		if o, err = Get(ctx, tx, callerID, id); err != nil {
			return err
		}
		switch o.Status {
		case StatusCanceled:
			return nil
		case StatusPaid:
			return problem.New(NotCancelable, "order %s is paid; only a pending order can be canceled", id)
		}
		charged, err := live(ctx, tx, callerID, id)
		if err != nil {
			return err
		}
		if charged {
			return problem.New(NotCancelable, "order %s has a charge in progress; it cannot be canceled", id)
		}
		canceled, err := queries.CancelOrder(ctx, tx, dbsqlc.CancelOrderParams{CallerID: callerID, ID: id})
		o = orderOf(canceled)
		return err
	})
	return o, err
}
