package server

import (
	"context"
	"strconv"
	"time"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/payouts"
)

// GetPayout is safe. While the payout is not final, Retry-After says when
// to poll again.
func (s *Server) GetPayout(ctx context.Context, req apigen.GetPayoutRequestObject) (apigen.GetPayoutResponseObject, error) {
	po, err := payouts.Get(ctx, s.pool, auth.CallerFrom(ctx).ID, req.PayoutId)
	if err != nil {
		return nil, err
	}
	out := apigen.GetPayout200JSONResponse{Body: po.API()}
	if after := po.PollAfter(time.Now()); after > 0 {
		out.Headers.RetryAfter = new(strconv.Itoa(after))
	}
	return out, nil
}

// ListPayouts is safe.
func (s *Server) ListPayouts(ctx context.Context, req apigen.ListPayoutsRequestObject) (apigen.ListPayoutsResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := payouts.List(ctx, s.pool, auth.CallerFrom(ctx).ID, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	return apigen.ListPayouts200JSONResponse{Data: apiList(rows), HasMore: hasMore}, nil
}
