// Refunds return money from a succeeded charge, in full or in part,
// following the charge's pattern and lock order (see the package comment):
//
//	started        → createRefund (one transaction): lock the order, reserve
//	                 the amount on the charge (a CHECK keeps reservations
//	                 within the charged amount) and take it from the balance
//	                 (another keeps that from going negative), create the
//	                 refund row (pending) with its downstream key.
//	refund_created → the processor call with that key (classify, call.go);
//	                 no definite answer: stop here, nothing stored.
//	               → finishRefund (one transaction): the refund succeeded
//	                 (or was refused, and its reservation given back), the
//	                 outbox event, the stored response.

package charges

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

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

// RecoveryRefundCreated is the point between creating the local refund row
// and recording the processor's answer.
const RecoveryRefundCreated idempotency.RecoveryPoint = "refund_created"

// Refund is a refund, as the rest of the service sees it.
type Refund struct {
	ID        string
	CallerID  string
	ChargeID  string
	Amount    int64
	Status    Status
	CreatedAt time.Time
}

// API is the refund as the contract shows it.
func (r Refund) API() apigen.Refund {
	return apigen.Refund{Id: r.ID, ChargeId: r.ChargeID, Amount: r.Amount, Status: apigen.RefundStatus(r.Status), CreatedAt: r.CreatedAt}
}

// Created is a refund's successful response, as stored and replayed.
func (r Refund) Created() (*idempotency.Response, error) {
	return idempotency.JSONResponse(http.StatusCreated, http.Header{"Location": {"/v1/charges/" + r.ChargeID}}, r.API())
}

func refundOf(r dbsqlc.Refund) Refund {
	return Refund{ID: r.ID, CallerID: r.CallerID, ChargeID: r.ChargeID, Amount: r.Amount, Status: Status(r.Status), CreatedAt: r.CreatedAt}
}

// refundBody is a refund request's body; no amount refunds what remains.
type refundBody struct {
	Amount *int64 `json:"amount"`
}

// RefundOperation declares createRefund, POST /v1/charges/{charge_id}/refunds,
// as ChargeOperation does createCharge.
func (s *Service) RefundOperation() idempotency.Operation {
	return idempotency.External[refundBody]{
		Name:  OperationRefund,
		Start: createRefund, // an unknown charge's 404 is not stored

		Steps: map[idempotency.RecoveryPoint]idempotency.Step{RecoveryRefundCreated: s.callForRefund},
	}.Operation()
}

// callForRefund is callForCharge's counterpart, from the refund's row.
func (s *Service) callForRefund(ctx context.Context, l *idempotency.Lease) error {
	rec := l.Record()
	re, err := queries.GetRefundByKeyRecord(ctx, s.db, dbsqlc.GetRefundByKeyRecordParams{CallerID: rec.CallerID, IdempotencyKeyID: rec.ID})
	if err != nil {
		return fmt.Errorf("load refund of key record %d: %w", rec.ID, err)
	}
	ch, err := queries.GetCharge(ctx, s.db, dbsqlc.GetChargeParams{CallerID: re.CallerID, ID: re.ChargeID})
	if err != nil {
		return fmt.Errorf("load charge %s of refund %s: %w", re.ChargeID, re.ID, err)
	}
	if ch.ProcessorChargeID == nil {
		// createRefund refuses such a charge: this is an older record, or
		// damaged data, for a person to look at.
		return fmt.Errorf("charge %s of refund %s has no processor charge id", ch.ID, re.ID)
	}
	result, err := s.processor.Refund(ctx, re.DownstreamKey, cardprocessor.RefundRequest{Charge: *ch.ProcessorChargeID, Amount: re.Amount})
	refusal, err := classify(err, "refund")
	if err != nil {
		return err
	}
	return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
		return finishRefund(ctx, tx, ch, re, result, refusal)
	})
}

// createRefund is the first phase.
func createRefund(ctx context.Context, tx pgx.Tx, rec idempotency.Record, in idempotency.Input[refundBody]) (idempotency.Result, error) {
	callerID, chargeID := in.CallerID, in.Path["charge_id"]
	ch, err := get(ctx, tx, callerID, chargeID)
	if err != nil {
		return nil, err
	}
	// The order first (the lock order), then the charge as it is now:
	// concurrent refunds of one charge queue here.
	if err := orders.Lock(ctx, tx, ch.CallerID, ch.OrderID); err != nil {
		return nil, err
	}
	if ch, err = queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: callerID, ID: chargeID}); err != nil {
		return nil, err
	}
	remaining := ch.Amount - ch.AmountRefunded
	switch {
	case Status(ch.Status) != StatusSucceeded:
		return nil, problem.New(NotRefundable, "charge %s is %s; only a succeeded charge can be refunded", ch.ID, ch.Status)
	case remaining == 0:
		return nil, problem.New(NotRefundable, "charge %s is already fully refunded", ch.ID)
	case ch.ProcessorChargeID == nil:
		// A success reported without the processor's id: nothing to name
		// in a refund request, so refuse before reserving anything.
		return nil, problem.New(NotRefundable, "charge %s has no processor charge id to refund against", ch.ID)
	}
	amount := remaining
	if in.Body.Amount != nil {
		amount = *in.Body.Amount
	}
	if amount > remaining {
		return nil, problem.New(RefundExceedsCharge, "the refund of %d is more than the %d that remains refundable on charge %s", amount, remaining, ch.ID)
	}
	// (refunds_within_charge refuses too much, should the lock above be forgotten.)
	if _, err = queries.ReserveRefund(ctx, tx, dbsqlc.ReserveRefundParams{Amount: amount, CallerID: ch.CallerID, ID: ch.ID}); err != nil {
		return nil, err
	}
	// Derived from the request, not the row (cardprocessor.DownstreamKey).
	downstreamKey, err := cardprocessor.NewDownstreamKey(ctx, tx, rec.CallerID, rec.Key, rec.RequestFingerprint)
	if err != nil {
		return nil, err
	}
	id := newRefundID()
	if _, err := queries.CreateRefund(ctx, tx, dbsqlc.CreateRefundParams{CallerID: ch.CallerID, ID: id,
		ChargeID: ch.ID, IdempotencyKeyID: rec.ID, Amount: amount, DownstreamKey: downstreamKey}); err != nil {
		return nil, err
	}
	// Out of the balance too, last (it locks the caller's balance until the
	// commit): money already paid out cannot be refunded again.
	if err := ledger.Debit(ctx, tx, ch.CallerID, ch.Currency, amount, id); err != nil {
		return nil, err
	}
	return RecoveryRefundCreated, nil
}

// finishRefund is the final phase: record the processor's definite answer.
func finishRefund(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, re dbsqlc.Refund, result cardprocessor.RefundResult, refusal error) (idempotency.Result, error) {
	if refusal != nil {
		// A definite "no" of any kind (classify lets through no
		// other): not refunded, so give the reservation back.
		if err := orders.Lock(ctx, tx, ch.CallerID, ch.OrderID); err != nil {
			return nil, err
		}
		if _, err := queries.FailRefund(ctx, tx, dbsqlc.FailRefundParams{CallerID: re.CallerID, ID: re.ID}); err != nil {
			return nil, err
		}
		if err := queries.ReleaseRefund(ctx, tx, dbsqlc.ReleaseRefundParams{Amount: re.Amount, CallerID: ch.CallerID, ID: ch.ID}); err != nil {
			return nil, err
		}
		if err := ledger.Restore(ctx, tx, ch.CallerID, ch.Currency, re.Amount, re.ID); err != nil {
			return nil, err
		}
		return idempotency.ProblemResponse(problem.New(NotRefundable, "the processor refused the refund (%s)", cardprocessor.RefusalCode(refusal))), nil
	}
	succeeded, err := refundSucceeded(ctx, tx, ch, re, events.Report{ProcessorID: result.ID})
	if err != nil {
		return nil, err
	}
	return refundOf(succeeded).Created()
}

// ListRefunds returns up to limit of the caller's refunds of chargeID,
// oldest first, after the refund startingAfter when it is not empty, and
// whether more exist. An unknown charge is not found.
func ListRefunds(ctx context.Context, db dbsqlc.DBTX, callerID, chargeID string, limit int, startingAfter string) (_ []Refund, _ bool, err error) {
	defer postgres.Wrap(&err, "charges.ListRefunds(%s, %q)", callerID, chargeID)
	if _, err := get(ctx, db, callerID, chargeID); err != nil {
		return nil, false, err
	}
	return postgres.Page(limit, startingAfter, "refund of this charge",
		func(id string) (postgres.Cursor, error) {
			re, err := queries.GetRefund(ctx, db, dbsqlc.GetRefundParams{CallerID: callerID, ID: id})
			if err == nil && re.ChargeID != chargeID {
				err = pgx.ErrNoRows // another charge's refund is no cursor here
			}
			return postgres.Cursor{CreatedAt: re.CreatedAt, ID: re.ID}, err
		},
		func(c postgres.Cursor, rowLimit int32) ([]dbsqlc.Refund, error) {
			return queries.ListRefundsOfCharge(ctx, db, dbsqlc.ListRefundsOfChargeParams{CallerID: callerID, ChargeID: chargeID,
				RowLimit: rowLimit, HasCursor: c.Set, CursorCreatedAt: c.CreatedAt, CursorID: c.ID})
		}, refundOf)
}

// ApplyRefundEvent is the inbox's Applier for refund.succeeded, about the
// refund made under the event's downstream key. Like ApplyChargeEvent it is
// idempotent and agrees with the refund's own final phase.
func ApplyRefundEvent(ctx context.Context, tx pgx.Tx, callerID string, ev events.ProcessorEvent) (_ bool, err error) {
	defer postgres.Wrap(&err, "charges.ApplyRefundEvent(%s, %q)", callerID, ev.DownstreamKey)
	r := events.Report{Amount: ev.Amount, Currency: ev.Currency, ProcessorID: ev.ObjectID}
	re, err := queries.GetRefundByDownstreamKey(ctx, tx, dbsqlc.GetRefundByDownstreamKeyParams{CallerID: callerID, DownstreamKey: ev.DownstreamKey})
	if postgres.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ch, err := queries.GetCharge(ctx, tx, dbsqlc.GetChargeParams{CallerID: re.CallerID, ID: re.ChargeID})
	if err != nil {
		return false, err
	}
	_, err = refundSucceeded(ctx, tx, ch, re, r)
	return err == nil, err
}

// refundSucceeded moves a pending refund to succeeded, with its event, and
// returns it as it now is; an already succeeded refund is left alone.
func refundSucceeded(ctx context.Context, tx pgx.Tx, ch dbsqlc.Charge, re dbsqlc.Refund, r events.Report) (dbsqlc.Refund, error) {
	if err := orders.Lock(ctx, tx, ch.CallerID, ch.OrderID); err != nil {
		return re, err
	}
	cur, err := queries.GetRefundByKeyRecord(ctx, tx, dbsqlc.GetRefundByKeyRecordParams{CallerID: re.CallerID, IdempotencyKeyID: re.IdempotencyKeyID})
	if err != nil {
		return re, err
	}
	if err := r.Check("refund", cur.ID, cur.Amount, ch.Currency, cur.ProcessorRefundID); err != nil {
		return cur, err
	}
	switch Status(cur.Status) {
	case StatusSucceeded:
		return cur, nil // recorded already
	case StatusPending:
	default:
		return cur, &events.ContradictionError{Object: "refund", ID: cur.ID, Field: "status", Recorded: cur.Status, Reported: string(StatusSucceeded)}
	}
	if cur, err = queries.SucceedRefund(ctx, tx, dbsqlc.SucceedRefundParams{CallerID: re.CallerID, ID: re.ID, ProcessorRefundID: &r.ProcessorID}); err != nil {
		return cur, err
	}
	if err := ledger.Settle(ctx, tx, ch.CallerID, ch.Currency, re.Amount, re.ID); err != nil {
		return cur, err
	}
	return cur, events.Emit(ctx, tx, re.CallerID, events.RefundSucceeded, map[string]any{
		"refund_id": re.ID, "charge_id": ch.ID, "order_id": ch.OrderID, "amount": re.Amount, "currency": ch.Currency,
	})
}
