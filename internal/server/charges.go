package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
)

// GetCharge is safe.
func (s *Server) GetCharge(ctx context.Context, req apigen.GetChargeRequestObject) (apigen.GetChargeResponseObject, error) {
	ch, err := charges.Get(ctx, s.pool, auth.CallerFrom(ctx).ID, req.ChargeId)
	if err != nil {
		return nil, err
	}
	return apigen.GetCharge200JSONResponse(ch.API()), nil
}
