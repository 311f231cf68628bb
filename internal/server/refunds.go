package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
)

// CreateRefund is keyed, with an external effect: see refunds.go in
// package charges.
func (s *Server) CreateRefund(ctx context.Context, req apigen.CreateRefundRequestObject) (apigen.CreateRefundResponseObject, error) {
	keyed, err := keyedRequest(ctx)
	if err != nil {
		return nil, err
	}
	callerID := auth.CallerFrom(ctx).ID
	// An unknown charge is a 404 before the claim: not stored.
	if _, err := charges.Get(ctx, s.pool, callerID, req.ChargeId); err != nil {
		return nil, err
	}
	refundReq := charges.RefundRequest{CallerID: callerID, ChargeID: req.ChargeId}
	if req.Body != nil {
		refundReq.Amount = req.Body.Amount
	}
	resp, err := s.keys.Execute(ctx, keyed, func(ctx context.Context, l *idempotency.Lease) error {
		return s.charges.Refund(ctx, l, refundReq)
	})
	if err != nil {
		return nil, err
	}
	return replayable{resp}, nil
}

// ListRefunds is safe.
func (s *Server) ListRefunds(ctx context.Context, req apigen.ListRefundsRequestObject) (apigen.ListRefundsResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := charges.ListRefunds(ctx, s.pool, auth.CallerFrom(ctx).ID, req.ChargeId, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	out := apigen.ListRefunds200JSONResponse{Data: make([]apigen.Refund, len(rows)), HasMore: hasMore}
	for i, re := range rows {
		out.Data[i] = re.API()
	}
	return out, nil
}
