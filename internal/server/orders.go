package server

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/problem"
)

// CreateOrder is keyed: a local effect, so the whole operation is one
// atomic phase in which the order insert, the stored response and the
// record's "completed" commit together. A crash before that commit leaves
// no order and a record at "started"; whoever takes it over simply runs
// the phase again. With a single phase there is no other recovery point to
// switch on (compare a charge, which has three).
func (s *Server) CreateOrder(ctx context.Context, req apigen.CreateOrderRequestObject) (apigen.CreateOrderResponseObject, error) {
	keyed, err := keyedRequest(ctx)
	if err != nil {
		return nil, err
	}
	callerID := auth.CallerFrom(ctx).ID
	n := orders.NewOrder{Amount: req.Body.Amount, Currency: string(req.Body.Currency), Description: req.Body.Description}

	resp, err := s.keys.Execute(ctx, keyed, func(ctx context.Context, l *idempotency.Lease) error {
		return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
			o, err := orders.Create(ctx, tx, callerID, n)
			if err != nil {
				return nil, err
			}
			return idempotency.JSONResponse(http.StatusCreated,
				http.Header{"Location": {"/v1/orders/" + o.ID}}, o.API())
		})
	})
	if err != nil {
		return nil, err
	}
	return replayable{resp}, nil
}

// GetOrder is safe.
func (s *Server) GetOrder(ctx context.Context, req apigen.GetOrderRequestObject) (apigen.GetOrderResponseObject, error) {
	o, err := orders.Get(ctx, s.pool, auth.CallerFrom(ctx).ID, req.OrderId)
	if err != nil {
		return nil, err
	}
	return apigen.GetOrder200JSONResponse(o.API()), nil
}

// ListOrders is safe.
func (s *Server) ListOrders(ctx context.Context, req apigen.ListOrdersRequestObject) (apigen.ListOrdersResponseObject, error) {
	limit, startingAfter := page(req.Params.Limit, req.Params.StartingAfter)
	rows, hasMore, err := orders.List(ctx, s.pool, auth.CallerFrom(ctx).ID, limit, startingAfter)
	if err != nil {
		return nil, err
	}
	out := apigen.ListOrders200JSONResponse{Data: make([]apigen.Order, len(rows)), HasMore: hasMore}
	for i, o := range rows {
		out.Data[i] = o.API()
	}
	return out, nil
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

// page reads the list parameters: limit defaults to 10 (the contract's
// default, which the validator does not fill in) and no cursor is "".
func page(limit *int, startingAfter *string) (int, string) {
	l, s := 10, ""
	if limit != nil {
		l = *limit
	}
	if startingAfter != nil {
		s = *startingAfter
	}
	return l, s
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
