// Package charges charges an order through the card processor: an external
// effect that cannot join our transaction, made exactly-once in effect by
// atomic phases on the idempotency key record.
//
//	started        → phase 1 (one transaction): lock the order, check it is
//	                 payable, create the charge row (pending) with the
//	                 downstream key that every attempt will send.
//	charge_created → call the processor with that key, outside any
//	                 transaction. No answer (timeout, 5xx, 429): stop here,
//	                 nothing stored, the next attempt calls again with the
//	                 same key and the processor collapses the calls into
//	                 one effect.
//	               → phase 3 (one transaction): the charge succeeded or
//	                 failed, the order paid, the stored response, the record
//	                 completed (finished).
//
// Lock order: every transaction that writes an order's charges, or the
// order itself (cancel, too), locks the order's row first. With one order
// of acquisition two such transactions queue instead of deadlocking (a
// phase 1 holding the order and waiting on a charge's unique index entry,
// while a phase 3 holds that charge and waits for the order).
package charges

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/faults"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/ids"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/processor"
)

// RecoveryChargeCreated is the point between creating the local charge row
// and recording the processor's answer.
const RecoveryChargeCreated idempotency.RecoveryPoint = "charge_created"

// Charge status values.
const (
	StatusPending   = "pending"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

var queries = dbsqlc.New()

// Request is what a caller asked for.
type Request struct {
	CallerID      string
	OrderID       string
	PaymentMethod string
}

// Render turns the charge into the operation's successful response.
type Render func(dbsqlc.Charge) (*idempotency.Response, error)

// Deps is what running a charge needs.
type Deps struct {
	DB        *pgxpool.Pool
	Processor *ProcessorClient
	Render    Render
	// RenderRefund turns a refund into its operation's successful response.
	RenderRefund RenderRefund
	// Crash is the test facility's crash points (off unless configured).
	Crash faults.CrashPoints
}

// Run drives the charge operation held by l from its recovery point to its
// final response. It is the idempotency.Handler of a charge, for a fresh
// claim and for a takeover alike.
func Run(ctx context.Context, d Deps, l *idempotency.Lease, req Request) error {
	for {
		switch l.RecoveryPoint() {
		case idempotency.RecoveryStarted:
			if err := l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
				return start(ctx, tx, l.Record(), req)
			}); err != nil {
				return err
			}
			d.Crash.Crash(faults.AfterChargeCreated)
		case RecoveryChargeCreated:
			ch, err := queries.GetChargeByKeyRecord(ctx, d.DB, dbsqlc.GetChargeByKeyRecordParams{CallerID: req.CallerID, IdempotencyKeyID: l.Record().ID})
			if err != nil {
				return fmt.Errorf("load charge of key record %d: %w", l.Record().ID, err)
			}
			answer, err := d.Processor.Charge(ctx, ch.DownstreamKey, processor.CreateChargeRequest{
				Amount: ch.Amount, Currency: ch.Currency, PaymentMethod: ch.PaymentMethod,
			})
			d.Crash.Crash(faults.AfterProcessorCall)
			var uncertain *UncertainError
			if errors.As(err, &uncertain) {
				prob := problem.New(problem.ProcessorUnavailable,
					"the card processor did not give a definite answer; retry with the same Idempotency-Key and the charge resumes (it will not be charged twice)")
				prob.RetryAfter = max(1, int(uncertain.RetryAfter/time.Second))
				return errors.Join(prob, err)
			}
			var declined *DeclinedError
			if err != nil && !errors.As(err, &declined) {
				return err
			}
			return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
				res, err := finish(ctx, tx, ch, answer, declined, d.Render)
				if err == nil {
					d.Crash.Crash(faults.BeforeFinalCommit)
				}
				return res, err
			})
		default:
			return fmt.Errorf("charge: unknown recovery point %q", l.RecoveryPoint())
		}
	}
}

// start is phase 1.
func start(ctx context.Context, tx pgx.Tx, rec dbsqlc.IdempotencyKey, req Request) (idempotency.Result, error) {
	// The order's row lock orders this phase against a cancel (which takes
	// the same lock) and against other charges of the order.
	o, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: req.CallerID, ID: req.OrderID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, problem.New(problem.NotFound, "no order %q", req.OrderID)
	}
	if err != nil {
		return nil, err
	}
	if o.Status != "pending" {
		return nil, problem.New(problem.OrderNotPayable, "order %s is %s; only a pending order can be charged", o.ID, o.Status)
	}
	_, err = queries.CreateCharge(ctx, tx, dbsqlc.CreateChargeParams{
		CallerID: req.CallerID, ID: ids.New(ids.Charge), OrderID: o.ID, IdempotencyKeyID: rec.ID,
		Amount: o.Amount, Currency: o.Currency, PaymentMethod: req.PaymentMethod,
		// Derived from the record: every attempt of this operation sends
		// the same key, and no other operation ever does.
		DownstreamKey: fmt.Sprintf("%s-charge-%d", req.CallerID, rec.ID),
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName == "charges_one_live_per_order" {
		// Another key's charge of this order is pending or succeeded. The
		// unique index decided, not a check: two keys racing here cannot
		// both get a charge row, so the processor is asked at most once.
		return nil, problem.New(problem.OrderNotPayable, "order %s already has a charge that is in progress or succeeded", o.ID)
	}
	if err != nil {
		return nil, err
	}
	return RecoveryChargeCreated, nil
}

// finish is phase 3: record the processor's definite answer.
func finish(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, answer processor.Charge, declined *DeclinedError, render Render) (idempotency.Result, error) {
	// The order first: see the lock order in the package comment.
	if _, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: ch.CallerID, ID: ch.OrderID}); err != nil {
		return nil, err
	}
	if declined != nil {
		code := declined.DeclineCode
		if _, err := queries.FailCharge(ctx, tx, dbsqlc.FailChargeParams{
			CallerID: ch.CallerID, ID: ch.ID, FailureCode: &code, ProcessorChargeID: &declined.ProcessorChargeID,
		}); err != nil {
			return nil, err
		}
		if err := events.Record(ctx, tx, ch.CallerID, events.ChargeFailed, map[string]any{
			"charge_id": ch.ID, "order_id": ch.OrderID, "amount": ch.Amount, "currency": ch.Currency, "failure_code": code,
		}); err != nil {
			return nil, err
		}
		p := problem.New(problem.CardDeclined, "the card was declined (%s); to try another payment method, use a new Idempotency-Key", code)
		p.DeclineCode = code
		return idempotency.ProblemResponse(p), nil
	}
	if answer.Status != processor.StatusSucceeded {
		return nil, fmt.Errorf("processor answered 201 with status %q", answer.Status)
	}
	succeeded, err := queries.SucceedCharge(ctx, tx, dbsqlc.SucceedChargeParams{
		CallerID: ch.CallerID, ID: ch.ID, ProcessorChargeID: &answer.ID,
	})
	if err != nil {
		return nil, err
	}
	n, err := queries.MarkOrderPaid(ctx, tx, dbsqlc.MarkOrderPaidParams{CallerID: ch.CallerID, ID: ch.OrderID})
	if err != nil {
		return nil, err
	}
	if n != 1 {
		// Cannot happen: a live charge keeps the order pending (cancel
		// refuses it, and no other charge can exist).
		return nil, fmt.Errorf("order %s was not pending when its charge %s succeeded", ch.OrderID, ch.ID)
	}
	// The outbox: the events commit with the change they describe.
	data := map[string]any{"charge_id": ch.ID, "order_id": ch.OrderID, "amount": ch.Amount, "currency": ch.Currency}
	if err := events.Record(ctx, tx, ch.CallerID, events.ChargeSucceeded, data); err != nil {
		return nil, err
	}
	if err := events.Record(ctx, tx, ch.CallerID, events.OrderPaid, data); err != nil {
		return nil, err
	}
	return render(succeeded)
}

// Get returns the caller's charge id.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (dbsqlc.Charge, error) {
	ch, err := queries.GetCharge(ctx, db, dbsqlc.GetChargeParams{CallerID: callerID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return ch, problem.New(problem.NotFound, "no charge %q", id)
	}
	return ch, err
}
