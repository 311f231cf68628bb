package idempotency

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/retrysafe/payments/internal/ijson"
)

func TestFingerprintIgnoresKeyOrderAndWhitespace(t *testing.T) {
	t.Parallel()
	base := mustFingerprint(t, "POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea"}`)
	same := []string{
		`{"currency":"usd","amount":1999,"description":"Tea"}`,
		"{\n  \"description\" : \"Tea\",\n\t\"amount\": 1999,\r\n \"currency\":\"usd\" }\n",
		`  {"amount":1999,   "description":"Tea","currency":"usd"}  `,
	}
	for _, body := range same {
		if got := mustFingerprint(t, "POST", "/v1/orders", body); !bytes.Equal(got, base) {
			t.Errorf("body %q: fingerprint differs from the same request with other key order or spacing", body)
		}
	}
	nested := mustFingerprint(t, "POST", "/x", `{"a":{"y":[1,{"q":2,"p":1}],"x":true}}`)
	if got := mustFingerprint(t, "POST", "/x", `{"a":{"x":true,"y":[1,{"p":1,"q":2}]}}`); !bytes.Equal(got, nested) {
		t.Error("nested objects: key order changed the fingerprint")
	}
}

func TestFingerprintChangesWithAnyValue(t *testing.T) {
	t.Parallel()
	base := mustFingerprint(t, "POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea"}`)
	different := []struct{ method, path, body string }{
		{"POST", "/v1/orders", `{"amount":1998,"currency":"usd","description":"Tea"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"eur","description":"Tea"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"tea"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea "}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":null}`},
		{"POST", "/v1/orders", `{"amount":"1999","currency":"usd","description":"Tea"}`},
		{"POST", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea","x":1}`},
		{"POST", "/v1/orders/ord_1/charges", `{"amount":1999,"currency":"usd","description":"Tea"}`},
		{"PUT", "/v1/orders", `{"amount":1999,"currency":"usd","description":"Tea"}`},
	}
	for _, d := range different {
		if got := mustFingerprint(t, d.method, d.path, d.body); bytes.Equal(got, base) {
			t.Errorf("%s %s %s: same fingerprint as a different request", d.method, d.path, d.body)
		}
	}
	// The separators keep method and path apart.
	if bytes.Equal(mustFingerprint(t, "POST", "/a", ""), mustFingerprint(t, "POS", "T/a", "")) {
		t.Error("method/path boundary is ambiguous")
	}
}

func TestCanonicalForm(t *testing.T) {
	t.Parallel()
	got, err := canonicalBody([]byte(` {"b": "<&>", "a": [3, 1.50, 2e3]} `))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":[3,1.50,2e3],"b":"<&>"}`; string(got) != want {
		t.Errorf("canonical form %s, want %s", got, want)
	}
	if got, err := canonicalBody([]byte("  ")); err != nil || got != nil {
		t.Errorf("empty body: %q, %v", got, err)
	}
	for _, bad := range []string{`{"a":`, `{"a":1} {"b":2}`, `nope`} {
		if _, err := canonicalBody([]byte(bad)); err == nil {
			t.Errorf("%q accepted as JSON", bad)
		}
	}
}

func mustFingerprint(t *testing.T, method, path, body string) []byte {
	t.Helper()
	fp, err := fingerprintBody(method, path, []byte(body))
	if err != nil {
		t.Fatalf("fingerprint of %s %s %q: %v", method, path, body, err)
	}
	return fp
}

// FuzzFingerprint checks the canonicaliser's two promises on arbitrary
// JSON: the same document written another way (its object members in
// another order, other whitespace) has the same fingerprint, and a document
// with any value changed has another. Run it with
// go test -fuzz=FuzzFingerprint ./internal/idempotency/.
func FuzzFingerprint(f *testing.F) {
	for _, seed := range []string{
		`{"amount":1999,"currency":"usd","description":"Two espressos"}`,
		`{"payment_method":"pm_card_visa"}`,
		`{"a":{"b":[1,2,{"c":null}],"d":true},"e":"\u00e9"}`,
		`{"amount":1e3}`, `{}`, `[]`, `"x"`, `0`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Numbers are kept as their literal text (1e3 and 1000 are
		// different requests to the fingerprint, on purpose), so the
		// re-encodings below keep them as json.Number.
		var v any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if dec.Decode(&v) != nil || dec.More() {
			return // not one JSON document: the validator refuses it first
		}
		want, err := fingerprintBody("POST", "/v1/x", body)
		if err != nil {
			return // refused (a member named twice): nothing to compare
		}
		// The same document, re-encoded: members in Go's map order, no
		// insignificant whitespace, a different indentation.
		for _, other := range [][]byte{mustMarshal(t, v), mustIndent(t, v)} {
			got, err := fingerprintBody("POST", "/v1/x", other)
			if err != nil {
				t.Fatalf("re-encoded %s: %v", other, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s and its re-encoding %s have different fingerprints", body, other)
			}
		}
		// Any value changed: a different fingerprint.
		if changed, ok := changeOneValue(v); ok {
			got, err := fingerprintBody("POST", "/v1/x", mustMarshal(t, changed))
			if err == nil && bytes.Equal(got, want) {
				t.Fatalf("%s and the changed %s have the same fingerprint", body, mustMarshal(t, changed))
			}
		}
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustIndent(t *testing.T, v any) []byte {
	b, err := json.MarshalIndent(v, " ", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// changeOneValue returns a copy of v with its first scalar changed (or a
// member added to an empty object), and whether it could.
func changeOneValue(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			return map[string]any{"added": true}, true
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		out := maps.Clone(x)
		if c, ok := changeOneValue(x[keys[0]]); ok {
			out[keys[0]] = c
			return out, true
		}
		return nil, false
	case []any:
		if len(x) == 0 {
			return []any{"added"}, true
		}
		out := slices.Clone(x)
		if c, ok := changeOneValue(x[0]); ok {
			out[0] = c
			return out, true
		}
		return nil, false
	case string:
		return x + "!", true
	case json.Number:
		if n, ok := strings.CutPrefix(string(x), "-"); ok {
			return json.Number(n), true
		}
		return json.Number("-" + string(x)), true
	case bool:
		return !x, true
	case nil:
		return false, true
	}
	return nil, false
}

// decodeBody decodes a raw body as the server does: checked by
// ijson.Check, then decoded once (DecodeJSON).
func decodeBody(body []byte) (*any, error) {
	if err := ijson.Check(body); err != nil {
		return nil, err
	}
	return DecodeJSON(body)
}

// canonicalBody is a raw body's canonical form.
func canonicalBody(body []byte) ([]byte, error) {
	doc, err := decodeBody(body)
	if err != nil {
		return nil, err
	}
	return canonicalOf(doc)
}

// fingerprintBody is a raw body's fingerprint, as the server takes it.
func fingerprintBody(method, path string, body []byte) ([]byte, error) {
	doc, err := decodeBody(body)
	if err != nil {
		return nil, err
	}
	return Fingerprint(method, path, doc)
}
