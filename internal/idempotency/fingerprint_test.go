package idempotency

import (
	"bytes"
	"testing"
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

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	got, err := CanonicalJSON([]byte(` {"b": "<&>", "a": [3, 1.50, 2e3]} `))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":[3,1.50,2e3],"b":"<&>"}`; string(got) != want {
		t.Errorf("CanonicalJSON = %s, want %s", got, want)
	}
	if got, err := CanonicalJSON([]byte("  ")); err != nil || got != nil {
		t.Errorf("empty body: %q, %v", got, err)
	}
	for _, bad := range []string{`{"a":`, `{"a":1} {"b":2}`, `nope`} {
		if _, err := CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%q) accepted invalid JSON", bad)
		}
	}
}

func mustFingerprint(t *testing.T, method, path, body string) []byte {
	t.Helper()
	fp, err := Fingerprint(method, path, []byte(body))
	if err != nil {
		t.Fatalf("Fingerprint(%s %s %q): %v", method, path, body, err)
	}
	return fp
}
