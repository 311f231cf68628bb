package charges

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/ids"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/processor"
)

// A refund follows the charge's pattern:
//
//	started        → phase 1: lock the order, reserve the amount on the
//	                 charge (a CHECK constraint keeps the reservations
//	                 within the charged amount), create the refund row
//	                 (pending) with its downstream key.
//	refund_created → call the processor; no definite answer: stop here.
//	               → phase 3: the refund succeeded, the stored response.

// RecoveryRefundCreated is the point between creating the local refund row
// and recording the processor's answer.
const RecoveryRefundCreated idempotency.RecoveryPoint = "refund_created"

// RefundRequest is what a caller asked for; a nil Amount refunds what
// remains.
type RefundRequest struct {
	CallerID string
	ChargeID string
	Amount   *int64
}

// RenderRefund turns the refund into the operation's successful response.
type RenderRefund func(dbsqlc.Refund) (*idempotency.Response, error)

// RunRefund drives the refund operation held by l from its recovery point
// to its final response.
func RunRefund(ctx context.Context, d Deps, l *idempotency.Lease, req RefundRequest) error {
	for {
		switch l.RecoveryPoint() {
		case idempotency.RecoveryStarted:
			if err := l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
				return startRefund(ctx, tx, l.Record(), req)
			}); err != nil {
				return err
			}
		case RecoveryRefundCreated:
			re, err := queries.GetRefundByKeyRecord(ctx, d.DB, dbsqlc.GetRefundByKeyRecordParams{CallerID: l.Record().CallerID, IdempotencyKeyID: l.Record().ID})
			if err != nil {
				return unresolved(fmt.Errorf("load refund of key record %d: %w", l.Record().ID, err))
			}
			ch, err := queries.GetCharge(ctx, d.DB, dbsqlc.GetChargeParams{CallerID: re.CallerID, ID: re.ChargeID})
			if err != nil {
				return unresolved(err)
			}
			answer, err := d.Processor.Refund(ctx, re.DownstreamKey, processor.CreateRefundRequest{
				Charge: *ch.ProcessorChargeID, Amount: re.Amount,
			})
			var uncertain *UncertainError
			if errors.As(err, &uncertain) {
				prob := problem.New(problem.ProcessorUnavailable,
					"the card processor did not give a definite answer; retry with the same Idempotency-Key and the refund resumes (it will not be refunded twice)")
				prob.RetryAfter = max(1, int(uncertain.RetryAfter.Seconds()))
				return errors.Join(prob, err)
			}
			var refused *RefusedError
			if err != nil && !errors.As(err, &refused) {
				return unresolved(err)
			}
			return unresolved(l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
				return finishRefund(ctx, tx, ch, re, answer, refused, d.RenderRefund)
			}))
		default:
			return fmt.Errorf("refund: unknown recovery point %q", l.RecoveryPoint())
		}
	}
}

func startRefund(ctx context.Context, tx pgx.Tx, rec dbsqlc.IdempotencyKey, req RefundRequest) (idempotency.Result, error) {
	ch, err := queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: req.CallerID, ID: req.ChargeID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, problem.New(problem.NotFound, "no charge %q", req.ChargeID)
	}
	if err != nil {
		return nil, err
	}
	// The order first (see the lock order in the package comment), then
	// the charge as it is now: concurrent refunds of one charge queue here.
	if _, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: ch.CallerID, ID: ch.OrderID}); err != nil {
		return nil, err
	}
	if ch, err = queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: req.CallerID, ID: req.ChargeID}); err != nil {
		return nil, err
	}
	remaining := ch.Amount - ch.AmountRefunded
	switch {
	case ch.Status != StatusSucceeded:
		return nil, problem.New(problem.ChargeNotRefundable, "charge %s is %s; only a succeeded charge can be refunded", ch.ID, ch.Status)
	case remaining == 0:
		return nil, problem.New(problem.ChargeNotRefundable, "charge %s is already fully refunded", ch.ID)
	}
	amount := remaining
	if req.Amount != nil {
		amount = *req.Amount
	}
	if amount > remaining {
		return nil, problem.New(problem.RefundExceedsCharge, "the refund of %d is more than the %d that remains refundable on charge %s", amount, remaining, ch.ID)
	}
	_, err = queries.ReserveRefund(ctx, tx, dbsqlc.ReserveRefundParams{Amount: amount, CallerID: ch.CallerID, ID: ch.ID})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName == "refunds_within_charge" {
		// The lock above makes this unreachable; the constraint is the
		// guarantee that holds even if a future change forgets the lock.
		return nil, problem.New(problem.RefundExceedsCharge, "the refund is more than remains refundable on charge %s", ch.ID)
	}
	if err != nil {
		return nil, err
	}
	id := ids.New(ids.Refund)
	if _, err := queries.CreateRefund(ctx, tx, dbsqlc.CreateRefundParams{
		CallerID: ch.CallerID, ID: id, ChargeID: ch.ID, IdempotencyKeyID: rec.ID,
		Amount: amount, DownstreamKey: downstreamKey(ch.CallerID, id),
	}); err != nil {
		return nil, err
	}
	return RecoveryRefundCreated, nil
}

func finishRefund(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, re dbsqlc.Refund, answer processor.Refund, refused *RefusedError, render RenderRefund) (idempotency.Result, error) {
	if refused != nil {
		// Definitely not refunded: give the reservation back.
		if _, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: ch.CallerID, ID: ch.OrderID}); err != nil {
			return nil, err
		}
		if _, err := queries.FailRefund(ctx, tx, dbsqlc.FailRefundParams{CallerID: re.CallerID, ID: re.ID}); err != nil {
			return nil, err
		}
		if err := queries.ReleaseRefund(ctx, tx, dbsqlc.ReleaseRefundParams{Amount: re.Amount, CallerID: ch.CallerID, ID: ch.ID}); err != nil {
			return nil, err
		}
		return idempotency.ProblemResponse(problem.New(problem.ChargeNotRefundable, "the processor refused the refund (%s)", refused.Code)), nil
	}
	succeeded, err := applyRefundSucceeded(ctx, tx, ch, re, answer.ID)
	if err != nil {
		return nil, err
	}
	return render(succeeded)
}

// ApplyRefundSucceeded records that the refund made under downstreamKey
// succeeded, as reported by a processor webhook; false for a refund we do
// not know. Like ApplyChargeOutcome it is idempotent and agrees with the
// refund's own phase 3.
func ApplyRefundSucceeded(ctx context.Context, tx pgx.Tx, callerID, downstreamKey, processorRefundID string) (bool, error) {
	re, err := queries.GetRefundByDownstreamKey(ctx, tx, dbsqlc.GetRefundByDownstreamKeyParams{CallerID: callerID, DownstreamKey: downstreamKey})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ch, err := queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: re.CallerID, ID: re.ChargeID})
	if err != nil {
		return false, err
	}
	_, err = applyRefundSucceeded(ctx, tx, ch, re, processorRefundID)
	return err == nil, err
}

// applyRefundSucceeded moves a pending refund to succeeded, with its event,
// and returns it as it now is; an already succeeded refund is left alone.
func applyRefundSucceeded(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, re dbsqlc.Refund, processorRefundID string) (dbsqlc.Refund, error) {
	if _, err := queries.LockOrder(ctx, tx, dbsqlc.LockOrderParams{CallerID: ch.CallerID, ID: ch.OrderID}); err != nil {
		return re, err
	}
	cur, err := queries.GetRefundByKeyRecord(ctx, tx, dbsqlc.GetRefundByKeyRecordParams{CallerID: re.CallerID, IdempotencyKeyID: re.IdempotencyKeyID})
	if err != nil {
		return re, err
	}
	switch cur.Status {
	case StatusSucceeded:
		return cur, nil // recorded already
	case StatusPending:
	default:
		return cur, &ContradictionError{Object: "refund", ID: cur.ID, Recorded: cur.Status, Reported: StatusSucceeded}
	}
	if cur, err = queries.SucceedRefund(ctx, tx, dbsqlc.SucceedRefundParams{CallerID: re.CallerID, ID: re.ID, ProcessorRefundID: &processorRefundID}); err != nil {
		return cur, err
	}
	return cur, events.Record(ctx, tx, re.CallerID, events.RefundSucceeded, map[string]any{
		"refund_id": re.ID, "charge_id": ch.ID, "order_id": ch.OrderID, "amount": re.Amount, "currency": ch.Currency,
	})
}
