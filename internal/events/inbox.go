package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
)

// The inbox is the outbox's mirror: the processor's events, at least once
// and maybe out of order. Each event id is recorded (processor_events) in
// the transaction that applies the event, so a redelivery changes nothing.
// What an event does is the business of the package that owns its object,
// which writes its Applier (registered in internal/app).

// The processor's event types.
const (
	ProcessorChargeSucceeded = "charge.succeeded"
	ProcessorChargeFailed    = "charge.failed"
	ProcessorRefundSucceeded = "refund.succeeded"
	ProcessorPayoutPaid      = "payout.paid"
	ProcessorPayoutFailed    = "payout.failed"
)

// ProcessorEvent is an event as the processor's webhook carries it.
type ProcessorEvent struct {
	ID            string // the processor's event id; deliveries are deduplicated on it
	Type          string // one of the processor's event types above
	DownstreamKey string // sent with the call the event is about: it names our object, and its caller
	ObjectID      string // the processor's id of its charge, refund or payout
	Amount        *int64
	Currency      *string
	DeclineCode   *string // charge.failed
	FailureCode   *string // payout.failed
}

// An Applier applies, in tx, an event about one of its package's objects
// and says whether it knew the object. For an event that disagrees with what
// is recorded, it writes nothing and returns a *ContradictionError.
type Applier func(ctx context.Context, tx pgx.Tx, callerID string, ev ProcessorEvent) (known bool, err error)

// Inbox receives processor events.
type Inbox struct {
	pool     *pgxpool.Pool
	appliers map[string]Applier
	log      *slog.Logger
}

// NewInbox returns an inbox with no appliers: Handle registers them.
func NewInbox(pool *pgxpool.Pool, log *slog.Logger) *Inbox {
	return &Inbox{pool: pool, appliers: map[string]Applier{}, log: log}
}

// Handle registers apply for events of eventType; registering a type twice
// is a wiring mistake, and panics at start-up.
func (in *Inbox) Handle(eventType string, apply Applier) {
	if _, dup := in.appliers[eventType]; dup {
		panic(fmt.Sprintf("events: %s handled twice", eventType))
	}
	in.appliers[eventType] = apply
}

// Receive applies ev (its signature already checked) once, however often it
// is delivered, and says whether it was a redelivery. An event about an
// unknown object or caller, or of a type nobody handles, is acknowledged and
// ignored: no redelivery could change that. So is one that contradicts what
// is recorded (a decline reported as a success; the wrong amount), or the
// processor would redeliver it for ever: nothing about money changes, and
// the event is kept with what it contradicts for an operator (`server
// dead-letters`), counted, and logged once, on arrival.
func (in *Inbox) Receive(ctx context.Context, ev ProcessorEvent) (duplicate bool, err error) {
	defer postgres.Wrap(&err, "events.Receive(%s)", ev.ID)
	callerID, ok := cardprocessor.CallerOfDownstreamKey(ev.DownstreamKey)
	apply := in.appliers[ev.Type]
	if !ok || apply == nil {
		return false, nil
	}
	var contradiction *ContradictionError
	err = postgres.Transact(ctx, in.pool, func(tx pgx.Tx) error {
		n, err := queries.RecordProcessorEvent(ctx, tx,
			dbsqlc.RecordProcessorEventParams{CallerID: callerID, EventID: ev.ID, Type: ev.Type})
		if err != nil || n == 0 {
			duplicate = n == 0
			return err
		}
		_, err = apply(ctx, tx, callerID, ev)
		// A contradiction is found before anything is written, so only the
		// event id and the note commit with this transaction.
		if errors.As(err, &contradiction) {
			note := contradiction.Error()
			return queries.SetProcessorEventContradiction(ctx, tx,
				dbsqlc.SetProcessorEventContradictionParams{CallerID: callerID, EventID: ev.ID, Contradiction: &note})
		}
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23503": // foreign_key_violation: no such caller
		return false, nil
	case err != nil:
		return false, err
	case contradiction != nil:
		metrics.DeadLetters.WithLabelValues(metrics.DeadLetterProcessorEvent).Inc()
		in.log.ErrorContext(ctx, "processor event contradicts what is recorded; not applied, set aside for an operator",
			"caller", callerID, "event_id", ev.ID, "type", ev.Type, "err", contradiction)
	}
	return duplicate, nil
}

// SetAsideEvent is a processor event acknowledged but not applied, because
// it contradicts what is recorded.
type SetAsideEvent struct {
	CallerID, EventID, Type string
	Contradiction           string
	ReceivedAt              time.Time
}

// ListSetAside returns the caller's processor events that were set aside,
// oldest first, for an operator.
func ListSetAside(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ []SetAsideEvent, err error) {
	defer postgres.Wrap(&err, "events.ListSetAside(%s)", callerID)
	rows, err := queries.ListContradictingProcessorEvents(ctx, db, callerID)
	out := make([]SetAsideEvent, len(rows))
	for i, r := range rows {
		out[i] = SetAsideEvent{CallerID: r.CallerID, EventID: r.EventID, Type: r.Type, Contradiction: *r.Contradiction, ReceivedAt: r.ReceivedAt}
	}
	return out, err
}

// ContradictionError is a processor report that contradicts what is
// recorded: a failed charge reported succeeded (or the other way round), or
// the wrong amount, currency or processor id. It is found before anything
// is written, and nothing is changed on it: a person must look.
type ContradictionError struct {
	Object, ID string // "charge", "refund" or "payout", and its id
	Field      string // what disagrees: "status", "amount", "currency" or "processor id"
	Recorded   string
	Reported   string
}

func (e *ContradictionError) Error() string {
	return fmt.Sprintf("%s %s: recorded %s %s, but the processor reports %s", e.Object, e.ID, e.Field, e.Recorded, e.Reported)
}

// Report is what a processor's webhook says about an object besides its
// outcome. A field left zero says nothing.
type Report struct {
	Amount      *int64
	Currency    *string
	ProcessorID string
}

// Check returns a *ContradictionError when r disagrees with what is recorded
// about object id: its amount, currency, and processor id once recorded. The
// right downstream key alone does not make a webhook true.
func (r Report) Check(object, id string, amount int64, currency string, processorID *string) error {
	switch {
	case r.Amount != nil && *r.Amount != amount:
		return &ContradictionError{Object: object, ID: id, Field: "amount", Recorded: fmt.Sprint(amount), Reported: fmt.Sprint(*r.Amount)}
	case r.Currency != nil && *r.Currency != currency:
		return &ContradictionError{Object: object, ID: id, Field: "currency", Recorded: currency, Reported: *r.Currency}
	case r.ProcessorID != "" && processorID != nil && *processorID != r.ProcessorID:
		return &ContradictionError{Object: object, ID: id, Field: "processor id", Recorded: *processorID, Reported: r.ProcessorID}
	}
	return nil
}
