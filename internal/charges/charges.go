// Package charges charges an order through the card processor, and refunds
// a charge (refunds.go): external effects that cannot join our transaction,
// made exactly-once in effect by atomic phases on the idempotency key
// record. It owns the charges and refunds tables.
//
// A charge:
//
//	started        → create (one transaction): lock the order, check it is
//	                 payable, create the charge row (pending) with the
//	                 downstream key every attempt will send.
//	charge_created → the processor call with that key, outside any
//	                 transaction; no definite answer: stop, nothing stored
//	                 (classify, call.go).
//	               → finish (one transaction): the charge's outcome, the
//	                 order paid, the outbox events, the stored response,
//	                 the record finished.
//
// Lock order: every transaction that writes an order's charges, or the
// order itself (cancel, too), locks the order's row first, so two of them
// queue instead of deadlocking (a create holding the order and waiting on a
// charge's unique index entry, while a finish holds that charge and waits
// for the order).
package charges

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/ledger"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// The contract's operationIds of a charge and a refund: their records' names,
// under which their handlers are registered for resuming.
const (
	OperationCharge = "createCharge"
	OperationRefund = "createRefund"
)

// RecoveryChargeCreated is the point between creating the local charge row
// and recording the processor's answer.
const RecoveryChargeCreated idempotency.RecoveryPoint = "charge_created"

// Status is where a charge or a refund stands: both have these three.
type Status string

const (
	StatusPending   Status = "pending"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
)

// Charge is a charge as the rest of the service sees it (not the sqlc row).
type Charge struct {
	ID             string
	CallerID       string
	OrderID        string
	Amount         int64 // in the currency's minor unit
	AmountRefunded int64 // succeeded and pending refunds together
	Currency       string
	PaymentMethod  string
	Status         Status
	FailureCode    *string // the decline code of a failed charge
	CreatedAt      time.Time
}

// API is the charge as the contract shows it (see orders.Order.API for why
// it is built here).
func (c Charge) API() apigen.Charge {
	return apigen.Charge{Id: c.ID, OrderId: c.OrderID, Amount: c.Amount, Currency: apigen.Currency(c.Currency),
		Status: apigen.ChargeStatus(c.Status), PaymentMethod: c.PaymentMethod, FailureCode: c.FailureCode, CreatedAt: c.CreatedAt}
}

func chargeOf(r dbsqlc.Charge) Charge {
	return Charge{ID: r.ID, CallerID: r.CallerID, OrderID: r.OrderID, Amount: r.Amount, AmountRefunded: r.AmountRefunded,
		Currency: r.Currency, PaymentMethod: r.PaymentMethod, Status: Status(r.Status), FailureCode: r.FailureCode, CreatedAt: r.CreatedAt}
}

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

// Public ids: ch_… and re_….
var newChargeID, newRefundID = postgres.IDs("ch"), postgres.IDs("re")

// The answers of charges and refunds that are not the protocol's.
var (
	OrderNotPayable     = problem.Define("order_not_payable", http.StatusConflict, "Order not payable")
	CardDeclined        = problem.Define("card_declined", http.StatusPaymentRequired, "Card declined")
	NotRefundable       = problem.Define("charge_not_refundable", http.StatusConflict, "Charge not refundable")
	RefundExceedsCharge = problem.Define("refund_exceeds_charge", http.StatusConflict, "Refund exceeds charge")
)

// Service runs charges and refunds.
type Service struct {
	db        *pgxpool.Pool
	processor cardprocessor.Processor
}

// NewService returns a Service that charges and refunds through processor.
func NewService(db *pgxpool.Pool, processor cardprocessor.Processor) *Service {
	return &Service{db: db, processor: processor}
}

type chargeBody struct {
	PaymentMethod string `json:"payment_method"`
}

// ChargeOperation declares createCharge, POST /v1/orders/{order_id}/charges:
// createCharge, then one step that calls the processor and records its answer.
func (s *Service) ChargeOperation() idempotency.Operation {
	return idempotency.External[chargeBody]{
		Name: OperationCharge,
		// An unknown order's 404 is not stored: the key stays free for a
		// corrected request.
		Start: createCharge,
		Steps: map[idempotency.RecoveryPoint]idempotency.Step{RecoveryChargeCreated: s.callForCharge},
	}.Operation()
}

// callForCharge is that step, reading the charge from its row (the
// reconciler runs it too).
func (s *Service) callForCharge(ctx context.Context, l *idempotency.Lease) error {
	rec := l.Record()
	ch, err := queries.GetChargeByKeyRecord(ctx, s.db, dbsqlc.GetChargeByKeyRecordParams{CallerID: rec.CallerID, IdempotencyKeyID: rec.ID})
	if err != nil {
		return fmt.Errorf("load charge of key record %d: %w", rec.ID, err)
	}
	result, err := s.processor.Charge(ctx, ch.DownstreamKey,
		cardprocessor.ChargeRequest{Amount: ch.Amount, Currency: ch.Currency, PaymentMethod: ch.PaymentMethod})
	refusal, err := classify(err, "charge")
	if err != nil {
		return err
	}
	return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
		return finishCharge(ctx, tx, ch, result, refusal)
	})
}

// createCharge, the first phase, checks the order is payable and creates
// the pending charge with its downstream key.
func createCharge(ctx context.Context, tx pgx.Tx, rec idempotency.Record, in idempotency.Input[chargeBody]) (idempotency.Result, error) {
	// The order's row lock orders this phase against a cancel (which takes
	// the same lock) and against other charges of the order.
	if err := orders.Lock(ctx, tx, in.CallerID, in.Path["order_id"]); err != nil {
		return nil, err
	}
	o, err := orders.Get(ctx, tx, in.CallerID, in.Path["order_id"])
	if err != nil {
		return nil, err
	}
	if o.Status != orders.StatusPending {
		return nil, problem.New(OrderNotPayable, "order %s is %s; only a pending order can be charged", o.ID, o.Status)
	}
	// Every attempt of this operation, and no other, sends this key. Derived
	// from the request, not the row, so a retry after a failover that lost
	// the row sends it again (cardprocessor.DownstreamKey).
	downstreamKey, err := cardprocessor.NewDownstreamKey(ctx, tx, rec.CallerID, rec.Key, rec.RequestFingerprint)
	if err != nil {
		return nil, err
	}
	err = queries.CreateCharge(ctx, tx, dbsqlc.CreateChargeParams{
		CallerID: in.CallerID, ID: newChargeID(), OrderID: o.ID, IdempotencyKeyID: rec.ID,
		Amount: o.Amount, Currency: o.Currency, PaymentMethod: in.Body.PaymentMethod, DownstreamKey: downstreamKey,
	})
	if err != nil {
		return nil, err
	}
	return RecoveryChargeCreated, nil
}

func init() {
	// Another key's charge of the order is live. The unique index decides,
	// not a check: two racing keys cannot both get a charge row, so the
	// processor is asked at most once.
	postgres.Refuse("charges_one_live_per_order", OrderNotPayable, "the order already has a charge that is in progress or succeeded")
	// Unreachable under the order's lock (createRefund); the constraint
	// still holds if a future change forgets the lock.
	postgres.Refuse("refunds_within_charge", RefundExceedsCharge, "the refund is more than remains refundable on the charge")
}

// finishCharge is the final phase: record the processor's definite answer.
// If a webhook recorded it first (ApplyChargeEvent), nothing changes, and
// the response is built from the charge as the webhook left it.
func finishCharge(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, result cardprocessor.ChargeResult, refusal error) (idempotency.Result, error) {
	a := Answer{ProcessorChargeID: result.ID, Succeeded: refusal == nil}
	if declined, ok := errors.AsType[*cardprocessor.DeclinedError](refusal); ok {
		a.ProcessorChargeID, a.DeclineCode = declined.ProcessorChargeID, declined.DeclineCode
	}
	cur, err := applyAnswer(ctx, tx, ch, a)
	if err != nil {
		return nil, err
	}
	if Status(cur.Status) == StatusFailed {
		p := problem.New(CardDeclined, "the card was declined (%s); to try another payment method, use a new Idempotency-Key", *cur.FailureCode)
		p.DeclineCode = *cur.FailureCode
		return idempotency.ProblemResponse(p), nil
	}
	return chargeOf(cur).Created()
}

// Created is a charge's successful response, as stored and replayed.
func (c Charge) Created() (*idempotency.Response, error) {
	return idempotency.JSONResponse(http.StatusCreated, http.Header{"Location": {"/v1/charges/" + c.ID}}, c.API())
}

// Answer is the processor's definite answer about a charge.
type Answer struct {
	Succeeded         bool
	ProcessorChargeID string
	DeclineCode       string
	Report            events.Report // what a webhook said besides, checked against the charge
}

// ApplyChargeEvent is the inbox's Applier for charge.succeeded and
// charge.failed. It agrees with the charge's own final phase: whichever
// comes first records the outcome, the other finds it recorded.
func ApplyChargeEvent(ctx context.Context, tx pgx.Tx, callerID string, ev events.ProcessorEvent) (_ bool, err error) {
	defer postgres.Wrap(&err, "charges.ApplyChargeEvent(%s, %q)", callerID, ev.DownstreamKey)
	o := Answer{Succeeded: ev.Type == events.ProcessorChargeSucceeded, ProcessorChargeID: ev.ObjectID, DeclineCode: postgres.Text(ev.DeclineCode),
		Report: events.Report{Amount: ev.Amount, Currency: ev.Currency, ProcessorID: ev.ObjectID}}
	ch, err := queries.GetChargeByDownstreamKey(ctx, tx, dbsqlc.GetChargeByDownstreamKeyParams{CallerID: callerID, DownstreamKey: ev.DownstreamKey})
	if postgres.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = applyAnswer(ctx, tx, ch, o)
	return err == nil, err
}

// applyAnswer moves a pending charge to the answer's outcome, with the order and
// the events, and returns the charge as it now is. A charge already at that
// outcome is left alone; one at the other is a contradiction from the
// processor: an error, not something to paper over.
func applyAnswer(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, o Answer) (dbsqlc.Charge, error) {
	// What a webhook reports is checked before anything is written: a
	// contradiction is set aside, and nothing of it may commit.
	if err := o.Report.Check("charge", ch.ID, ch.Amount, ch.Currency, ch.ProcessorChargeID); err != nil {
		return ch, err
	}
	// The order first (the package comment's lock order). Then the charge
	// moves only if it is still pending: a concurrent finish or webhook may
	// have just recorded it, and then it is read as it is.
	if err := orders.Lock(ctx, tx, ch.CallerID, ch.OrderID); err != nil {
		return ch, err
	}
	code := cmp.Or(o.DeclineCode, "generic_decline") // a failure the processor gave no reason for
	var cur dbsqlc.Charge
	var err error
	if o.Succeeded {
		cur, err = queries.SucceedCharge(ctx, tx, dbsqlc.SucceedChargeParams{CallerID: ch.CallerID, ID: ch.ID, ProcessorChargeID: postgres.Nullable(o.ProcessorChargeID)})
	} else {
		cur, err = queries.FailCharge(ctx, tx, dbsqlc.FailChargeParams{CallerID: ch.CallerID, ID: ch.ID, FailureCode: &code, ProcessorChargeID: postgres.Nullable(o.ProcessorChargeID)})
	}
	if postgres.IsNotFound(err) {
		// Not pending: recorded already, or a contradiction.
		if cur, err = queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: ch.CallerID, ID: ch.ID}); err != nil {
			return ch, err
		}
		if err := o.Report.Check("charge", cur.ID, cur.Amount, cur.Currency, cur.ProcessorChargeID); err != nil {
			return cur, err
		}
		if want := map[bool]Status{true: StatusSucceeded, false: StatusFailed}[o.Succeeded]; Status(cur.Status) != want {
			return cur, &events.ContradictionError{Object: "charge", ID: cur.ID, Field: "status", Recorded: cur.Status, Reported: string(want)}
		}
		return cur, nil // recorded already
	}
	if err != nil {
		return ch, err
	}
	data := map[string]any{"charge_id": ch.ID, "order_id": ch.OrderID, "amount": ch.Amount, "currency": ch.Currency}
	if !o.Succeeded {
		data["failure_code"] = code
		return cur, events.Emit(ctx, tx, ch.CallerID, events.ChargeFailed, data)
	}
	if err := ledger.Credit(ctx, tx, ch.CallerID, ch.Currency, ch.Amount, ch.ID); err != nil {
		return cur, err
	}
	if err := orders.MarkPaid(ctx, tx, ch.CallerID, ch.OrderID); err != nil {
		return cur, err
	}
	// The outbox: the events commit with the change they describe.
	if err := events.Emit(ctx, tx, ch.CallerID, events.ChargeSucceeded, data); err != nil {
		return cur, err
	}
	return cur, events.Emit(ctx, tx, ch.CallerID, events.OrderPaid, data)
}

// HasLiveCharge reports whether the order has a pending or succeeded charge,
// for orders.Cancel, after orders.Lock in the same transaction: the lock
// waits for any charge being created, which this later statement then sees.
func HasLiveCharge(ctx context.Context, tx pgx.Tx, callerID, orderID string) (bool, error) {
	return queries.OrderHasLiveCharge(ctx, tx, dbsqlc.OrderHasLiveChargeParams{CallerID: callerID, OrderID: orderID})
}

// Get returns the caller's charge id.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (_ Charge, err error) {
	ch, err := get(ctx, db, callerID, id)
	return chargeOf(ch), err
}

func get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (ch dbsqlc.Charge, err error) {
	defer postgres.Wrap(&err, "charges.Get(%s, %q)", callerID, id)
	ch, err = queries.GetCharge(ctx, db, dbsqlc.GetChargeParams{CallerID: callerID, ID: id})
	return ch, postgres.NotFound(err, func() error { return problem.New(problem.NotFound, "no charge %q", id) })
}
