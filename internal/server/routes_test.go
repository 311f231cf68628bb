package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/api"
	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/idempotency"
)

func testRoutes(t *testing.T) (*Server, routers.Router) {
	t.Helper()
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	spec.Servers = nil
	router, err := gorillamux.NewRouter(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{router: router, routes: newAPIRoutes(spec, router), validation: openapi3filter.Options{
		MultiError:          true,
		AuthenticationFunc:  openapi3filter.NoopAuthenticationFunc,
		SkipSettingDefaults: true,
	}}
	s.validationNoBody = s.validation
	s.validationNoBody.ExcludeRequestBody = true
	return s, router
}

// Every route the generated code registers with Echo is in the route
// table, under the operation whose handler it calls, and the table holds
// nothing else: no request to an operation falls back to matching the
// spec at request time, and none is validated as another operation.
func TestEveryEchoRouteNamesItsOperation(t *testing.T) {
	t.Parallel()
	s, router := testRoutes(t)
	e := echo.New()
	apigen.RegisterHandlers(e, apigen.NewStrictHandler(s, nil))
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := idempotency.NewRegistry(stubs(spec, "")...)
	if err != nil {
		t.Fatal(err)
	}
	declared, err := declaredRoutes(spec, ops)
	if err != nil {
		t.Fatal(err)
	}
	declaredOp := map[routeKey]string{}
	for _, r := range declared {
		e.Add(r.method, r.path, s.declared(r.op))
		declaredOp[routeKey{r.method, r.path}] = r.op.Name
	}
	routes := e.Routes()
	if len(routes) == 0 {
		t.Fatal("no routes registered")
	}
	for _, er := range routes {
		r, ok := s.routes[routeKey{er.Method, er.Path}]
		if !ok {
			t.Errorf("%s %s (%s): not in the route table", er.Method, er.Path, er.Name)
			continue
		}
		id := r.route.Operation.OperationID
		if name, ok := declaredOp[routeKey{er.Method, er.Path}]; ok {
			if name != id {
				t.Errorf("%s %s: the table says %s, the keyed adapter serves %s", er.Method, er.Path, id, name)
			}
		} else if want := "." + strings.ToUpper(id[:1]) + id[1:] + "-fm"; !strings.HasSuffix(er.Name, want) {
			t.Errorf("%s %s: the table says %s, Echo calls %s", er.Method, er.Path, id, er.Name)
		}
		// And the router, matching a request to this route, finds the
		// same route, with the same parameters as Echo's.
		path := er.Path
		for _, seg := range strings.Split(er.Path, "/") {
			if name, ok := strings.CutPrefix(seg, ":"); ok {
				path = strings.Replace(path, seg, "v_"+name, 1)
			}
		}
		req := httptest.NewRequest(er.Method, path, nil)
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Errorf("%s %s: %v", er.Method, path, err)
			continue
		}
		// The table's route is the router's, but for the validator's
		// security list (withoutSecurity) and, on keyed routes, its
		// Idempotency-Key parameter (withoutKeyParameter); whether the
		// caller must authenticate is read from the spec's.
		want := withoutSecurity(route)
		if r.keyed {
			want = withoutKeyParameter(want)
		}
		if !reflect.DeepEqual(want, r.route) {
			t.Errorf("%s %s: the router finds %s %s, the table has %s %s", er.Method, path, route.Method, route.Path, r.route.Method, r.route.Path)
		}
		if r.requiresAuth != requiresAuth(route) {
			t.Errorf("%s %s: the table says requiresAuth %v, the spec %v", er.Method, path, r.requiresAuth, requiresAuth(route))
		}
		c := e.NewContext(req, httptest.NewRecorder())
		e.Router().Find(er.Method, path, c)
		_, echoParams, ok := s.findRoute(c)
		if !ok {
			t.Errorf("%s %s: findRoute does not answer (Echo matched %s)", er.Method, path, c.Path())
			continue
		}
		if !reflect.DeepEqual(echoParams, params) {
			t.Errorf("%s %s: parameters %v from Echo, %v from the router", er.Method, path, echoParams, params)
		}
	}
	if len(s.routes) != len(routes) {
		t.Errorf("the route table has %d routes, Echo %d", len(s.routes), len(routes))
	}
}

// What the route table cannot answer it says so, and the router decides
// as before: a path sent escaped, an empty parameter, a route of Echo's
// that is not an operation.
func TestFindRouteLeavesTheRestToTheRouter(t *testing.T) {
	t.Parallel()
	s, _ := testRoutes(t)
	e := echo.New()
	apigen.RegisterHandlers(e, apigen.NewStrictHandler(s, nil))
	e.GET("/*", func(echo.Context) error { return nil })
	for _, target := range []string{"/v1/orders/a%2Fb", "/v1/orders/", "/index.html", "/v1/nope"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		c := e.NewContext(req, httptest.NewRecorder())
		e.Router().Find(req.Method, echo.GetPath(req), c)
		if r, _, ok := s.findRoute(c); ok {
			t.Errorf("GET %s (Echo: %s): answered with %s", target, c.Path(), r.route.Path)
		}
	}
}

// validateRequest, validating the body from its one decoding, finds what
// kin-openapi's ValidateRequest finds decoding the body itself: the same
// problem, field by field, for every body.
func TestValidateRequestFromTheDecodedBodyAsTheValidator(t *testing.T) {
	t.Parallel()
	s, router := testRoutes(t)
	cases := []struct{ method, path, body string }{
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea"}`},
		{"POST", "/v1/orders", `{"amount":"1999","currency":"usd"}`},
		{"POST", "/v1/orders", `{"amount":-1,"currency":"xxx","extra":true,"more":[1]}`},
		{"POST", "/v1/orders", `{"currency":"usd"}`},
		{"POST", "/v1/orders", `[]`},
		{"POST", "/v1/orders", `null`},
		{"POST", "/v1/orders", `{"amount":1.5e400,"currency":"usd"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd"} {"x":1}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd"`},
		{"POST", "/v1/orders", `  `},
		{"POST", "/v1/orders", ``},
		{"POST", "/v1/orders/ord_1/charges", `{"payment_method":"pm_card_visa"}`},
		{"POST", "/v1/orders/ord_1/charges", `{"payment_method":7}`},
		{"POST", "/v1/charges/ch_1/refunds", `{"amount":0}`},
		{"POST", "/v1/payouts", `{"amount":100,"currency":"usd","x":null}`},
		{"POST", "/webhooks/processor", `{"id":"evt_1"}`},
	}
	for _, c := range cases {
		t.Run(c.method+c.path+" "+c.body, func(t *testing.T) {
			// The library, as the contract called it before.
			want := validate(t, router, c.method, c.path, c.body, func(ctx context.Context, in *openapi3filter.RequestValidationInput) error {
				in.Options = &s.validation
				return openapi3filter.ValidateRequest(ctx, in)
			})
			got := validate(t, router, c.method, c.path, c.body, func(ctx context.Context, in *openapi3filter.RequestValidationInput) error {
				doc, err := idempotency.DecodeJSON([]byte(c.body))
				return s.validateRequest(ctx, in, []byte(c.body), doc, err)
			})
			if got != want {
				t.Errorf("validated from the decoded body:\n  %s\nby the validator:\n  %s", got, want)
			}
		})
	}
}

// validate runs f on a request for method, path and body, as the contract
// prepares it, and describes the problem it answers ("ok" for none).
func validate(t *testing.T, router routers.Router, method, path, body string, f func(context.Context, *openapi3filter.RequestValidationInput) error) string {
	t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-1")
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatal(err)
	}
	err = f(req.Context(), &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route})
	if err == nil {
		return "ok"
	}
	p := validationProblem(err)
	return fmt.Sprintf("%s %+v", p.Detail, p.Errors)
}

// On keyed routes the validator does not check the Idempotency-Key header
// again: the contract parsed it before, and the spec's schema for it can
// refuse no key ParseKey accepts. A schema that could is kept, and the
// validator checks the header as before.
func TestValidatorSkipsTheKeyOnlyWhenParseKeyImpliesIt(t *testing.T) {
	t.Parallel()
	s, _ := testRoutes(t)
	hasKey := func(r *apiRoute) bool {
		for _, p := range r.route.Operation.Parameters {
			if p.Value != nil && p.Value.Name == "Idempotency-Key" {
				return true
			}
		}
		return false
	}
	keyed := 0
	for k, r := range s.routes {
		if r.keyed {
			keyed++
			if hasKey(r) {
				t.Errorf("%s %s: the validator still checks the Idempotency-Key", k.method, k.path)
			}
		}
	}
	if keyed == 0 {
		t.Fatal("no keyed route in the table")
	}

	// The longest header ParseKey accepts: 255 escaped characters in quotes.
	longest := `"` + strings.Repeat(`\"`, idempotency.MaxKeyLength) + `"`
	if key, err := idempotency.ParseKey([]string{longest}); err != nil || len(key) != idempotency.MaxKeyLength {
		t.Fatalf("ParseKey(%d characters) = %d characters, %v", len(longest), len(key), err)
	}
	if _, err := idempotency.ParseKey([]string{longest[:len(longest)-1] + `x"`}); err == nil {
		t.Fatal("ParseKey accepted a 256-character key")
	}
	schema := func(edit func(*openapi3.Schema)) *openapi3.Parameter {
		sc := openapi3.NewStringSchema()
		sc.MinLength = 1
		sc.MaxLength = openapi3.Ptr(uint64(len(longest)))
		edit(sc)
		return &openapi3.Parameter{Name: "Idempotency-Key", In: openapi3.ParameterInHeader, Schema: sc.NewRef()}
	}
	for _, tc := range []struct {
		name    string
		param   *openapi3.Parameter
		implied bool
	}{
		{"the spec's", schema(func(*openapi3.Schema) {}), true},
		{"no maxLength", schema(func(sc *openapi3.Schema) { sc.MaxLength = nil }), true},
		{"maxLength one short", schema(func(sc *openapi3.Schema) { sc.MaxLength = openapi3.Ptr(uint64(len(longest) - 1)) }), false},
		{"minLength 2", schema(func(sc *openapi3.Schema) { sc.MinLength = 2 }), false},
		{"a pattern", schema(func(sc *openapi3.Schema) { sc.Pattern = "^[a-z0-9-]+$" }), false},
		{"a format", schema(func(sc *openapi3.Schema) { sc.Format = "uuid" }), false},
		{"an enum", schema(func(sc *openapi3.Schema) { sc.Enum = []any{"a"} }), false},
		{"an integer", schema(func(sc *openapi3.Schema) { sc.Type = &openapi3.Types{openapi3.TypeInteger} }), false},
	} {
		if got := impliedByParseKey(tc.param); got != tc.implied {
			t.Errorf("%s: impliedByParseKey = %v, want %v", tc.name, got, tc.implied)
		}
	}
}

// The validator matches a keyed body's member names exactly, and the
// operation's decode (encoding/json) regardless of case. The two agree
// only while a keyed body's schema allows no member it does not name, at
// every level: this test fails when a keyed operation's body is opened, so
// that whoever opens it decides how the body is then decoded.
func TestKeyedBodiesAllowNoUnknownMember(t *testing.T) {
	t.Parallel()
	s, _ := testRoutes(t)
	var closed func(path string, sc *openapi3.SchemaRef) []string
	closed = func(path string, sc *openapi3.SchemaRef) []string {
		if sc == nil || sc.Value == nil {
			return nil
		}
		var open []string
		v := sc.Value
		if v.Type.Is(openapi3.TypeObject) {
			if v.AdditionalProperties.Has == nil || *v.AdditionalProperties.Has || v.AdditionalProperties.Schema != nil {
				open = append(open, path)
			}
			for name, p := range v.Properties {
				open = append(open, closed(path+"/"+name, p)...)
			}
		}
		if v.Items != nil {
			open = append(open, closed(path+"/items", v.Items)...)
		}
		for _, sub := range slices.Concat(v.AllOf, v.AnyOf, v.OneOf) {
			open = append(open, closed(path, sub)...)
		}
		return open
	}
	bodies := 0
	for k, r := range s.routes {
		rb := r.route.Operation.RequestBody
		if !r.keyed || rb == nil || rb.Value == nil {
			continue
		}
		for media, mt := range rb.Value.Content {
			bodies++
			for _, path := range closed("", mt.Schema) {
				t.Errorf("%s %s (%s): the object at %q allows members it does not name", k.method, k.path, media, path+"/")
			}
		}
	}
	if bodies == 0 {
		t.Fatal("no keyed operation with a body")
	}
}

// stubLocal declares a local operation under name that is never run.
func stubLocal(name string) idempotency.Operation {
	return idempotency.Local(name, func(context.Context, pgx.Tx, idempotency.Input[struct{}]) (*idempotency.Response, error) {
		return nil, errors.New("a stub")
	})
}

// keyedStubs declares a stub for every operation the spec marks keyed or
// tags declared but the one named except.
func stubs(spec *openapi3.T, except string) []idempotency.Operation {
	var out []idempotency.Operation
	for _, item := range spec.Paths.Map() {
		for _, op := range item.Operations() {
			class, _ := op.Extensions["x-idempotency"].(string)
			switch {
			case op.OperationID == except:
			case keyedClasses[class]:
				out = append(out, stubLocal(op.OperationID))
			case slices.Contains(op.Tags, "declared"):
				out = append(out, idempotency.Safe(op.OperationID, func(context.Context, dbsqlc.DBTX, idempotency.Input[struct{}]) (*idempotency.Response, error) {
					return nil, errors.New("a stub")
				}))
			}
		}
	}
	return out
}

// A declared read takes the caller and the path (Safe's Input), so
// start-up refuses one with query parameters, or with no API key.
func TestDeclaredReadNeedsAKeyAndNoQuery(t *testing.T) {
	for name, change := range map[string]func(*openapi3.Operation){
		"a query parameter": func(op *openapi3.Operation) {
			op.Parameters = append(op.Parameters, &openapi3.ParameterRef{Value: &openapi3.Parameter{Name: "q", In: "query"}})
		},
		"no API key": func(op *openapi3.Operation) { op.Security = &openapi3.SecurityRequirements{} },
	} {
		spec, err := api.Load()
		if err != nil {
			t.Fatal(err)
		}
		change(spec.Paths.Value("/v1/orders/{order_id}").Get)
		ops, err := idempotency.NewRegistry(stubs(spec, "")...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := declaredRoutes(spec, ops); err == nil || !strings.Contains(err.Error(), "getOrder") {
			t.Errorf("getOrder with %s: %v; want start-up refused, naming it", name, err)
		}
	}
}

// Start-up refuses an operation the spec marks keyed that nothing
// declares, and names it; and an external declaration with no step after
// its start, which nothing would ever finish.
func TestUndeclaredKeyedOperationIsRefused(t *testing.T) {
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := idempotency.NewRegistry(stubs(spec, "createRefund")...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := declaredRoutes(spec, ops); err == nil || !strings.Contains(err.Error(), "createRefund") {
		t.Errorf("createRefund undeclared: %v; want an error naming it", err)
	}
	all := stubs(spec, "")
	if ops, err = idempotency.NewRegistry(all...); err != nil {
		t.Fatal(err)
	}
	if routes, err := declaredRoutes(spec, ops); err != nil || len(routes) != len(all) || len(all) < 4 {
		t.Errorf("every keyed operation declared: %d routes of %d, %v", len(routes), len(all), err)
	}

	noSteps := idempotency.External[struct{}]{
		Name: "createRefund",
		Start: func(context.Context, pgx.Tx, idempotency.Record, idempotency.Input[struct{}]) (idempotency.Result, error) {
			return idempotency.RecoveryFinished, nil
		},
	}
	if _, err := idempotency.NewRegistry(noSteps.Operation()); err == nil || !strings.Contains(err.Error(), "createRefund") {
		t.Errorf("an external operation with no steps: %v; want an error naming it", err)
	}
	if _, err := idempotency.NewRegistry(stubLocal("createOrder"), stubLocal("createOrder")); err == nil {
		t.Error("one operation declared twice: no error")
	}
}
