package app

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/retrysafe/payments/api"
	"github.com/retrysafe/payments/internal/server"
)

// Every operation of the contract that names an object, called by another
// caller with the first caller's ids, answers 404 and changes nothing; every
// list shows the other caller none of the first's objects. The test walks
// the spec, so an operation added later is covered (or fails the test until
// it says which object its parameter names).
func TestEveryOperationIsolatesCallers(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	// acme's objects: a paid order, its charge, a refund, a payout, the
	// events they wrote, and the keys they were made under.
	ch := ts.paidCharge(t, 3000)
	refundReq := request{method: "POST", path: "/v1/charges/" + ch.ID + "/refunds", apiKey: "sk_test_acme",
		header: http.Header{"Idempotency-Key": {"acme-refund"}}, body: `{"amount":500}`}
	var re refund
	ts.do(t, refundReq).decode(t, &re)
	var po payout
	ts.do(t, payoutRequest("sk_test_acme", "acme-payout", `{"amount":1000,"currency":"usd"}`)).decode(t, &po)
	// The payout's job must be done before the snapshot: it changes the
	// balance and writes an event on its own.
	ts.pollPayout(t, "sk_test_acme", "/v1/payouts/"+po.ID)
	ids := map[string]string{"order_id": ch.OrderID, "charge_id": ch.ID, "payout_id": po.ID, "key": "acme-payout"}
	secrets := []string{ch.OrderID, ch.ID, re.ID, po.ID}
	spec, err := api.Load()
	if err != nil {
		t.Fatal(err)
	}
	paths := spec.Paths.InMatchingOrder()
	sort.Strings(paths)
	// An object of a resource added later (a fork's) is made for acme by
	// its collection's create (the POST on the path before {name}), with
	// the spec's example body: a new resource needs nothing added here.
	objectPath := regexp.MustCompile(`^(/.*)/\{([a-z_]+)\}$`) // a collection, then {name}
	for _, path := range paths {
		m := objectPath.FindStringSubmatch(path)
		if m == nil || ids[m[2]] != "" || spec.Paths.Value(m[1]) == nil || spec.Paths.Value(m[1]).Post == nil {
			continue
		}
		create := spec.Paths.Value(m[1]).Post
		var made struct{ ID string }
		ts.do(t, request{method: "POST", path: m[1], apiKey: "sk_test_acme", body: exampleBody(t, create),
			header: http.Header{"Idempotency-Key": {"acme-" + create.OperationID}}}).decode(t, &made)
		ids[m[2]], secrets = made.ID, append(secrets, made.ID)
	}
	before := ts.snapshot(t)

	namedOps, lists := 0, 0
	for _, path := range paths {
		item := spec.Paths.Value(path)
		for method, op := range item.Operations() {
			if op.Security != nil && len(*op.Security) == 0 {
				continue // no caller: /healthz, /readyz, the processor's webhook
			}
			concrete := path
			named := false
			for _, p := range append(item.Parameters, op.Parameters...) {
				if p.Value.In != "path" {
					continue
				}
				id, ok := ids[p.Value.Name]
				if !ok {
					t.Fatalf("%s %s: which of acme's objects does {%s} name? Give its collection a POST with an example body, or add it to ids", method, path, p.Value.Name)
				}
				concrete = strings.ReplaceAll(concrete, "{"+p.Value.Name+"}", url.PathEscape(id))
				named = true
			}
			r := request{method: method, path: concrete, apiKey: "sk_test_globex"}
			if x, _ := op.Extensions["x-idempotency"].(string); server.IsKeyed(x) {
				r.header = http.Header{"Idempotency-Key": {"globex-" + op.OperationID}}
			}
			if op.RequestBody != nil {
				// A valid body, so that the request gets as far as the 404.
				r.body = exampleBody(t, op)
			}
			res := ts.do(t, r)
			switch {
			case named:
				namedOps++
				if res.Status != http.StatusNotFound {
					t.Errorf("%s %s as globex: %d %s; want 404", method, concrete, res.Status, res.Body)
				}
			case method == http.MethodGet:
				lists++
				for _, s := range secrets {
					if strings.Contains(string(res.Body), s) {
						t.Errorf("%s %s as globex shows acme's %s", method, path, s)
					}
				}
			}
		}
	}
	// Orders, charges, refunds, payouts and keys by id (get, cancel, charge,
	// refund, list refunds); orders, payouts, events and the balance listed.
	if namedOps < 8 || lists < 4 {
		t.Errorf("walked %d operations on named objects and %d lists; the contract has more", namedOps, lists)
	}
	// Nothing of acme's changed. (globex's own create calls made its own
	// order and were refused a payout: that is globex's business.)
	if after := ts.snapshot(t); after != before {
		t.Errorf("acme's rows changed under globex's calls:\nbefore %s\nafter  %s", before, after)
	}
}

// exampleBody is op's request body as the spec's example gives it (the
// first, by name, of several).
func exampleBody(t *testing.T, op *openapi3.Operation) string {
	t.Helper()
	mt := op.RequestBody.Value.Content.Get("application/json")
	ex := mt.Example
	if names := slices.Sorted(maps.Keys(mt.Examples)); ex == nil && len(names) > 0 {
		ex = mt.Examples[names[0]].Value.Value
	}
	b, err := json.Marshal(ex)
	if ex == nil || err != nil {
		t.Fatalf("%s: the spec gives its request body no example (%v)", op.OperationID, err)
	}
	return string(b)
}

// snapshot is acme's rows, summarised.
func (ts *testServer) snapshot(t *testing.T) string {
	t.Helper()
	var s string
	err := ts.db.QueryRow(context.Background(), `
		SELECT concat_ws(' | ',
			(SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM orders WHERE caller_id = 'acme'),
			(SELECT string_agg(id || ':' || status || ':' || amount_refunded, ',' ORDER BY id) FROM charges WHERE caller_id = 'acme'),
			(SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM refunds WHERE caller_id = 'acme'),
			(SELECT string_agg(id || ':' || amount, ',' ORDER BY id) FROM payouts WHERE caller_id = 'acme'),
			(SELECT count(*)::text FROM ledger_entries WHERE caller_id = 'acme'),
			(SELECT string_agg(key || ':' || status || ':' || attempt, ',' ORDER BY key) FROM idempotency_keys WHERE caller_id = 'acme'),
			(SELECT count(*)::text FROM events WHERE caller_id = 'acme'))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sfString writes key as a Structured Field string.
func sfString(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// Keys and text that look like SQL, HTML or paths are stored and returned
// as the data they are; ids that are not ids are refused before any query.
func TestInjectionLookingInputIsJustData(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for i, key := range []string{
		`'; DROP TABLE orders; --`,
		`<script>alert("k")</script>`,
		`../../../etc/passwd`,
		`%27%20OR%201=1`,
		`\" OR ""="`,
	} {
		description := fmt.Sprintf(`Robert'); DELETE FROM orders WHERE ('1'='1 <b>%d</b>`, i)
		body := fmt.Sprintf(`{"amount":100,"currency":"usd","description":%q}`, description)
		res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme",
			header: http.Header{"Idempotency-Key": {sfString(key)}}, body: body})
		if res.Status != http.StatusCreated {
			t.Fatalf("key %q: %d %s", key, res.Status, res.Body)
		}
		var o struct{ ID, Description string }
		res.decode(t, &o)
		if o.Description != description {
			t.Errorf("description came back as %q", o.Description)
		}
		rec := ts.get(t, "/v1/idempotency-keys/"+url.PathEscape(key))
		var r struct{ Key string }
		rec.decode(t, &r)
		if rec.Status != http.StatusOK || r.Key != key {
			t.Errorf("the record of key %q: %d %s", key, rec.Status, rec.Body)
		}
	}
	if n := ts.count(t, "orders"); n != 5 {
		t.Errorf("%d orders; want the 5 created", n)
	}
	for _, id := range []string{`ord_1' OR '1'='1`, `ord_1;DROP TABLE orders`, `..%2F..%2Fetc`} {
		res := ts.get(t, "/v1/orders/"+url.PathEscape(id))
		if res.Status != http.StatusBadRequest && res.Status != http.StatusNotFound {
			t.Errorf("order id %q: %d %s; want it refused", id, res.Status, res.Body)
		}
	}
}

// API keys are stored only as their SHA-256, and found by it: no column
// holds a key, and authentication compares no secret byte by byte (the
// database looks the hash up through its unique index).
func TestAPIKeysAreStoredHashed(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	var dump string
	if err := ts.db.QueryRow(context.Background(), `SELECT string_agg(c::text, ' ') FROM callers c`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dump, "sk_test") {
		t.Fatalf("a callers row holds an API key: %s", dump)
	}
	var hash []byte
	if err := ts.db.QueryRow(context.Background(), `SELECT api_key_hash FROM callers WHERE id = 'acme'`).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256([]byte("sk_test_acme")); string(hash) != string(want[:]) {
		t.Errorf("acme's stored hash %x; want SHA-256 of its key", hash)
	}
	// A key that differs in its last byte is a stranger.
	ts.do(t, request{method: "GET", path: "/v1/orders", apiKey: "sk_test_acmf"}).wantProblem(t, http.StatusUnauthorized, "unauthorized")
}
