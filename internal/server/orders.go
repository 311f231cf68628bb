package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/orders"
)

// ListOrders is safe.
func (s *Server) ListOrders(ctx context.Context, req apigen.ListOrdersRequestObject) (apigen.ListOrdersResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := orders.List(ctx, s.pool, auth.CallerFrom(ctx).ID, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	return apigen.ListOrders200JSONResponse{Data: apiList(rows), HasMore: hasMore}, nil
}

// CancelOrder is naturally idempotent: canceling twice is the same state,
// so it needs no key.
func (s *Server) CancelOrder(ctx context.Context, req apigen.CancelOrderRequestObject) (apigen.CancelOrderResponseObject, error) {
	o, err := orders.Cancel(ctx, s.pool, auth.CallerFrom(ctx).ID, req.OrderId, charges.HasLiveCharge)
	if err != nil {
		return nil, err
	}
	return apigen.CancelOrder200JSONResponse(o.API()), nil
}
