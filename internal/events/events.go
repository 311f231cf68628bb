// Package events is the transactional outbox: Record inserts an event in
// the transaction of the change it describes, and the relay (relay.go)
// delivers it to the caller's endpoint, at least once. It also holds the
// inbox of the card processor's events (inbox.go). It owns the events,
// processor_events and demo_received_events tables.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// Event types.
const (
	OrderPaid       = "order.paid"
	ChargeSucceeded = "charge.succeeded"
	ChargeFailed    = "charge.failed"
	RefundSucceeded = "refund.succeeded"
	PayoutPaid      = "payout.paid"
	PayoutFailed    = "payout.failed"
)

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

var newEventID = postgres.IDs("evt") // evt_…

// Event is an event of the outbox, as the rest of the service sees it.
type Event struct {
	ID        string
	CallerID  string
	Type      string
	Data      json.RawMessage
	CreatedAt time.Time
}

// API is the event as the contract shows it.
func (e Event) API() (apigen.Event, error) {
	var data map[string]any
	if err := json.Unmarshal(e.Data, &data); err != nil {
		return apigen.Event{}, fmt.Errorf("event %s: %w", e.ID, err)
	}
	return apigen.Event{Id: e.ID, Type: apigen.EventType(e.Type), CreatedAt: e.CreatedAt, Data: data}, nil
}

// Emit writes an event in tx, the transaction that makes the change: the
// event commits, or not, with it. When ctx's span is recorded, the event
// keeps its trace context, for each delivery's trace to link to.
func Emit(ctx context.Context, tx pgx.Tx, callerID, eventType string, data map[string]any) (err error) {
	defer postgres.Wrap(&err, "events.Emit(%s, %s)", callerID, eventType)
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	return queries.InsertEvent(ctx, tx, dbsqlc.InsertEventParams{CallerID: callerID, ID: newEventID(),
		Type: eventType, Data: b, Traceparent: postgres.Traceparent(ctx)})
}

// List returns up to limit of the caller's events, newest first, after the
// event startingAfter when it is not empty, and whether more exist.
func List(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int, startingAfter string) (_ []Event, _ bool, err error) {
	defer postgres.Wrap(&err, "List(%s)", callerID)
	return postgres.Page(limit, startingAfter, "event of yours",
		func(id string) (postgres.Cursor, error) {
			ev, err := queries.GetEvent(ctx, db, dbsqlc.GetEventParams{CallerID: callerID, ID: id})
			return postgres.Cursor{CreatedAt: ev.CreatedAt, ID: ev.ID}, err
		},
		func(c postgres.Cursor, rowLimit int32) ([]dbsqlc.Event, error) {
			return queries.ListEvents(ctx, db, dbsqlc.ListEventsParams{CallerID: callerID, RowLimit: rowLimit,
				HasCursor: c.Set, CursorCreatedAt: c.CreatedAt, CursorID: c.ID})
		},
		func(r dbsqlc.Event) Event {
			return Event{ID: r.ID, CallerID: r.CallerID, Type: r.Type, Data: r.Data, CreatedAt: r.CreatedAt}
		})
}
