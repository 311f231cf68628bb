package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/retrysafe/payments/internal/problem"
)

// storedHeaders is the allow-list of response headers kept with a record
// and replayed. Anything else (Set-Cookie above all, or per-request headers
// such as Date or a request id) is either unsafe or wrong to repeat.
var storedHeaders = []string{"Content-Type", "Location", "Content-Encoding"}

// Response is an operation's final HTTP response, as stored and replayed.
// The first answer and every replay are written from the same stored bytes,
// which is what makes a replay byte-identical.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Replayed is set when the response comes from the record rather than
	// from this request's own execution.
	Replayed bool
}

// NewResponse returns a Response, keeping only the allow-listed headers.
func NewResponse(status int, header http.Header, body []byte) *Response {
	kept := http.Header{}
	for _, name := range storedHeaders {
		if v := header.Values(name); len(v) > 0 {
			kept[name] = append([]string(nil), v...)
		}
	}
	if body == nil {
		body = []byte{} // an empty body is still a stored response (a NULL is not)
	}
	return &Response{Status: status, Header: kept, Body: body}
}

// JSONResponse returns a Response with v encoded as its JSON body.
func JSONResponse(status int, header http.Header, v any) (*Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "application/json")
	return NewResponse(status, h, body), nil
}

// ProblemResponse returns a Response carrying the problem p.
func ProblemResponse(p *problem.Error) *Response {
	return NewResponse(p.Status(), p.Header(), p.JSON())
}

// Write writes r to w. A replay is marked with Idempotent-Replayed: true.
func (r *Response) Write(w http.ResponseWriter) error {
	for k, v := range r.Header {
		w.Header()[k] = v
	}
	if r.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(r.Status)
	_, err := w.Write(r.Body)
	return err
}

func storedResponse(rec Record) (*Response, error) {
	if rec.ResponseStatus == nil {
		return nil, fmt.Errorf("idempotency: completed record %d has no response", rec.ID)
	}
	var header http.Header
	if err := json.Unmarshal(rec.ResponseHeaders, &header); err != nil {
		return nil, fmt.Errorf("idempotency: record %d: stored headers: %w", rec.ID, err)
	}
	return &Response{Status: int(*rec.ResponseStatus), Header: header, Body: rec.ResponseBody, Replayed: true}, nil
}
