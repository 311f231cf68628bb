package fakeprocessor_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// fake is a processor served over real HTTP by an httptest server.
type fake struct {
	*fakeprocessor.Server
	URL string
}

func newFake(t *testing.T, cfg fakeprocessor.Config) *fake {
	t.Helper()
	p, err := fakeprocessor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	// Cleanups run last-in first-out: Close first releases withheld
	// answers, so srv.Close does not wait for them.
	t.Cleanup(srv.Close)
	t.Cleanup(p.Close)
	return &fake{Server: p, URL: srv.URL}
}

// response is an answer with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with an optional Idempotency-Key through client.
func (f *fake) do(t *testing.T, client *http.Client, method, path, key, body string) (response, error) {
	t.Helper()
	req, err := http.NewRequest(method, f.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// post is do with the default client, failing the test on a transport error.
func (f *fake) post(t *testing.T, path, key, body string) response {
	t.Helper()
	res, err := f.do(t, http.DefaultClient, http.MethodPost, path, key, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return res
}

// ledger returns the effects recorded for key ("" for all of them).
func (f *fake) ledger(t *testing.T, key string) []fakeprocessor.LedgerEntry {
	t.Helper()
	path := "/v1/ledger"
	if key != "" {
		path += "?idempotency_key=" + key
	}
	res, err := f.do(t, http.DefaultClient, http.MethodGet, path, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var list fakeprocessor.LedgerList
	decodeInto(t, res, http.StatusOK, &list)
	return list.Data
}

// decodeInto checks the status and decodes the body.
func decodeInto(t *testing.T, res response, status int, v any) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status %d, want %d: %s", res.status, status, res.body)
	}
	if err := json.Unmarshal(res.body, v); err != nil {
		t.Fatalf("decode %s: %v", res.body, err)
	}
}

// wantError checks an error answer's status and code.
func wantError(t *testing.T, res response, status int, code string) fakeprocessor.ErrorDetail {
	t.Helper()
	var e fakeprocessor.ErrorResponse
	decodeInto(t, res, status, &e)
	if e.Error.Code != code {
		t.Fatalf("error code %q, want %q: %s", e.Error.Code, code, res.body)
	}
	return e.Error
}

func wantReplay(t *testing.T, first, again response) {
	t.Helper()
	if again.status != first.status || !bytes.Equal(again.body, first.body) {
		t.Fatalf("replay differs:\nfirst %d %s\nagain %d %s", first.status, first.body, again.status, again.body)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay without Idempotent-Replayed: true")
	}
}

func chargeBody(amount int, pm string) string {
	b, _ := json.Marshal(fakeprocessor.CreateChargeRequest{Amount: int64(amount), Currency: "usd", PaymentMethod: pm})
	return string(b)
}
