// Keyed requests in the HTTP layer: the request the contract middleware
// prepared for each keyed operation, the response type that writes a
// stored answer, and a caller's view of its own key records.

package server

import (
	"context"
	"net/http"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/problem"
)

// GetIdempotencyKey shows the caller's own record for a key. Another
// caller's key with the same value is a different record, invisible here.
func (s *Server) GetIdempotencyKey(ctx context.Context, req apigen.GetIdempotencyKeyRequestObject) (apigen.GetIdempotencyKeyResponseObject, error) {
	if err := idempotency.CheckKey(req.Key); err != nil {
		p := problem.New(problem.InvalidRequest, "the key %v", err)
		p.Errors = []problem.FieldError{{Field: "key", Message: "the key " + err.Error()}}
		return nil, p
	}
	rec, err := s.keys.Get(ctx, auth.CallerFrom(ctx).ID, req.Key)
	if err != nil {
		return nil, err
	}
	out := apigen.GetIdempotencyKey200JSONResponse{
		Key:           rec.Key,
		Status:        apigen.IdempotencyKeyRecordStatus(rec.Status),
		RecoveryPoint: string(rec.RecoveryPoint),
		Attempt:       int(rec.Attempt),
		RequestMethod: rec.RequestMethod,
		RequestPath:   rec.RequestPath,
		LockedUntil:   rec.LockedUntil,
		CreatedAt:     rec.CreatedAt,
		ExpiresAt:     rec.CreatedAt.Add(s.cfg.Retention),
	}
	if rec.ResponseStatus != nil {
		status := int(*rec.ResponseStatus)
		out.ResponseStatus = &status
	}
	return out, nil
}

// keyedRequest returns the keyed request the contract middleware prepared.
func keyedRequest(ctx context.Context) (idempotency.Request, error) {
	r, ok := idempotency.RequestFrom(ctx)
	if !ok { // the spec does not mark this operation keyed: a contract bug
		return r, problem.New(problem.InternalError, "operation is not declared keyed in the contract")
	}
	return r, nil
}

// replayable writes an idempotency.Response: the first answer and every
// replay come from the same stored bytes. It satisfies the response
// interface of every keyed operation.
type replayable struct{ *idempotency.Response }

func (r replayable) VisitCreateOrderResponse(w http.ResponseWriter) error  { return r.Write(w) }
func (r replayable) VisitCreateChargeResponse(w http.ResponseWriter) error { return r.Write(w) }
func (r replayable) VisitCreateRefundResponse(w http.ResponseWriter) error { return r.Write(w) }
func (r replayable) VisitCreatePayoutResponse(w http.ResponseWriter) error { return r.Write(w) }
