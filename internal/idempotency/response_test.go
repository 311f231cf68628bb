package idempotency

import (
	"encoding/json"
	"net/http"
	"testing"

	"pgregory.net/rapid"
)

// The stored headers are written by encodeHeaders and read back with
// json.Unmarshal; records written before it existed hold json.Marshal's
// bytes. Both must be the same bytes for every header, the plain ones it
// writes itself and the others it hands to json.Marshal.
func TestEncodeHeadersIsJSONMarshal(t *testing.T) {
	t.Parallel()
	// Mostly what a stored response holds, sometimes what must be escaped.
	text := rapid.OneOf(
		rapid.SampledFrom([]string{"application/json", "/v1/orders/ord_01JZ", "gzip", ""}),
		rapid.StringMatching(`[ -~]{0,12}`),
		rapid.String(),
	)
	names := rapid.OneOf(rapid.SampledFrom(storedHeaders[:]), text)
	rapid.Check(t, func(t *rapid.T) {
		h := http.Header{}
		for range rapid.IntRange(0, len(storedHeaders)+1).Draw(t, "names") {
			name := names.Draw(t, "name")
			switch rapid.IntRange(0, 9).Draw(t, "kind") {
			case 0:
				h[name] = nil
			case 1:
				h[name] = []string{}
			default:
				h[name] = rapid.SliceOfN(text, 1, 3).Draw(t, "values")
			}
		}
		got, err := encodeHeaders(h)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("encodeHeaders(%q)\n got %s\nwant %s", h, got, want)
		}
	})
}

func TestEncodeHeadersOfAStoredResponse(t *testing.T) {
	t.Parallel()
	if got, err := encodeHeaders(nil); err != nil || string(got) != "null" {
		t.Fatalf("encodeHeaders(nil) = %s, %v; want null, as json.Marshal writes it", got, err)
	}
	r, err := JSONResponse(http.StatusCreated, http.Header{"Location": {"/v1/orders/ord_1"}, "Set-Cookie": {"a=b"}}, map[string]int{"amount": 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := encodeHeaders(r.Header)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"Content-Type":["application/json"],"Location":["/v1/orders/ord_1"]}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
