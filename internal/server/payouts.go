package server

import (
	"context"
	"strconv"
	"time"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/payouts"
)

// CreatePayout is keyed, with its effect run as a job: the request only
// accepts the payout (202); see package payouts.
func (s *Server) CreatePayout(ctx context.Context, req apigen.CreatePayoutRequestObject) (apigen.CreatePayoutResponseObject, error) {
	keyed, err := keyedRequest(ctx)
	if err != nil {
		return nil, err
	}
	payoutReq := payouts.Request{
		CallerID:    auth.CallerFrom(ctx).ID,
		Amount:      req.Body.Amount,
		Currency:    string(req.Body.Currency),
		Destination: payouts.DefaultDestination,
	}
	if req.Body.Destination != nil {
		payoutReq.Destination = string(*req.Body.Destination)
	}
	resp, err := s.keys.Execute(ctx, keyed, func(ctx context.Context, l *idempotency.Lease) error {
		return s.payouts.Create(ctx, l, payoutReq)
	})
	if err != nil {
		return nil, err
	}
	return replayable{resp}, nil
}

// GetPayout is safe. While the payout is not final, Retry-After says when
// to poll again.
func (s *Server) GetPayout(ctx context.Context, req apigen.GetPayoutRequestObject) (apigen.GetPayoutResponseObject, error) {
	po, err := payouts.Get(ctx, s.pool, auth.CallerFrom(ctx).ID, req.PayoutId)
	if err != nil {
		return nil, err
	}
	out := apigen.GetPayout200JSONResponse{Body: po.API()}
	if after := po.PollAfter(time.Now()); after > 0 {
		s := strconv.Itoa(after)
		out.Headers.RetryAfter = &s
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
	out := apigen.ListPayouts200JSONResponse{Data: make([]apigen.Payout, len(rows)), HasMore: hasMore}
	for i, po := range rows {
		out.Data[i] = po.API()
	}
	return out, nil
}
