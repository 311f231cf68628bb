package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/events"
)

// ListEvents is safe.
func (s *Server) ListEvents(ctx context.Context, req apigen.ListEventsRequestObject) (apigen.ListEventsResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := events.List(ctx, s.pool, auth.CallerFrom(ctx).ID, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	out := apigen.ListEvents200JSONResponse{Data: make([]apigen.Event, len(rows)), HasMore: hasMore}
	for i, e := range rows {
		if out.Data[i], err = e.API(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
