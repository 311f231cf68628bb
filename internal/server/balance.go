package server

import (
	"context"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/ledger"
)

// GetBalance is safe.
func (s *Server) GetBalance(ctx context.Context, _ apigen.GetBalanceRequestObject) (apigen.GetBalanceResponseObject, error) {
	b, err := ledger.Get(ctx, s.pool, auth.CallerFrom(ctx).ID)
	if err != nil {
		return nil, err
	}
	return apigen.GetBalance200JSONResponse(b.API()), nil
}
