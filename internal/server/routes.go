package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/idempotency"
)

// The route table. Echo has routed every request before the contract sees
// it (c.Path() is the template); matching it again with kin-openapi's
// router costs a regular expression per path and a copy of the route
// (docs/performance.md). So each template's route is found once, at start.

// routeKey is a route as Echo names it: method and template (/v1/orders/:order_id).
type routeKey struct{ method, path string }

// apiRoute is the spec's route for an Echo route, and what the contract asks of it.
type apiRoute struct {
	route        *routers.Route
	keyed        bool
	requiresAuth bool
	signed       bool // the processor's webhook: Processor-Signature, no API key
}

// newAPIRoutes finds, with router, the spec's route for every operation's
// Echo template; one it does not resolve to itself is matched per request.
func newAPIRoutes(spec *openapi3.T, router routers.Router) map[routeKey]*apiRoute {
	out := make(map[routeKey]*apiRoute)
	param := regexp.MustCompile(`\{[^}]*\}`)
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			sample := param.ReplaceAllString(path, "x") // a request for the template
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

// declaredRoute is a declared operation's route, served by Server.declared.
type declaredRoute struct {
	method, path string // as Echo names them
	op           idempotency.Operation
}

// declaredRoutes finds the declaration of every operation the spec marks
// keyed, and of every read it tags declared, or names one nobody declared:
// at start-up, not as a 404 later. (api/oapi-codegen.yaml leaves operations
// with either tag out of the strict interface, for Server.declared to serve.)
func declaredRoutes(spec *openapi3.T, operations *idempotency.Registry) ([]declaredRoute, error) {
	var out []declaredRoute
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			class, _ := op.Extensions["x-idempotency"].(string)
			keyed, tagged := keyedClasses[class], slices.Contains(op.Tags, "declared")
			if !keyed && !tagged {
				continue
			}
			what := "keyed"
			if !keyed {
				what = "tagged declared"
			}
			declared, ok := operations.Lookup(op.OperationID)
			switch {
			case !ok:
				return nil, fmt.Errorf("operation %s is %s in the spec, but nothing declares it: declare it in its domain package and register it in internal/app", op.OperationID, what)
			case keyed && !slices.Contains(op.Tags, "keyed"):
				return nil, fmt.Errorf("operation %s is keyed in the spec, but not tagged keyed", op.OperationID)
			case keyed && declared.Safe, !keyed && !declared.Safe, !keyed && class != "safe":
				// A read declared for a keyed operation, or the other way round.
				return nil, fmt.Errorf("operation %s: the spec's class is %q; declare a safe one with idempotency.Safe and tag it declared, a keyed one with Local or External", op.OperationID, class)
			case !keyed && (op.Security != nil && len(*op.Security) == 0 ||
				slices.ContainsFunc(slices.Concat(item.Parameters, op.Parameters), func(p *openapi3.ParameterRef) bool { return p.Value.In == "query" })):
				// Safe's Input has the caller and the path, nothing else.
				return nil, fmt.Errorf("operation %s: a declared read needs an API key and takes no query parameters; write a handler in internal/server", op.OperationID)
			}
			out = append(out, declaredRoute{method, echoTemplate(path), declared})
		}
	}
	return out, nil
}

// newAPIRoute reads what the contract needs of route's operation.
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

// withoutSecurity is route for the validator, without security: the
// contract has authenticated, so the validator's walk of the requirements
// (with a no-op AuthenticationFunc) only costs time, and cannot be skipped.
func withoutSecurity(route *routers.Route) *routers.Route {
	r, op := *route, *route.Operation
	op.Security = &openapi3.SecurityRequirements{}
	r.Operation = &op
	return &r
}

// withoutKeyParameter is route for the validator without its
// Idempotency-Key parameter, when its schema accepts every key ParseKey
// does: the contract parsed the key (step 2) before validating (step 3), so
// the check could only pass, at the cost of a decode and a schema walk. Any
// schema but a plain string of minLength ≤ 1 and maxLength ≥ 512 (ParseKey's
// limit: 255 characters, escaped, between quotes) is kept.
func withoutKeyParameter(route *routers.Route) *routers.Route {
	op := route.Operation
	params := slices.DeleteFunc(slices.Clone(op.Parameters), func(p *openapi3.ParameterRef) bool {
		return p.Value != nil && p.Value.In == openapi3.ParameterInHeader &&
			http.CanonicalHeaderKey(p.Value.Name) == "Idempotency-Key" && impliedByParseKey(p.Value)
	})
	if len(params) == len(op.Parameters) {
		return route
	}
	r, o := *route, *op
	o.Parameters = params
	r.Operation = &o
	return &r
}

// impliedByParseKey says whether p can refuse no value ParseKey accepts.
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

// findRoute returns the spec's route for the request Echo routed in c, and
// its path parameters; or ok false, for the router to decide: a route not
// the spec's (the demo page, the docs), an empty path parameter, or an
// escaped path (Echo and gorillamux read those differently).
func (s *Server) findRoute(c echo.Context) (r *apiRoute, params map[string]string, ok bool) {
	req := c.Request()
	if r, ok = s.routes[routeKey{req.Method, c.Path()}]; !ok || req.URL.RawPath != "" {
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

// validateRequest is openapi3filter.ValidateRequest with s.validation, but
// validates a JSON body from doc, its one decoding (decodeErr its error);
// anything else is left to the validator. The errors are its, in its order.
func (s *Server) validateRequest(ctx context.Context, input *openapi3filter.RequestValidationInput, body []byte, doc *any, decodeErr error) error {
	rb := input.Route.Operation.RequestBody
	var mt *openapi3.MediaType
	if rb != nil && rb.Value != nil && len(body) > 0 {
		mt = rb.Value.Content.Get(input.Request.Header.Get("Content-Type"))
	}
	// Where the validator's decoding (json.Decoder with UseNumber, the
	// body's first document) would read what ours read.
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
	reason := "doesn't match schema" // and the schema's name, as the validator says it
	if id := cmp.Or(strings.TrimSpace(mt.Schema.Ref), strings.TrimSpace(mt.Schema.Value.Title)); id != "" {
		reason += " " + id
	}
	reqErr := &openapi3filter.RequestError{Input: input, RequestBody: rb.Value, Reason: reason, Err: bodyErr}
	var me openapi3.MultiError
	errors.As(err, &me)
	return append(me, reqErr)
}
