package server

import (
	"bytes"
	"cmp"
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

// keyedClasses are the x-idempotency classes that take an Idempotency-Key:
// api/openapi.yaml decides, not the Go code. The middleware treats them alike.
var keyedClasses = map[string]bool{"keyed": true, "keyed-external": true, "keyed-job": true}

// IsKeyed reports whether the idempotency class takes an Idempotency-Key.
func IsKeyed(class string) bool { return keyedClasses[class] }

// contract enforces api/openapi.yaml on every request to an operation it
// declares, in the order the idempotency contract requires:
//
//	authenticate → parse the Idempotency-Key → validate the request → (handler: claim → execute)
//
// All before the claim: no error here is stored, so a corrected retry
// with the same key works.
func (s *Server) contract(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		r, pathParams, ok := s.findRoute(c)
		if !ok {
			route, params, err := s.router.FindRoute(req)
			switch {
			case errors.Is(err, routers.ErrPathNotFound):
				if p := req.URL.Path; strings.HasPrefix(p, "/v1/") || p == "/v1" || strings.HasPrefix(p, "/webhooks/") {
					return problem.New(problem.NotFound, "no such resource: %s %s", req.Method, req.URL.Path)
				}
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
		op := r.route.Operation
		ctx := req.Context()

		// Ambiguity is refused, not resolved: a proxy in front of us may
		// have read the other line. (ParseKey refuses a repeated key.)
		for _, name := range []string{"Authorization", "Content-Type"} {
			if n := len(req.Header.Values(name)); n > 1 {
				return problem.New(problem.InvalidRequest, "the %s header was sent %d times; send it once", name, n)
			}
		}

		// 1. Authenticate, and take a token from the caller's bucket. Over
		// the limit, nothing is stored: its retry runs the operation.
		if r.requiresAuth {
			scheme, token, _ := strings.Cut(req.Header.Get("Authorization"), " ")
			if !strings.EqualFold(scheme, "Bearer") {
				token = ""
			}
			caller, err := s.auth.Authenticate(ctx, strings.TrimSpace(token))
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

		// 3. Read the body (bounded) and validate the whole request.
		body, err := s.readBody(req, op)
		if err != nil {
			return err
		}
		// The processor's webhook has no API key: its signature is checked
		// before any parsing, so an unsigned request costs one HMAC.
		if r.signed {
			if err := cardprocessor.Verify(s.cfg.ProcessorWebhookSecret, req.Header.Get(cardprocessor.SignatureHeader), body, time.Now(), cardprocessor.SignatureTolerance); err != nil {
				return problem.New(problem.InvalidSignature, "the Processor-Signature header does not verify: %v", err)
			}
		}
		// Before any parser, in one linear pass: refuse a body nested too
		// deep (every later parser recurses) and a member named twice (the
		// validator and the handler might each see a different value).
		if err := checkJSON(body); err != nil {
			return err
		}
		// Decoded once, for validation and fingerprint alike.
		doc, decodeErr := idempotency.DecodeJSON(body)
		input := &openapi3filter.RequestValidationInput{Request: req, PathParams: pathParams, Route: r.route}
		if err := s.validateRequest(ctx, input, body, doc, decodeErr); err != nil {
			return validationProblem(err)
		}
		// The validator may have consumed the body.
		req.Body = io.NopCloser(bytes.NewReader(body))

		// 4. Fingerprint the request for the handler's claim (checkJSON
		// was the fingerprint's I-JSON check too).
		if r.keyed {
			err := decodeErr // data after the JSON document (ErrTrailingData), which the validator does not read
			var fp []byte
			if err == nil {
				fp, err = idempotency.Fingerprint(req.Method, req.URL.Path, doc)
			}
			if err != nil {
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

// checkJSON refuses, with a 400 naming the place, a body over ijson's
// bounds, not Unicode text, or naming a member twice (I-JSON, RFC 7493).
func checkJSON(body []byte) error {
	refuse := func(pointer, detail, message string) error {
		p := problem.New(problem.InvalidRequest, "%s: %s", pointer, detail)
		p.Errors = []problem.FieldError{{Field: pointer, Message: message}}
		return p
	}
	switch e := ijson.Check(body).(type) {
	case *ijson.EncodingError:
		return refuse(e.Pointer, "a string must be Unicode text, with no invalid UTF-8 and no lone surrogate escape (I-JSON, RFC 7493)", "not valid Unicode")
	case *ijson.StringError:
		return refuse(e.Pointer, fmt.Sprintf("a string may be at most %d characters long", e.Limit), fmt.Sprintf("longer than %d characters", e.Limit))
	case *ijson.ValuesError:
		return refuse(e.Pointer, fmt.Sprintf("a body may hold at most %d values", e.Limit), fmt.Sprintf("past the limit of %d values", e.Limit))
	case *ijson.DepthError:
		return refuse(e.Pointer, fmt.Sprintf("the body is nested more than %d levels deep, the limit", e.Limit), fmt.Sprintf("nested more than %d levels deep", e.Limit))
	case *ijson.MembersError:
		return refuse(e.Pointer, fmt.Sprintf("an object may have at most %d members", e.Limit), fmt.Sprintf("more than %d members", e.Limit))
	case *ijson.DuplicateNameError:
		return refuse(e.Pointer, "a member name may appear only once in an object (I-JSON, RFC 7493)", "appears more than once")
	}
	return nil
}

// allowedMethods lists the contract's methods for req's path (a 405's Allow).
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

// requiresAuth reports whether the operation needs a bearer API key: by its
// own security list if any (the probes and webhook set an empty one), else
// the document's.
func requiresAuth(route *routers.Route) bool {
	sec := route.Spec.Security
	if route.Operation.Security != nil {
		sec = *route.Operation.Security
	}
	return len(sec) > 0
}

// readBody reads the body, refusing one over the size limit (413) or not
// JSON by its Content-Type (415), and puts it back for the validator.
func (s *Server) readBody(req *http.Request, op *openapi3.Operation) ([]byte, error) {
	if req.ContentLength > s.cfg.MaxBodyBytes {
		return nil, problem.New(problem.RequestTooLarge, "the request body is %d bytes; the limit is %d", req.ContentLength, s.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, s.cfg.MaxBodyBytes+1))
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		// The read deadline passed (a trickling client): the connection closes after this.
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
		// Media types are case-insensitive with parameters (Application/JSON;
		// charset=UTF-8): judge here, and hand the validator, whose match is
		// exact, one spelling. JSON is UTF-8 (RFC 8259): refuse, not misread.
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

// maxFieldErrors bounds the fields one problem lists: a 64 KiB body can
// hold thousands of unknown members, and the answer must stay small.
const maxFieldErrors = 20

// validationProblem turns the validator's errors into one 400 listing the invalid fields.
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
// errors, named by JSON pointer (body) or by name (parameter). Only the
// reason is kept: the validator's messages embed the whole schema.
func collectFieldErrors(err error, out *[]problem.FieldError) {
	var reqErr *openapi3filter.RequestError
	var multi openapi3.MultiError
	switch {
	case errors.As(err, &reqErr): // one parameter's, or the body's; before MultiError, which it unwraps to
		field := "" // a parameter's name; for the body, each error's JSON pointer
		if reqErr.Parameter != nil {
			field = reqErr.Parameter.Name
		}
		var schemaErrs []*openapi3.SchemaError
		collectSchemaErrors(reqErr.Err, &schemaErrs)
		for _, se := range schemaErrs {
			*out = append(*out, problem.FieldError{Field: cmp.Or(field, jsonPointer(se.JSONPointer())), Message: se.Reason})
		}
		if len(schemaErrs) == 0 {
			msg := reqErr.Reason
			if reqErr.Err != nil {
				msg = reqErr.Err.Error()
			}
			*out = append(*out, problem.FieldError{Field: field, Message: msg})
		}
	case errors.As(err, &multi):
		for _, e := range multi {
			collectFieldErrors(e, out)
		}
	default:
		*out = append(*out, problem.FieldError{Field: "", Message: err.Error()})
	}
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
