package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
)

// ListRefunds is safe.
func (s *Server) ListRefunds(ctx context.Context, req apigen.ListRefundsRequestObject) (apigen.ListRefundsResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := charges.ListRefunds(ctx, s.pool, auth.CallerFrom(ctx).ID, req.ChargeId, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	return apigen.ListRefunds200JSONResponse{Data: apiList(rows), HasMore: hasMore}, nil
}
