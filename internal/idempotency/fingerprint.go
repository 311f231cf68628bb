package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"

	"github.com/retrysafe/payments/internal/ijson"
)

// Fingerprint identifies what a keyed request asked for: SHA-256 over its
// method, its path and its canonical body. A retry must carry the same
// fingerprint as the request that created the key; a different one means the
// client reused a key for another operation, which is answered with 422
// rather than a silent replay of something the client did not ask for.
//
// Only the fingerprint is stored, never the raw body.
func Fingerprint(method, path string, body []byte) ([]byte, error) {
	canonical, err := CanonicalJSON(body)
	if err != nil {
		return nil, err
	}
	return fingerprint(method, path, canonical), nil
}

// FingerprintOf is Fingerprint of a body already decoded by DecodeJSON (and
// already checked by ijson.Check, which it does not repeat), so that the
// server parses a request's body once for its validation and its
// fingerprint. A nil doc is the empty body.
func FingerprintOf(method, path string, doc *any) ([]byte, error) {
	canonical, err := canonicalOf(doc)
	if err != nil {
		return nil, err
	}
	return fingerprint(method, path, canonical), nil
}

// fingerprint is the SHA-256 over method, path and a canonical body.
func fingerprint(method, path string, canonical []byte) []byte {
	h := sha256.New()
	// NUL separators keep ("POST", "/a") and ("POS", "T/a") apart.
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canonical)
	return h.Sum(nil)
}

// ErrTrailingData is DecodeJSON's error for a body with more after its
// JSON document.
var ErrTrailingData = errors.New("unexpected data after the JSON document")

// DecodeJSON decodes body as one JSON document, numbers kept as their
// literal text (json.Number), as the fingerprint needs them. An empty (or
// all-space) body is nil, nil. A body whose first document is followed by
// more data returns that first document and ErrTrailingData: the request
// validator reads only the first document (as kin-openapi's decoder does),
// the fingerprint refuses the body. It does not run ijson.Check: callers
// that do not call it themselves must use Fingerprint.
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

// CanonicalJSON re-encodes a JSON document with object keys sorted and
// insignificant whitespace removed, so that the same logical request sent
// with its keys in another order has the same fingerprint. Numbers keep
// their literal text (1e2 and 100 stay different: we never claim two
// requests are the same unless they plainly are). An empty body is its own
// canonical form. A document with a member named twice in one object has
// no canonical form (which value would it keep?) and is refused.
func CanonicalJSON(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	if err := ijson.Check(body); err != nil {
		return nil, err
	}
	doc, err := DecodeJSON(body)
	if err != nil {
		return nil, err
	}
	return canonicalOf(doc)
}

// canonicalOf encodes a decoded document in canonical form: encoding/json's
// encoding of it, without HTML escaping (map keys come out sorted, which
// is the whole trick); nil is the empty body's, empty.
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
