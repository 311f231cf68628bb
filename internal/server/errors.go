package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// handleError is the one place where an error becomes an HTTP response:
// RFC 9457 problem details. An unanticipated error is logged here, once,
// and answered as a generic 500 without internals.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if werr := s.toProblem(err, c).Write(c.Response()); werr != nil {
		s.log.WarnContext(c.Request().Context(), "write error response", "err", werr)
	}
}

func (s *Server) toProblem(err error, c echo.Context) *problem.Error {
	var p *problem.Error
	if errors.As(err, &p) {
		return p
	}
	// A body the contract accepts but Go cannot decode (1999.0 for an
	// integer): name the field rather than echo the decoder.
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		field := "/" + strings.ReplaceAll(ute.Field, ".", "/")
		p := problem.New(problem.InvalidRequest, "%s: must be %s", field, ute.Type)
		p.Errors = []problem.FieldError{{Field: field, Message: "must be " + ute.Type.String()}}
		return p
	}
	req := c.Request()
	var he *echo.HTTPError
	if errors.As(err, &he) {
		// Echo's own: unknown routes, the generated wrappers' binding.
		switch he.Code {
		case http.StatusNotFound:
			return problem.New(problem.NotFound, "no such resource: %s %s", req.Method, req.URL.Path)
		case http.StatusMethodNotAllowed:
			return problem.New(problem.MethodNotAllowed, "%s is not allowed on %s", req.Method, req.URL.Path)
		case http.StatusRequestEntityTooLarge:
			return problem.New(problem.RequestTooLarge, "the request body exceeds %d bytes", s.cfg.MaxBodyBytes)
		case http.StatusUnsupportedMediaType:
			return problem.New(problem.UnsupportedMediaType, "%v", he.Message)
		}
		if he.Code < 500 {
			return problem.New(problem.InvalidRequest, "%v", he.Message)
		}
	}
	// Backstop: characters PostgreSQL cannot store (the spec refuses NUL).
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "22021" || pgErr.Code == "22P05") {
		return problem.New(problem.InvalidRequest, "the request contains characters that cannot be stored")
	}
	if postgres.IsTransient(err) {
		s.log.WarnContext(req.Context(), "transient failure", "err", err, "method", req.Method, "path", req.URL.Path)
		p = problem.New(problem.ServiceUnavailable, "a temporary failure prevented the request; retry it (with the same Idempotency-Key, if any)")
		p.RetryAfter = 1
		return p
	}
	s.log.ErrorContext(req.Context(), "request failed", "err", err, "method", req.Method, "path", req.URL.Path)
	return problem.New(problem.InternalError, "the request failed")
}
