package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
)

// CreateCharge is keyed, with an external effect: see package charges for
// its phases.
func (s *Server) CreateCharge(ctx context.Context, req apigen.CreateChargeRequestObject) (apigen.CreateChargeResponseObject, error) {
	keyed, err := keyedRequest(ctx)
	if err != nil {
		return nil, err
	}
	callerID := auth.CallerFrom(ctx).ID
	// An unknown order is a 404 before the key is claimed, so it is not
	// stored: the key stays free for a corrected request.
	if _, err := orders.Get(ctx, s.pool, callerID, req.OrderId); err != nil {
		return nil, err
	}
	chargeReq := charges.ChargeRequest{CallerID: callerID, OrderID: req.OrderId, PaymentMethod: string(req.Body.PaymentMethod)}
	resp, err := s.keys.Execute(ctx, keyed, func(ctx context.Context, l *idempotency.Lease) error {
		return s.charges.Charge(ctx, l, chargeReq)
	})
	if err != nil {
		return nil, err
	}
	return replayable{resp}, nil
}

// GetCharge is safe.
func (s *Server) GetCharge(ctx context.Context, req apigen.GetChargeRequestObject) (apigen.GetChargeResponseObject, error) {
	ch, err := charges.Get(ctx, s.pool, auth.CallerFrom(ctx).ID, req.ChargeId)
	if err != nil {
		return nil, err
	}
	return apigen.GetCharge200JSONResponse(ch.API()), nil
}
