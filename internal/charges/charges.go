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
	"strings"
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
			ch, err := queries.GetChargeByKeyRecord(ctx, d.DB, dbsqlc.GetChargeByKeyRecordParams{CallerID: l.Record().CallerID, IdempotencyKeyID: l.Record().ID})
			if err != nil {
				return unresolved(fmt.Errorf("load charge of key record %d: %w", l.Record().ID, err))
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
				return unresolved(err)
			}
			return unresolved(l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
				res, err := finish(ctx, tx, ch, answer, declined, d.Render)
				if err == nil {
					d.Crash.Crash(faults.BeforeFinalCommit)
				}
				return res, err
			}))
		default:
			return fmt.Errorf("charge: unknown recovery point %q", l.RecoveryPoint())
		}
	}
}

// unresolved keeps an unexpected failure after the processor may have
// acted from becoming a final answer. Stored as a 500, it would leave the
// charge pending for ever, its outcome never recorded; instead the
// operation stays resumable (a 503 for the client), and if it keeps
// failing the reconciler sets it aside for a person. Problems that are
// outcomes (a decline, a conflict) and a lost lease pass through.
func unresolved(err error) error {
	var p *problem.Error
	if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.As(err, &p) {
		return err
	}
	prob := problem.New(problem.ServiceUnavailable,
		"the operation could not be completed now; retry with the same Idempotency-Key and it resumes")
	prob.RetryAfter = 1
	return errors.Join(prob, err)
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
	id := ids.New(ids.Charge)
	_, err = queries.CreateCharge(ctx, tx, dbsqlc.CreateChargeParams{
		CallerID: req.CallerID, ID: id, OrderID: o.ID, IdempotencyKeyID: rec.ID,
		Amount: o.Amount, Currency: o.Currency, PaymentMethod: req.PaymentMethod,
		// Fixed here, with the row: every attempt of this operation sends
		// the same key, and no other operation ever does.
		DownstreamKey: downstreamKey(req.CallerID, id),
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

// finish is phase 3: record the processor's definite answer. A webhook may
// have recorded it first (see ApplyChargeOutcome); then there is nothing
// left to change, and the stored response is built from the charge as the
// webhook left it.
func finish(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, answer processor.Charge, declined *DeclinedError, render Render) (idempotency.Result, error) {
	outcome := Outcome{ProcessorChargeID: answer.ID, Succeeded: declined == nil}
	if declined != nil {
		outcome.ProcessorChargeID, outcome.DeclineCode = declined.ProcessorChargeID, declined.DeclineCode
	} else if answer.Status != processor.StatusSucceeded {
		return nil, fmt.Errorf("processor answered 201 with status %q", answer.Status)
	}
	cur, err := applyOutcome(ctx, tx, ch, outcome)
	if err != nil {
		return nil, err
	}
	if cur.Status == StatusFailed {
		p := problem.New(problem.CardDeclined, "the card was declined (%s); to try another payment method, use a new Idempotency-Key", *cur.FailureCode)
		p.DeclineCode = *cur.FailureCode
		return idempotency.ProblemResponse(p), nil
	}
	return render(cur)
}

// ContradictionError is a processor report that contradicts a final state
// already recorded: a charge recorded as failed now reported succeeded, or
// the other way round. It is found before anything is written. Nothing is
// ever changed on such a report; a person must look.
type ContradictionError struct {
	Object, ID         string // "charge" or "refund", and its id
	Recorded, Reported string // the statuses
}

func (e *ContradictionError) Error() string {
	return fmt.Sprintf("%s %s is recorded as %s but the processor reports %s", e.Object, e.ID, e.Recorded, e.Reported)
}

// Outcome is the processor's definite answer about a charge.
type Outcome struct {
	Succeeded         bool
	ProcessorChargeID string
	DeclineCode       string
}

// ApplyChargeOutcome records the outcome of the charge made under
// downstreamKey, as reported by a processor webhook. It reports false for a
// charge we do not know. It is idempotent, and agrees with phase 3 of the
// charge's own operation: whichever comes first records the outcome, the
// other finds it recorded.
func ApplyChargeOutcome(ctx context.Context, tx pgx.Tx, callerID, downstreamKey string, o Outcome) (bool, error) {
	ch, err := queries.GetChargeByDownstreamKey(ctx, tx, dbsqlc.GetChargeByDownstreamKeyParams{CallerID: callerID, DownstreamKey: downstreamKey})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = applyOutcome(ctx, tx, ch, o)
	return err == nil, err
}

// applyOutcome moves a pending charge to its outcome, with the order and
// the events, and returns the charge as it now is. A charge already at that
// outcome is left alone; one at the other outcome is a contradiction from
// the processor, which is an error, not something to paper over.
func applyOutcome(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, o Outcome) (dbsqlc.Charge, error) {
	// The order first: see the lock order in the package comment. After the
	// lock, read the charge again: a concurrent phase 3 or webhook may have
	// just recorded the outcome.
	if _, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: ch.CallerID, ID: ch.OrderID}); err != nil {
		return ch, err
	}
	cur, err := queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: ch.CallerID, ID: ch.ID})
	if err != nil {
		return ch, err
	}
	want := StatusFailed
	if o.Succeeded {
		want = StatusSucceeded
	}
	switch cur.Status {
	case want:
		return cur, nil // recorded already
	case StatusPending:
	default:
		return cur, &ContradictionError{Object: "charge", ID: cur.ID, Recorded: cur.Status, Reported: want}
	}

	data := map[string]any{"charge_id": ch.ID, "order_id": ch.OrderID, "amount": ch.Amount, "currency": ch.Currency}
	if !o.Succeeded {
		code := o.DeclineCode
		if code == "" {
			code = "generic_decline" // a failure the processor gave no reason for
		}
		if cur, err = queries.FailCharge(ctx, tx, dbsqlc.FailChargeParams{
			CallerID: ch.CallerID, ID: ch.ID, FailureCode: &code, ProcessorChargeID: &o.ProcessorChargeID,
		}); err != nil {
			return cur, err
		}
		data["failure_code"] = code
		return cur, events.Record(ctx, tx, ch.CallerID, events.ChargeFailed, data)
	}
	if cur, err = queries.SucceedCharge(ctx, tx, dbsqlc.SucceedChargeParams{
		CallerID: ch.CallerID, ID: ch.ID, ProcessorChargeID: &o.ProcessorChargeID,
	}); err != nil {
		return cur, err
	}
	n, err := queries.MarkOrderPaid(ctx, tx, dbsqlc.MarkOrderPaidParams{CallerID: ch.CallerID, ID: ch.OrderID})
	if err != nil {
		return cur, err
	}
	if n != 1 {
		// Cannot happen: a live charge keeps the order pending (cancel
		// refuses it, and no other charge can exist).
		return cur, fmt.Errorf("order %s was not pending when its charge %s succeeded", ch.OrderID, ch.ID)
	}
	// The outbox: the events commit with the change they describe.
	if err := events.Record(ctx, tx, ch.CallerID, events.ChargeSucceeded, data); err != nil {
		return cur, err
	}
	return cur, events.Record(ctx, tx, ch.CallerID, events.OrderPaid, data)
}

// downstreamKey is the Idempotency-Key sent to the processor for the
// charge or refund objectID (ch_… or re_…): "<caller>-<objectID>". The
// object id is random, so no two operations ever share a key, even across
// a restore of the database (a sequence would hand out used numbers again,
// and the processor would replay an old charge). The caller's id in it lets
// a webhook, which carries the key, find the caller whose rows it is about.
func downstreamKey(callerID, objectID string) string {
	return callerID + "-" + objectID
}

// CallerOfDownstreamKey returns the caller a downstream key belongs to.
func CallerOfDownstreamKey(key string) (string, bool) {
	for _, prefix := range []string{"-" + ids.Charge + "_", "-" + ids.Refund + "_"} {
		if i := strings.LastIndex(key, prefix); i > 0 {
			return key[:i], true
		}
	}
	return "", false
}

// Get returns the caller's charge id.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (dbsqlc.Charge, error) {
	ch, err := queries.GetCharge(ctx, db, dbsqlc.GetChargeParams{CallerID: callerID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return ch, problem.New(problem.NotFound, "no charge %q", id)
	}
	return ch, err
}
