package server

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/effect"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/payouts"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/refunds"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// ReceiveProcessorWebhook applies an event from the processor. Its
// signature was verified by the contract middleware before anything else.
// The event id is recorded in the same transaction that applies the event:
// a redelivery finds it and changes nothing, and a crash between the two
// cannot happen.
//
// An event that contradicts a final state already recorded (a decline we
// recorded, reported as a success) is acknowledged all the same: the
// processor would otherwise redeliver it for ever, and no redelivery can
// make it apply. Nothing about money changes; the event is kept, marked
// with what it contradicts, for an operator (server dead-letters lists it),
// and logged once, when it first arrives.
func (s *Server) ReceiveProcessorWebhook(ctx context.Context, req apigen.ReceiveProcessorWebhookRequestObject) (apigen.ReceiveProcessorWebhookResponseObject, error) {
	ev := req.Body
	callerID, ok := effect.CallerOf(ev.Data.DownstreamKey)
	if !ok {
		// Not one of our keys: acknowledge, so the processor stops.
		return apigen.ReceiveProcessorWebhook200JSONResponse{Received: true}, nil
	}
	duplicate := false
	var contradiction *effect.ContradictionError
	err := postgres.Transact(ctx, s.pool, func(tx pgx.Tx) error {
		n, err := queries.RecordProcessorEvent(ctx, tx, dbsqlc.RecordProcessorEventParams{
			CallerID: callerID, EventID: ev.Id, Type: string(ev.Type),
		})
		if err != nil {
			return err
		}
		if n == 0 {
			duplicate = true
			return nil
		}
		// What the event says besides the outcome, checked against what is
		// recorded before anything is applied.
		report := effect.Report{Amount: ev.Data.Amount, Currency: ev.Data.Currency, ProcessorID: ev.Data.Id}
		switch ev.Type {
		case apigen.ProcessorEventTypeChargeSucceeded, apigen.ProcessorEventTypeChargeFailed:
			o := charges.Outcome{Succeeded: ev.Type == apigen.ProcessorEventTypeChargeSucceeded, ProcessorChargeID: ev.Data.Id, Report: report}
			if ev.Data.DeclineCode != nil {
				o.DeclineCode = *ev.Data.DeclineCode
			}
			_, err = charges.ApplyChargeOutcome(ctx, tx, callerID, ev.Data.DownstreamKey, o)
		case apigen.ProcessorEventTypeRefundSucceeded:
			_, err = refunds.ApplySucceeded(ctx, tx, callerID, ev.Data.DownstreamKey, report)
		case apigen.ProcessorEventTypePayoutPaid, apigen.ProcessorEventTypePayoutFailed:
			o := payouts.Outcome{Paid: ev.Type == apigen.ProcessorEventTypePayoutPaid, ProcessorPayoutID: ev.Data.Id, Report: report}
			if ev.Data.FailureCode != nil {
				o.FailureCode = *ev.Data.FailureCode
			}
			_, err = payouts.ApplyOutcome(ctx, tx, callerID, ev.Data.DownstreamKey, o)
		}
		// A contradiction is found before anything is written, so only the
		// event id and the note commit with this transaction.
		if errors.As(err, &contradiction) {
			return queries.SetProcessorEventContradiction(ctx, tx, dbsqlc.SetProcessorEventContradictionParams{
				CallerID: callerID, EventID: ev.Id, Contradiction: ptr(contradiction.Error()),
			})
		}
		return err
	})
	if contradiction != nil && err == nil {
		metrics.DeadLetters.WithLabelValues(metrics.DeadLetterProcessorEvent).Inc()
		s.log.ErrorContext(ctx, "processor event contradicts what is recorded; not applied, set aside for an operator",
			"caller", callerID, "event_id", ev.Id, "type", ev.Type, "err", contradiction)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation: no such caller
		return apigen.ReceiveProcessorWebhook200JSONResponse{Received: true}, nil
	}
	if err != nil {
		return nil, err
	}
	return apigen.ReceiveProcessorWebhook200JSONResponse{Received: true, Duplicate: duplicate}, nil
}

func ptr[T any](v T) *T { return &v }
