package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/ijson"
	"github.com/retrysafe/payments/internal/problem"
)

// keyedClasses are the idempotency classes, as declared by each
// operation's x-idempotency extension in api/openapi.yaml, that take an
// Idempotency-Key. The contract, not the Go code, says which operations
// those are. The middleware treats both alike (parse the key, fingerprint
// the request); they differ only in how the handler runs the operation:
// one transaction for "keyed", atomic phases around an external call for
// "keyed-external".
var keyedClasses = map[string]bool{"keyed": true, "keyed-external": true, "keyed-job": true}

// IsKeyed reports whether operations of the idempotency class take an
// Idempotency-Key.
func IsKeyed(class string) bool { return keyedClasses[class] }

// contract enforces api/openapi.yaml on every request to an operation it
// declares, in the order the idempotency contract requires:
//
//	authenticate → parse the Idempotency-Key → validate the request → (handler: claim → execute)
//
// Everything here happens before the claim, so every error it answers is
// not stored: a corrected retry with the same key works.
func (s *Server) contract(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		r, pathParams, ok := s.findRoute(c)
		if !ok {
			route, params, err := s.router.FindRoute(req)
			switch {
			case errors.Is(err, routers.ErrPathNotFound) && isAPIPath(req.URL.Path):
				return problem.New(problem.NotFound, "no such resource: %s %s", req.Method, req.URL.Path)
			case errors.Is(err, routers.ErrPathNotFound):
				return next(c) // not an API operation: the demo page or the spec
			case errors.Is(err, routers.ErrMethodNotAllowed):
				allow := s.allowedMethods(req)
				c.Response().Header().Set("Allow", strings.Join(allow, ", "))
				return problem.New(problem.MethodNotAllowed, "%s is not allowed on %s (allowed: %s)", req.Method, req.URL.Path, strings.Join(allow, ", "))
			case err != nil:
				return err
			}
			r, pathParams = newAPIRoute(route), params
		}
		route := r.route
		op := route.Operation
		ctx := req.Context()

		// Ambiguity is refused, not resolved: with two Authorization or
		// Content-Type lines, a proxy in front of us may have read the other
		// one. (A repeated Idempotency-Key is refused by its parser.)
		for _, name := range []string{"Authorization", "Content-Type"} {
			if n := len(req.Header.Values(name)); n > 1 {
				return problem.New(problem.InvalidRequest, "the %s header was sent %d times; send it once", name, n)
			}
		}

		// 1. Authenticate, and take a token from the caller's bucket. A
		// request over the limit is refused here, before its key is even
		// parsed: nothing is stored, so its retry runs the operation.
		if r.requiresAuth {
			caller, err := s.auth.Authenticate(ctx, bearerToken(req))
			if err != nil {
				return err
			}
			if err := s.limits.allow(caller.ID); err != nil {
				return err
			}
			ctx = auth.WithCaller(ctx, caller)
		}

		// 2. Parse the Idempotency-Key of keyed operations.
		var key string
		if r.keyed {
			var err error
			if key, err = idempotency.ParseKey(req.Header.Values("Idempotency-Key")); err != nil {
				return err
			}
		}

		// 3. Read the body (bounded) and validate the whole request against
		// the contract: parameters, content type and body schema, including
		// additionalProperties: false.
		body, err := s.readBody(req, op)
		if err != nil {
			return err
		}
		// The processor's webhook has no API key: its signature, over the
		// raw body, is checked first, before the body is even parsed, so
		// that an unsigned request costs one HMAC and nothing more.
		if r.signed {
			if err := cardprocessor.Verify(s.cfg.ProcessorWebhookSecret, req.Header.Get(cardprocessor.SignatureHeader), body, time.Now(), cardprocessor.SignatureTolerance); err != nil {
				return problem.New(problem.InvalidSignature, "the Processor-Signature header does not verify: %v", err)
			}
		}
		// Before any parser reads it: a body nested too deep is refused
		// (every parser after this one recurses), and so is a member named
		// twice in one object (the validator and the handler would each
		// see only one of its values). One linear pass over the bytes.
		if err := checkJSON(body); err != nil {
			return err
		}
		// The body is decoded once, for the validation and the
		// fingerprint alike (the handler decodes it again into its own
		// type).
		doc, decodeErr := idempotency.DecodeJSON(body)
		err = s.validateRequest(ctx, &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: pathParams,
			Route:      route,
		}, body, doc, decodeErr)
		if err != nil {
			return validationProblem(err)
		}
		// The validator may have consumed the body: the handler gets it
		// again.
		req.Body = io.NopCloser(bytes.NewReader(body))

		// 4. Fingerprint the request, for the claim in the handler. The
		// I-JSON check above is the fingerprint's too, not repeated.
		if r.keyed {
			fp, err := fingerprint(req, doc, decodeErr)
			if err != nil { // data after the JSON document (ErrTrailingData), which the validator does not read
				return problem.New(problem.InvalidRequest, "the body is not valid JSON: %v", err)
			}
			ctx = idempotency.WithRequest(ctx, idempotency.Request{
				CallerID:    auth.CallerFrom(ctx).ID,
				Key:         key,
				Operation:   op.OperationID,
				Method:      req.Method,
				Path:        req.URL.Path,
				Fingerprint: fp,
			})
		}
		c.SetRequest(req.WithContext(ctx))
		return next(c)
	}
}

// fingerprint is idempotency.Fingerprint of the request, from its body as
// contract decoded it (doc, decodeErr).
func fingerprint(req *http.Request, doc *any, decodeErr error) ([]byte, error) {
	if decodeErr != nil {
		return nil, decodeErr
	}
	return idempotency.FingerprintOf(req.Method, req.URL.Path, doc)
}

// checkJSON refuses, with a 400 that names the place, a body nested deeper
// than ijson.MaxDepth, holding more than ijson.MaxValues values, with an
// object of more than ijson.MaxMembers members, a string longer than
// ijson.MaxString characters or not Unicode text, or with a member named twice
// in one object (I-JSON, RFC 7493).
func checkJSON(body []byte) error {
	err := ijson.Check(body)
	if err == nil {
		// Before the targets of errors.As below are declared: they escape
		// to the heap, allocations that a good body need not cost.
		return nil
	}
	var tooDeep *ijson.DepthError
	var tooWide *ijson.MembersError
	var tooMany *ijson.ValuesError
	var tooLong *ijson.StringError
	var dup *ijson.DuplicateNameError
	var notUnicode *ijson.EncodingError
	switch {
	case errors.As(err, &notUnicode):
		p := problem.New(problem.InvalidRequest, "%s: a string must be Unicode text, with no invalid UTF-8 and no lone surrogate escape (I-JSON, RFC 7493)", notUnicode.Pointer)
		p.Errors = []problem.FieldError{{Field: notUnicode.Pointer, Message: "not valid Unicode"}}
		return p
	case errors.As(err, &tooLong):
		p := problem.New(problem.InvalidRequest, "%s: a string may be at most %d characters long", tooLong.Pointer, tooLong.Limit)
		p.Errors = []problem.FieldError{{Field: tooLong.Pointer, Message: fmt.Sprintf("longer than %d characters", tooLong.Limit)}}
		return p
	case errors.As(err, &tooMany):
		p := problem.New(problem.InvalidRequest, "%s: a body may hold at most %d values", tooMany.Pointer, tooMany.Limit)
		p.Errors = []problem.FieldError{{Field: tooMany.Pointer, Message: fmt.Sprintf("past the limit of %d values", tooMany.Limit)}}
		return p
	case errors.As(err, &tooDeep):
		p := problem.New(problem.InvalidRequest, "%s: the body is nested more than %d levels deep, the limit", tooDeep.Pointer, tooDeep.Limit)
		p.Errors = []problem.FieldError{{Field: tooDeep.Pointer, Message: fmt.Sprintf("nested more than %d levels deep", tooDeep.Limit)}}
		return p
	case errors.As(err, &tooWide):
		p := problem.New(problem.InvalidRequest, "%s: an object may have at most %d members", tooWide.Pointer, tooWide.Limit)
		p.Errors = []problem.FieldError{{Field: tooWide.Pointer, Message: fmt.Sprintf("more than %d members", tooWide.Limit)}}
		return p
	case errors.As(err, &dup):
		p := problem.New(problem.InvalidRequest, "%s: a member name may appear only once in an object (I-JSON, RFC 7493)", dup.Pointer)
		p.Errors = []problem.FieldError{{Field: dup.Pointer, Message: "appears more than once"}}
		return p
	}
	return nil
}

// allowedMethods lists the methods the contract defines for req's path, for
// the Allow header of a 405.
func (s *Server) allowedMethods(req *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := req.Clone(req.Context())
		probe.Method = m
		if _, _, err := s.router.FindRoute(probe); err == nil {
			allow = append(allow, m)
		}
	}
	return allow
}

func isAPIPath(p string) bool {
	return strings.HasPrefix(p, "/v1/") || p == "/v1" || strings.HasPrefix(p, "/webhooks/")
}

// requiresAuth reports whether the operation needs a bearer API key: its
// own security list if it has one (health checks and the processor webhook
// set an empty one), otherwise the document's.
func requiresAuth(route *routers.Route) bool {
	sec := route.Spec.Security
	if route.Operation.Security != nil {
		sec = *route.Operation.Security
	}
	return len(sec) > 0
}

func bearerToken(req *http.Request) string {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// readBody reads the request body, refusing bodies over the size limit
// (413) and bodies that are not JSON by their Content-Type (415), and puts
// it back for the validator.
func (s *Server) readBody(req *http.Request, op *openapi3.Operation) ([]byte, error) {
	if req.ContentLength > s.cfg.MaxBodyBytes {
		return nil, problem.New(problem.RequestTooLarge, "the request body is %d bytes; the limit is %d", req.ContentLength, s.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, s.cfg.MaxBodyBytes+1))
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		// The server's read deadline passed: a client trickling its body.
		// The connection is closed after this answer.
		return nil, problem.New(problem.RequestTimeout, "the request did not arrive within %s; send it again, faster", s.cfg.ReadTimeout)
	}
	if err != nil {
		return nil, problem.New(problem.InvalidRequest, "could not read the request body: %v", err)
	}
	if int64(len(body)) > s.cfg.MaxBodyBytes {
		return nil, problem.New(problem.RequestTooLarge, "the request body exceeds %d bytes", s.cfg.MaxBodyBytes)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if len(body) > 0 && op.RequestBody != nil {
		// Media types are case-insensitive and may carry parameters
		// (Application/JSON; charset=UTF-8). Judge the type here, then hand
		// the validator, whose match is exact, the one spelling the
		// contract names. JSON is UTF-8 (RFC 8259): another charset is
		// refused rather than misread.
		ct := req.Header.Get("Content-Type")
		if ct == "application/json" { // what nearly every client sends: nothing to parse
			return body, nil
		}
		mt, params, err := mime.ParseMediaType(ct) // lower-cases the type and the parameter names
		if err != nil || mt != "application/json" {
			return nil, problem.New(problem.UnsupportedMediaType, "the body must be sent as Content-Type: application/json (got %q)", ct)
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			return nil, problem.New(problem.UnsupportedMediaType, "a JSON body must be UTF-8 (got charset=%s)", cs)
		}
		req.Header.Set("Content-Type", "application/json")
	}
	return body, nil
}

// maxFieldErrors bounds the invalid fields one problem lists: a 64 KiB
// body can hold thousands of unknown members, and listing each would make
// the answer many times the size of the question.
const maxFieldErrors = 20

// validationProblem turns the validator's errors into one 400 problem that
// lists the invalid fields (the first maxFieldErrors of them).
func validationProblem(err error) *problem.Error {
	var fields []problem.FieldError
	collectFieldErrors(err, &fields)
	p := problem.New(problem.InvalidRequest, "the request does not match the API contract")
	switch {
	case len(fields) == 1:
		p.Detail = fields[0].Message
		if fields[0].Field != "" {
			p.Detail = fields[0].Field + ": " + p.Detail
		}
	case len(fields) > maxFieldErrors:
		p.Detail = fmt.Sprintf("the request does not match the API contract in %d places; the first %d are listed", len(fields), maxFieldErrors)
		fields = fields[:maxFieldErrors]
	}
	p.Errors = fields
	return p
}

// collectFieldErrors flattens kin-openapi's nested errors into field
// errors: a JSON pointer for body fields, the parameter's name for
// parameters. The validator's own messages embed the whole schema; only
// the reason is kept.
func collectFieldErrors(err error, out *[]problem.FieldError) {
	// A RequestError wraps the errors of one parameter or of the body; it
	// is checked before MultiError because it unwraps to one.
	var reqErr *openapi3filter.RequestError
	if errors.As(err, &reqErr) {
		field := "" // the body, unless a parameter is named
		if reqErr.Parameter != nil {
			field = reqErr.Parameter.Name
		}
		var schemaErrs []*openapi3.SchemaError
		collectSchemaErrors(reqErr.Err, &schemaErrs)
		for _, se := range schemaErrs {
			f := field
			if reqErr.Parameter == nil {
				f = jsonPointer(se.JSONPointer())
			}
			*out = append(*out, problem.FieldError{Field: f, Message: se.Reason})
		}
		if len(schemaErrs) == 0 {
			msg := reqErr.Reason
			if reqErr.Err != nil {
				msg = reqErr.Err.Error()
			}
			*out = append(*out, problem.FieldError{Field: field, Message: msg})
		}
		return
	}
	var multi openapi3.MultiError
	if errors.As(err, &multi) {
		for _, e := range multi {
			collectFieldErrors(e, out)
		}
		return
	}
	*out = append(*out, problem.FieldError{Field: "", Message: err.Error()})
}

// jsonPointer renders RFC 6901 pointer tokens; no tokens is "", the whole body.
func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

func collectSchemaErrors(err error, out *[]*openapi3.SchemaError) {
	var multi openapi3.MultiError
	var se *openapi3.SchemaError
	switch {
	case errors.As(err, &multi):
		for _, e := range multi {
			collectSchemaErrors(e, out)
		}
	case errors.As(err, &se):
		*out = append(*out, se)
	}
}
