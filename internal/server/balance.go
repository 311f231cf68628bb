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
	return apigen.GetBalance200JSONResponse(b), nil
}

// ListLedgerEntries is safe.
func (s *Server) ListLedgerEntries(ctx context.Context, req apigen.ListLedgerEntriesRequestObject) (apigen.ListLedgerEntriesResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	entries, hasMore, err := ledger.List(ctx, s.pool, auth.CallerFrom(ctx).ID, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	return apigen.ListLedgerEntries200JSONResponse{Data: entries, HasMore: hasMore}, nil
}
