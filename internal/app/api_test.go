package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/retrysafe/payments/api"
	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/server"
)

type order struct {
	ID          string  `json:"id"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Description *string `json:"description"`
	Status      string  `json:"status"`
}

func (ts *testServer) newOrder(t testing.TB, apiKey string, amount int) order {
	t.Helper()
	res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: apiKey,
		header: http.Header{"Idempotency-Key": {fmt.Sprintf("%s-%d-%p", apiKey, amount, t)}},
		body:   fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, amount)})
	if res.Status != http.StatusCreated {
		t.Fatalf("create order: %d %s", res.Status, res.Body)
	}
	var o order
	res.decode(t, &o)
	return o
}

func TestGetAndListOrders(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	var created []order
	for i := 1; i <= 5; i++ {
		created = append(created, ts.newOrder(t, "sk_test_acme", i*100))
	}
	res := ts.get(t, "/v1/orders/"+created[0].ID)
	var got order
	res.decode(t, &got)
	if res.Status != http.StatusOK || got.ID != created[0].ID || got.Amount != 100 || got.Currency != "usd" || got.Description != nil || got.Status != "pending" {
		t.Errorf("get: %d %s", res.Status, res.Body)
	}

	// Newest first, two at a time.
	var ids []string
	path := "/v1/orders?limit=2"
	for page := 0; ; page++ {
		var list struct {
			Data    []order `json:"data"`
			HasMore bool    `json:"has_more"`
		}
		ts.get(t, path).decode(t, &list)
		for _, o := range list.Data {
			ids = append(ids, o.ID)
		}
		if !list.HasMore {
			if page != 2 || len(list.Data) != 1 {
				t.Errorf("last page %d has %d orders", page, len(list.Data))
			}
			break
		}
		path = "/v1/orders?limit=2&starting_after=" + list.Data[len(list.Data)-1].ID
	}
	want := []string{created[4].ID, created[3].ID, created[2].ID, created[1].ID, created[0].ID}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("listed %v; want newest first %v", ids, want)
	}
	var all struct {
		Data []order `json:"data"`
	}
	ts.get(t, "/v1/orders").decode(t, &all)
	if len(all.Data) != 5 {
		t.Errorf("default page has %d orders; want all 5 (default limit 10)", len(all.Data))
	}

	ts.get(t, "/v1/orders/ord_doesnotexist").wantProblem(t, http.StatusNotFound, "not_found")
	ts.get(t, "/v1/orders?starting_after=ord_doesnotexist").wantProblem(t, http.StatusBadRequest, "invalid_request")
	for _, q := range []string{"limit=0", "limit=101", "limit=ten"} {
		p := ts.get(t, "/v1/orders?"+q).wantProblem(t, http.StatusBadRequest, "invalid_request")
		if errs, _ := p["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["field"] != "limit" {
			t.Errorf("%s: field errors %v; want one for limit", q, p["errors"])
		}
	}
}

func TestCancelOrderIsNaturallyIdempotent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 500)
	cancel := request{method: "POST", path: "/v1/orders/" + o.ID + "/cancel", apiKey: "sk_test_acme"}

	first := ts.do(t, cancel)
	second := ts.do(t, cancel)
	for _, res := range []response{first, second} {
		var got order
		res.decode(t, &got)
		if res.Status != http.StatusOK || got.Status != "canceled" || got.ID != o.ID {
			t.Errorf("cancel: %d %s", res.Status, res.Body)
		}
	}
	if !bytes.Equal(first.Body, second.Body) {
		t.Errorf("canceling twice gave different states:\n%s\n%s", first.Body, second.Body)
	}

	paid := ts.newOrder(t, "sk_test_acme", 700)
	if _, err := ts.db.Exec(context.Background(), `UPDATE orders SET status = 'paid' WHERE id = $1`, paid.ID); err != nil {
		t.Fatal(err)
	}
	ts.do(t, request{method: "POST", path: "/v1/orders/" + paid.ID + "/cancel", apiKey: "sk_test_acme"}).
		wantProblem(t, http.StatusConflict, "order_not_cancelable")
	var status string
	if err := ts.db.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, paid.ID).Scan(&status); err != nil || status != "paid" {
		t.Errorf("paid order is now %q (%v)", status, err)
	}
	ts.do(t, request{method: "POST", path: "/v1/orders/ord_nope/cancel", apiKey: "sk_test_acme"}).
		wantProblem(t, http.StatusNotFound, "not_found")
}

// A caller never sees, replays or collides with another caller's orders or
// keys: the key store's identity is (caller, key).
func TestCallersAreIsolated(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	acme := ts.createOrder(t, "shared-key", teaOrder)
	var acmeOrder order
	acme.decode(t, &acmeOrder)

	// globex uses the same key for a different body: not a 422, not a replay.
	globex := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: "sk_test_globex",
		header: http.Header{"Idempotency-Key": {"shared-key"}}, body: `{"amount":42,"currency":"eur"}`})
	if globex.Status != http.StatusCreated || globex.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("globex with acme's key: %d %s; want its own fresh order", globex.Status, globex.Body)
	}
	var globexOrder order
	globex.decode(t, &globexOrder)

	asGlobex := func(method, path string) response {
		return ts.do(t, request{method: method, path: path, apiKey: "sk_test_globex"})
	}
	asGlobex("GET", "/v1/orders/"+acmeOrder.ID).wantProblem(t, http.StatusNotFound, "not_found")
	asGlobex("POST", "/v1/orders/"+acmeOrder.ID+"/cancel").wantProblem(t, http.StatusNotFound, "not_found")
	asGlobex("GET", "/v1/orders?starting_after="+acmeOrder.ID).wantProblem(t, http.StatusBadRequest, "invalid_request")
	var list struct {
		Data []order `json:"data"`
	}
	asGlobex("GET", "/v1/orders").decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != globexOrder.ID {
		t.Errorf("globex lists %+v; want only its own order", list.Data)
	}
	var rec struct {
		RequestPath    string `json:"request_path"`
		ResponseStatus int    `json:"response_status"`
	}
	res := asGlobex("GET", "/v1/idempotency-keys/shared-key")
	res.decode(t, &rec)
	if res.Status != http.StatusOK || rec.RequestPath != "/v1/orders" || rec.ResponseStatus != http.StatusCreated {
		t.Errorf("globex's key record: %d %s", res.Status, res.Body)
	}
	// A key only acme has used does not exist for globex.
	if res := ts.createOrder(t, "acme-only", teaOrder); res.Status != http.StatusCreated {
		t.Fatal(res.Status)
	}
	asGlobex("GET", "/v1/idempotency-keys/acme-only").wantProblem(t, http.StatusNotFound, "not_found")
	// acme's order is untouched and still replays to acme.
	if again := ts.createOrder(t, "shared-key", teaOrder); !bytes.Equal(again.Body, acme.Body) {
		t.Errorf("acme's replay changed: %s", again.Body)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for name, header := range map[string]http.Header{
		"no header":      {},
		"unknown key":    {"Authorization": {"Bearer sk_test_nobody"}},
		"wrong scheme":   {"Authorization": {"Basic c2tfdGVzdF9hY21lOg=="}},
		"empty bearer":   {"Authorization": {"Bearer "}},
		"key without it": {"Authorization": {"sk_test_acme"}},
	} {
		res := ts.do(t, request{method: "POST", path: "/v1/orders", header: header, body: teaOrder})
		if res.Status != http.StatusUnauthorized {
			t.Errorf("%s: %d", name, res.Status)
			continue
		}
		res.wantProblem(t, http.StatusUnauthorized, "unauthorized")
	}
	if n := ts.count(t, "idempotency_keys") + ts.count(t, "orders"); n != 0 {
		t.Errorf("unauthenticated requests wrote %d rows", n)
	}
	// Authentication comes before the key check: no key and no auth is a 401.
	ts.do(t, request{method: "POST", path: "/v1/orders", body: teaOrder}).wantProblem(t, http.StatusUnauthorized, "unauthorized")
	// Health checks need no key.
	for _, path := range []string{"/healthz", "/readyz"} {
		if res := ts.do(t, request{method: "GET", path: path}); res.Status != http.StatusOK {
			t.Errorf("%s: %d %s", path, res.Status, res.Body)
		}
	}
}

// Every bad input gets a clear problem and changes nothing.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.MaxBodyBytes = 1024 }))
	long := strings.Repeat("x", 501)
	for _, tc := range []struct {
		name       string
		req        request
		status     int
		code       string
		fieldNamed string
	}{
		{"zero amount", ordersRequest("k", `{"amount":0,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"negative amount", ordersRequest("k", `{"amount":-5,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"fractional amount", ordersRequest("k", `{"amount":19.99,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"amount as string", ordersRequest("k", `{"amount":"1999","currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"huge amount", ordersRequest("k", `{"amount":100000000,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"unsupported currency", ordersRequest("k", `{"amount":5,"currency":"xyz"}`), 400, "invalid_request", "/currency"},
		{"upper-case currency", ordersRequest("k", `{"amount":5,"currency":"USD"}`), 400, "invalid_request", "/currency"},
		{"missing currency", ordersRequest("k", `{"amount":5}`), 400, "invalid_request", ""},
		{"unknown field", ordersRequest("k", `{"amount":5,"currency":"usd","card_number":"4242424242424242"}`), 400, "invalid_request", ""},
		{"description too long", ordersRequest("k", `{"amount":5,"currency":"usd","description":"`+long+`"}`), 400, "invalid_request", "/description"},
		{"NUL in description", ordersRequest("k", `{"amount":5,"currency":"usd","description":"a\u0000b"}`), 400, "invalid_request", "/description"},
		{"amount with a fraction part", ordersRequest("k", `{"amount":1999.0,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"amount in exponent form", ordersRequest("k", `{"amount":1e3,"currency":"usd"}`), 400, "invalid_request", "/amount"},
		{"field name in other case", ordersRequest("k", `{"AMOUNT":5,"amount":5,"currency":"usd"}`), 400, "invalid_request", ""},
		{"malformed order id", request{method: "GET", path: "/v1/orders/ord%00x", apiKey: "sk_test_acme"}, 400, "invalid_request", "order_id"},
		{"malformed cursor", request{method: "GET", path: "/v1/orders?starting_after=%27%3B--", apiKey: "sk_test_acme"}, 400, "invalid_request", "starting_after"},
		{"malformed key in path", request{method: "GET", path: "/v1/idempotency-keys/a%00b", apiKey: "sk_test_acme"}, 400, "invalid_request", "key"},
		{"key in path too long", request{method: "GET", path: "/v1/idempotency-keys/" + strings.Repeat("k", 256), apiKey: "sk_test_acme"}, 400, "invalid_request", "key"},
		{"not JSON", ordersRequest("k", `amount=5`), 400, "invalid_request", ""},
		{"truncated JSON", ordersRequest("k", `{"amount":5,`), 400, "invalid_request", ""},
		{"JSON array", ordersRequest("k", `[1,2]`), 400, "invalid_request", ""},
		{"empty body", request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", header: http.Header{"Idempotency-Key": {"k"}, "Content-Type": {"application/json"}}}, 400, "invalid_request", ""},
		{"too large", ordersRequest("k", `{"amount":5,"currency":"usd","description":"`+strings.Repeat("y", 2000)+`"}`), 413, "request_too_large", ""},
		{"wrong content type", request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", header: http.Header{"Idempotency-Key": {"k"}, "Content-Type": {"text/plain"}}, body: teaOrder}, 415, "unsupported_media_type", ""},
		{"unknown path", request{method: "GET", path: "/v1/nothing", apiKey: "sk_test_acme"}, 404, "not_found", ""},
		{"wrong method", request{method: "PUT", path: "/v1/orders", apiKey: "sk_test_acme"}, 405, "method_not_allowed", ""},
		{"refund of an unknown charge", request{method: "POST", path: "/v1/charges/ch_x/refunds", apiKey: "sk_test_acme", header: http.Header{"Idempotency-Key": {"c"}}, body: `{"amount":5}`}, 404, "not_found", ""},
		{"charge of an unknown order", request{method: "POST", path: "/v1/orders/ord_x/charges", apiKey: "sk_test_acme", header: http.Header{"Idempotency-Key": {"c"}}, body: `{"payment_method":"pm_card_visa"}`}, 404, "not_found", ""},
		{"charge with a malformed payment method", request{method: "POST", path: "/v1/orders/ord_x/charges", apiKey: "sk_test_acme", header: http.Header{"Idempotency-Key": {"c"}}, body: `{"payment_method":"4242 4242 4242 4242"}`}, 400, "invalid_request", "/payment_method"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ts.do(t, tc.req).wantProblem(t, tc.status, tc.code)
			if tc.fieldNamed != "" {
				found := false
				errs, _ := p["errors"].([]any)
				for _, e := range errs {
					found = found || e.(map[string]any)["field"] == tc.fieldNamed
				}
				if !found {
					t.Errorf("errors %v do not name %s", p["errors"], tc.fieldNamed)
				}
			}
			if strings.Contains(fmt.Sprint(p), "4242424242424242") {
				t.Error("the problem echoes the card number")
			}
		})
	}
	if n := ts.count(t, "idempotency_keys") + ts.count(t, "orders"); n != 0 {
		t.Errorf("bad input wrote %d rows", n)
	}
}

func TestServesSpecAndDemoPage(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	spec := ts.do(t, request{method: "GET", path: "/openapi.yaml"})
	if spec.Status != http.StatusOK || !bytes.Equal(spec.Body, api.Spec) {
		t.Errorf("/openapi.yaml: %d, %d bytes; want the contract as written", spec.Status, len(spec.Body))
	}
	page := ts.do(t, request{method: "GET", path: "/"})
	if page.Status != http.StatusOK || !strings.Contains(string(page.Body), "<html") {
		t.Errorf("/: %d", page.Status)
	}
}

// Every problem code the server can answer is declared in the contract's
// Problem.code enum, so clients can switch on it.
func TestProblemCodesAreInTheContract(t *testing.T) {
	t.Parallel()
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, v := range spec.Components.Schemas["Problem"].Value.Properties["code"].Value.Enum {
		declared[v.(string)] = true
	}
	for _, code := range problem.Codes() {
		if !declared[string(code)] {
			t.Errorf("problem code %q is not in the contract's Problem.code enum: add it there, in api/openapi.yaml", code)
		}
	}
}

// The contract declares every operation's idempotency class, and exactly
// the keyed ones require the Idempotency-Key header: the middleware relies
// on both. Every other operation has a handler, but for a read tagged
// declared; a keyed one has none, since the adapter serves both from their
// declarations (and start-up refuses one nothing declares).
func TestEveryOperationDeclaresItsIdempotencyClass(t *testing.T) {
	t.Parallel()
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]bool{"safe": true, "natural": true, "keyed": true, "keyed-external": true, "keyed-job": true, "deduplicated": true}
	implemented := map[string]bool{} // the server's methods, one per operation
	handlers := reflect.TypeFor[apigen.StrictServerInterface]()
	for i := range handlers.NumMethod() {
		implemented[handlers.Method(i).Name] = true
	}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			name := strings.ToUpper(op.OperationID[:1]) + op.OperationID[1:]
			class, _ := op.Extensions["x-idempotency"].(string)
			switch {
			case server.IsKeyed(class) && implemented[name]:
				t.Errorf("%s %s: keyed operation %s has a handler of its own; the keyed adapter serves it from its declaration", method, path, op.OperationID)
			case !server.IsKeyed(class) && !implemented[name] && !slices.Contains(op.Tags, "declared"):
				t.Errorf("%s %s: operation %s has no handler", method, path, op.OperationID)
			}
			delete(implemented, name)
			if !classes[class] {
				t.Errorf("%s %s: x-idempotency %q is not a known class", method, path, class)
			}
			requiresKey := false
			for _, p := range op.Parameters {
				if p.Value != nil && p.Value.In == "header" && p.Value.Name == "Idempotency-Key" && p.Value.Required {
					requiresKey = true
				}
			}
			if keyed := server.IsKeyed(class); keyed != requiresKey {
				t.Errorf("%s %s: class %s but Idempotency-Key required = %v", method, path, class, requiresKey)
			}
			if (method == http.MethodGet) != (class == "safe") {
				t.Errorf("%s %s: class %s; GET operations and only they are safe", method, path, class)
			}
		}
	}
	for name := range implemented {
		t.Errorf("handler %s has no operation in the contract", name)
	}
}
