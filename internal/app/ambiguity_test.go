package app

import (
	"net/http"
	"strings"
	"testing"
)

// Media types are case-insensitive, and parameters may be spaced: every
// spelling of application/json (UTF-8) is accepted; another charset is not.
func TestContentTypeIsComparedCaseInsensitively(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for i, ct := range []string{"Application/JSON", "application/json ; charset=utf-8", "APPLICATION/JSON;CHARSET=UTF-8", "application/json"} {
		r := ordersRequest("ct-"+string(rune('a'+i)), teaOrder)
		r.header.Set("Content-Type", ct)
		if res := ts.do(t, r); res.Status != http.StatusCreated {
			t.Errorf("Content-Type %q: %d %s; want 201", ct, res.Status, res.Body)
		}
	}
	r := ordersRequest("ct-latin1", teaOrder)
	r.header.Set("Content-Type", "application/json; charset=latin1")
	ts.do(t, r).wantProblem(t, http.StatusUnsupportedMediaType, "unsupported_media_type")
}

// The key's rules live in its parser alone: a valid key that is long once
// written as an sf-string with escapes is accepted, and every invalid key,
// however long its header, answers idempotency_key_invalid.
func TestKeyRulesAreTheParsers(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	key := strings.Repeat(`a\"`, 100) // 200 characters once unescaped; 302 as written
	if res := ts.createOrder(t, `"`+key+`"`, teaOrder); res.Status != http.StatusCreated {
		t.Fatalf("a valid 200-character key with escapes: %d %s; want 201", res.Status, res.Body)
	}
	var rec struct{ Key string }
	ts.get(t, "/v1/idempotency-keys/"+strings.Repeat(`a%22`, 100)).decode(t, &rec)
	if rec.Key != strings.Repeat(`a"`, 100) {
		t.Errorf("stored key %q; want the unescaped key", rec.Key)
	}
	for _, bad := range []string{`"` + strings.Repeat(`\"`, 256) + `"`, strings.Repeat("k", 600), `"` + strings.Repeat("b", 256) + `"`} {
		ts.createOrder(t, bad, teaOrder).wantProblem(t, http.StatusBadRequest, "idempotency_key_invalid")
	}
}

// Ambiguity is refused before anything else: a second Authorization or
// Content-Type line, or a JSON member named twice, is a 400 that claims no
// key, so the corrected request under the same key goes through.
func TestAmbiguousRequestsAreRefused(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)

	twoAuth := ordersRequest("ambiguous", teaOrder)
	twoAuth.header["Authorization"] = []string{"Bearer sk_test_acme", "Bearer sk_test_globex"}
	if p := ts.do(t, twoAuth).wantProblem(t, http.StatusBadRequest, "invalid_request"); !strings.Contains(p["detail"].(string), "Authorization") {
		t.Errorf("detail %q does not name the header", p["detail"])
	}
	twoTypes := ordersRequest("ambiguous", teaOrder)
	twoTypes.header["Content-Type"] = []string{"application/json", "text/plain"}
	ts.do(t, twoTypes).wantProblem(t, http.StatusBadRequest, "invalid_request")

	dup := ts.createOrder(t, "ambiguous", `{"amount": 99999999, "currency": "usd", "amount": 150}`)
	p := dup.wantProblem(t, http.StatusBadRequest, "invalid_request")
	if errs, _ := p["errors"].([]any); len(errs) != 1 || errs[0].(map[string]any)["field"] != "/amount" {
		t.Errorf("errors %v; want the duplicated member /amount", p["errors"])
	}
	// Nested, and on an operation with an external effect.
	o := ts.newOrder(t, "sk_test_acme", 500)
	r := chargeRequest(o.ID, "dup-charge", "pm_card_visa")
	r.body = `{"payment_method":"pm_card_visa","payment_method":"pm_card_chargeDeclined"}`
	ts.do(t, r).wantProblem(t, http.StatusBadRequest, "invalid_request")

	if n := ts.count(t, "idempotency_keys"); n != 1 {
		t.Errorf("%d key records; want only the order's (nothing claimed by a refused request)", n)
	}
	if res := ts.createOrder(t, "ambiguous", teaOrder); res.Status != http.StatusCreated {
		t.Errorf("the corrected request under the same key: %d %s; want 201", res.Status, res.Body)
	}
}

// A method a path does not define is a 405 problem that says, in Allow,
// which methods the path has.
func TestMethodNotAllowedNamesTheAllowedMethods(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	res := ts.do(t, request{method: "DELETE", path: "/v1/orders", apiKey: "sk_test_acme"})
	res.wantProblem(t, http.StatusMethodNotAllowed, "method_not_allowed")
	if allow := res.Header.Get("Allow"); allow != "GET, POST" {
		t.Errorf("Allow %q; want \"GET, POST\"", allow)
	}
}
