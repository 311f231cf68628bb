package server

import (
	"context"
	"io"

	"github.com/labstack/echo/v4"
	"github.com/oapi-codegen/runtime"

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
		out.ResponseStatus = new(int(*rec.ResponseStatus))
	}
	return out, nil
}

// declared serves every declared operation (not in the strict interface)
// once the contract has checked the request: the store runs it, and a keyed
// one's answer, first or replayed, is written from the stored bytes.
func (s *Server) declared(op idempotency.Operation) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		req, ok := idempotency.RequestFrom(ctx)
		switch {
		case op.Safe:
			req = idempotency.Request{CallerID: auth.CallerFrom(ctx).ID, Operation: op.Name, Method: c.Request().Method, Path: c.Request().URL.Path}
		case !ok: // the spec does not mark this route keyed: a contract bug
			return problem.New(problem.InternalError, "operation %s is not keyed in the contract", op.Name)
		}
		path := make(map[string]string, len(c.ParamNames()))
		for i, name := range c.ParamNames() {
			var v string
			// As the generated handlers bind a path parameter: unescaped.
			if err := runtime.BindStyledParameterWithOptions("simple", name, c.ParamValues()[i], &v, runtime.BindStyledParameterOptions{
				ParamLocation: runtime.ParamLocationPath, Required: true, Type: "string", ValueIsUnescaped: c.Request().URL.RawPath == "",
			}); err != nil {
				return problem.New(problem.InvalidRequest, "invalid path parameter %s: %v", name, err)
			}
			path[name] = v
		}
		body, err := io.ReadAll(c.Request().Body) // read, bounded and validated by the contract
		if err != nil {
			return err
		}
		resp, err := s.keys.Serve(ctx, op, req, path, body)
		if err != nil {
			return err
		}
		return resp.Write(c.Response())
	}
}
