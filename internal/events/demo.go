package events

import (
	"context"
	"time"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// The demo receiver stands in for the demo callers' webhook endpoints: it
// records what the relay delivered, deduplicated on the event id as every
// receiver must be, for the demo page to show each with its delivery count.

// DemoDelivery is an event as the demo receiver got it (GET /demo/deliveries).
type DemoDelivery struct {
	EventID    string    `json:"event_id"`
	Type       string    `json:"type"`
	Deliveries int32     `json:"deliveries"` // above one: a duplicate the receiver dropped
	ReceivedAt time.Time `json:"received_at"`
}

// RecordDemoDelivery records one delivery of eventID to the demo receiver
// of callerID and returns how many it has had.
func RecordDemoDelivery(ctx context.Context, db dbsqlc.DBTX, callerID, eventID, eventType string) (_ int32, err error) {
	defer postgres.Wrap(&err, "events.RecordDemoDelivery(%s, %s)", callerID, eventID)
	return queries.RecordDemoDelivery(ctx, db, dbsqlc.RecordDemoDeliveryParams{CallerID: callerID, EventID: eventID, Type: eventType})
}

// ListDemoDeliveries returns what the demo receiver of callerID got, newest
// first, up to limit events.
func ListDemoDeliveries(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int32) (_ []DemoDelivery, err error) {
	defer postgres.Wrap(&err, "events.ListDemoDeliveries(%s)", callerID)
	rows, err := queries.ListDemoDeliveries(ctx, db, dbsqlc.ListDemoDeliveriesParams{CallerID: callerID, RowLimit: limit})
	out := make([]DemoDelivery, len(rows))
	for i, r := range rows {
		out[i] = DemoDelivery{EventID: r.EventID, Type: r.Type, Deliveries: r.Deliveries, ReceivedAt: r.ReceivedAt}
	}
	return out, err
}
