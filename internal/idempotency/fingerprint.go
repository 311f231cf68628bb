package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
)

// Fingerprint identifies what a keyed request asked for: SHA-256 over its
// method, its path and its canonical body (which is never stored). A retry
// with another fingerprint reused a key for another operation: a 422,
// rather than a silent replay of something the client did not ask for.
// doc is the body as DecodeJSON decodes it, from a body ijson.Check
// accepted (the server parses a body once, for its validation and its
// fingerprint); nil is the empty body.
func Fingerprint(method, path string, doc *any) ([]byte, error) {
	canonical, err := canonicalOf(doc)
	if err != nil {
		return nil, err
	}
	// NUL separators keep ("POST", "/a") and ("POS", "T/a") apart.
	sum := sha256.Sum256(append([]byte(method+"\x00"+path+"\x00"), canonical...))
	return sum[:], nil
}

// ErrTrailingData is DecodeJSON's error for data after the JSON document.
var ErrTrailingData = errors.New("unexpected data after the JSON document")

// DecodeJSON decodes body as one JSON document, numbers kept as their
// literal text (json.Number). An empty (or all-space) body is nil, nil.
// Data after the document returns it and ErrTrailingData: the request
// validator reads only the first document (as kin-openapi's decoder does),
// the fingerprint refuses the body. It does not run ijson.Check: callers
// must.
func DecodeJSON(body []byte) (*any, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &v, ErrTrailingData
	}
	return &v, nil
}

// canonicalOf is a decoded document re-encoded with object keys sorted and
// insignificant whitespace removed, so that the same request with its keys
// in another order has the same fingerprint: encoding/json's encoding,
// without HTML escaping (map keys come out sorted, the whole trick). Numbers
// keep their literal text (1e2 and 100 differ: two requests are the same
// only if they plainly are). nil, the empty body, is empty.
func canonicalOf(doc *any) ([]byte, error) {
	if doc == nil {
		return nil, nil
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(*doc); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}
