package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/idempotency"
)

// Echo has already routed every request before the contract middleware
// sees it, and c.Path() names the route template it matched. Matching the
// request again against the spec (kin-openapi's gorillamux router: a
// regular expression per path, and a copy of the route for every request)
// is work repeated for every request (docs/performance.md has what it
// cost). So the spec's route for each of Echo's templates
// is found once, at start-up, by the same router, and looked up by
// template per request.

// routeKey is a route as Echo names it: the method and the template
// (/v1/orders/:order_id).
type routeKey struct{ method, path string }

// apiRoute is the spec's route for one Echo route, with what the contract
// middleware asks of its operation on every request.
type apiRoute struct {
	route        *routers.Route
	keyed        bool
	requiresAuth bool
	signed       bool // the processor's webhook: Processor-Signature, no API key
}

// newAPIRoutes finds, with router, the spec's route for the Echo template
// of every operation in spec. An operation whose template router does not
// resolve to that same operation is left out, and its requests are matched
// by router at request time, as before.
func newAPIRoutes(spec *openapi3.T, router routers.Router) map[routeKey]*apiRoute {
	out := make(map[routeKey]*apiRoute)
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			// A sample request for the template, each {param} filled.
			sample := path
			for {
				i := strings.IndexByte(sample, '{')
				j := strings.IndexByte(sample, '}')
				if i < 0 || j < i {
					break
				}
				sample = sample[:i] + "x" + sample[j+1:]
			}
			req, err := http.NewRequestWithContext(context.Background(), method, sample, nil)
			if err != nil {
				continue
			}
			route, _, err := router.FindRoute(req)
			if err != nil || route.Operation != op || route.Path != path {
				continue
			}
			r := newAPIRoute(route)
			r.route = withoutSecurity(route)
			if r.keyed {
				r.route = withoutKeyParameter(r.route)
			}
			out[routeKey{method, echoTemplate(path)}] = r
		}
	}
	return out
}

// keyedRoute is a keyed operation's route, served by Server.keyed.
type keyedRoute struct {
	method, path string // as Echo names them
	op           idempotency.Operation
}

// declaredKeyed finds the declaration of every operation the spec marks
// keyed, or refuses, with the operation's name, a spec whose keyed
// operation nobody declared: that mistake shows at start-up, not as a 404
// or as a record nothing resumes.
func declaredKeyed(spec *openapi3.T, operations *idempotency.Registry) ([]keyedRoute, error) {
	var out []keyedRoute
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			if class, _ := op.Extensions["x-idempotency"].(string); !keyedClasses[class] {
				continue
			}
			declared, ok := operations.Lookup(op.OperationID)
			switch {
			case !ok:
				return nil, fmt.Errorf("operation %s is keyed in the spec, but nothing declares it: declare it in its domain package and register it in internal/app", op.OperationID)
			case !slices.Contains(op.Tags, "keyed"):
				// api/oapi-codegen.yaml leaves the operations tagged keyed
				// out of the strict interface, which this adapter serves.
				return nil, fmt.Errorf("operation %s is keyed in the spec, but not tagged keyed", op.OperationID)
			}
			out = append(out, keyedRoute{method, echoTemplate(path), declared})
		}
	}
	return out, nil
}

// newAPIRoute reads what the contract middleware needs of route's
// operation.
func newAPIRoute(route *routers.Route) *apiRoute {
	op := route.Operation
	class, _ := op.Extensions["x-idempotency"].(string)
	authn, _ := op.Extensions["x-authentication"].(string)
	return &apiRoute{
		route:        route,
		keyed:        keyedClasses[class],
		requiresAuth: requiresAuth(route),
		signed:       authn == "processor-signature",
	}
}

// withoutSecurity is route for the validator, with an empty list of
// security requirements. The contract authenticates the caller itself,
// before the body is read (requiresAuth, read from the route as the spec
// has it): a request that reaches the validator has passed, and the
// validator's own walk of the requirements (its AuthenticationFunc is a
// no-op) would only cost every request time. kin-openapi
// has no option to skip it; an empty list is one.
func withoutSecurity(route *routers.Route) *routers.Route {
	r, op := *route, *route.Operation
	op.Security = &openapi3.SecurityRequirements{}
	r.Operation = &op
	return &r
}

// withoutKeyParameter is route for the validator without its
// Idempotency-Key header parameter, when the spec's schema for it accepts
// every key idempotency.ParseKey accepts: the contract parses the key
// (step 2) before it validates (step 3), so on a keyed route the
// validator's check of the header could only ever pass, and costs every
// keyed request a decode and a schema walk. ParseKey accepts a header of at
// most 512 characters (255 escaped characters between two quotes), of
// printable ASCII; a schema that is a plain string of minLength at most 1
// and maxLength at least 512 can refuse none of them. Any other schema (a
// pattern, a format, a shorter bound) keeps the parameter, and the
// validator checks it as before.
func withoutKeyParameter(route *routers.Route) *routers.Route {
	op := route.Operation
	params := make(openapi3.Parameters, 0, len(op.Parameters))
	for _, p := range op.Parameters {
		if p.Value != nil && p.Value.In == openapi3.ParameterInHeader &&
			http.CanonicalHeaderKey(p.Value.Name) == "Idempotency-Key" && impliedByParseKey(p.Value) {
			continue
		}
		params = append(params, p)
	}
	if len(params) == len(op.Parameters) {
		return route
	}
	r, o := *route, *op
	o.Parameters = params
	r.Operation = &o
	return &r
}

// impliedByParseKey says whether the header parameter p can refuse no
// value that idempotency.ParseKey accepts.
func impliedByParseKey(p *openapi3.Parameter) bool {
	if p.Schema == nil || p.Schema.Value == nil || p.Content != nil {
		return false
	}
	sc := p.Schema.Value
	plain := *sc
	plain.Type, plain.MinLength, plain.MaxLength = nil, 0, nil
	plain.Description, plain.Example, plain.Extensions = "", nil, nil
	return sc.Type.Is(openapi3.TypeString) && sc.MinLength <= 1 &&
		(sc.MaxLength == nil || *sc.MaxLength >= 2*idempotency.MaxKeyLength+2) &&
		plain.IsEmpty()
}

// echoTemplate is the Echo route of an OpenAPI path, as oapi-codegen
// registers it: /v1/orders/{order_id} is /v1/orders/:order_id.
func echoTemplate(path string) string {
	return strings.NewReplacer("{", ":", "}", "").Replace(path)
}

// findRoute returns the spec's route for the request Echo routed in c and
// its path parameters, or ok false when the route table cannot answer: a
// route that is not the spec's (the demo page, the docs), an empty path
// parameter, or a path that was sent escaped (Echo and gorillamux read
// those differently). The caller then matches the request with the
// router, as before.
func (s *Server) findRoute(c echo.Context) (r *apiRoute, params map[string]string, ok bool) {
	req := c.Request()
	if req.URL.RawPath != "" {
		return nil, nil, false
	}
	r, ok = s.routes[routeKey{req.Method, c.Path()}]
	if !ok {
		return nil, nil, false
	}
	names, values := c.ParamNames(), c.ParamValues()
	params = make(map[string]string, len(names))
	for i, name := range names {
		if i >= len(values) || values[i] == "" {
			return nil, nil, false
		}
		params[name] = values[i]
	}
	return r, params, true
}

// validateRequest validates the request against the contract, as
// openapi3filter.ValidateRequest does with s.validation, but validates a
// JSON body from doc, the body already decoded once for the fingerprint
// too (idempotency.DecodeJSON of body; decodeErr its error), rather than
// have the validator decode it again. Anything but a JSON body with a
// schema is left to the validator itself. The errors are the validator's,
// in its order: the parameters', then the body's.
func (s *Server) validateRequest(ctx context.Context, input *openapi3filter.RequestValidationInput, body []byte, doc *any, decodeErr error) error {
	rb := input.Route.Operation.RequestBody
	var mt *openapi3.MediaType
	if rb != nil && rb.Value != nil && len(body) > 0 {
		mt = rb.Value.Content.Get(input.Request.Header.Get("Content-Type"))
	}
	// The cases the validator's own body decoding would read as ours
	// does: json.Decoder with UseNumber, the first document of the body.
	own := mt != nil && mt.Schema != nil && mt.Schema.Value != nil && len(mt.Encoding) == 0 &&
		input.Request.Header.Get("Content-Type") == "application/json" &&
		doc != nil && (decodeErr == nil || errors.Is(decodeErr, idempotency.ErrTrailingData))
	if !own {
		input.Options = &s.validation
		return openapi3filter.ValidateRequest(ctx, input)
	}
	input.Options = &s.validationNoBody
	err := openapi3filter.ValidateRequest(ctx, input)
	opts := []openapi3.SchemaValidationOption{openapi3.VisitAsRequest(), openapi3.MultiErrors()}
	if input.Route.Spec.IsOpenAPI31OrLater() {
		opts = append(opts, openapi3.EnableJSONSchema2020())
	}
	bodyErr := mt.Schema.Value.VisitJSON(*doc, opts...)
	if bodyErr == nil {
		return err
	}
	id := strings.TrimSpace(mt.Schema.Ref)
	if id == "" {
		id = strings.TrimSpace(mt.Schema.Value.Title)
	}
	if id != "" {
		id = " " + id
	}
	reqErr := &openapi3filter.RequestError{
		Input:       input,
		RequestBody: rb.Value,
		Reason:      fmt.Sprintf("doesn't match schema%s", id),
		Err:         bodyErr,
	}
	var me openapi3.MultiError
	errors.As(err, &me)
	return append(me, reqErr)
}
