package idempotency

import (
	"net/http"
	"testing"
)

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
