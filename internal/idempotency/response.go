package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"

	"github.com/retrysafe/payments/internal/problem"
)

// storedHeaders is the allow-list of response headers stored and replayed:
// others (Set-Cookie, Date, a request id) are unsafe or wrong to repeat.
var storedHeaders = [...]string{"Content-Type", "Location", "Content-Encoding"}

// Response is an operation's final HTTP response, as stored and replayed:
// the first answer and every replay are written from the same bytes. It is
// only read once made (a cached answer's replays share its values).
type Response struct {
	Status   int
	Header   http.Header
	Body     []byte
	Replayed bool // from the record, not this request's own execution
}

// NewResponse returns a Response, keeping only the allow-listed headers.
func NewResponse(status int, header http.Header, body []byte) *Response {
	kept := make(http.Header, len(storedHeaders))
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
	r := NewResponse(status, header, body)
	r.Header["Content-Type"] = []string{"application/json"}
	return r, nil
}

// ProblemResponse returns a Response carrying the problem p.
func ProblemResponse(p *problem.Error) *Response {
	return NewResponse(p.Status(), p.Header(), p.JSON())
}

// Write writes r to w. A replay is marked with Idempotent-Replayed: true.
func (r *Response) Write(w http.ResponseWriter) error {
	maps.Copy(w.Header(), r.Header)
	if r.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(r.Status)
	_, err := w.Write(r.Body)
	return err
}

// replayStored is the completed record rec's stored answer, once it cannot
// be lost. A primary shutting down for a failover ends a backend waiting
// for its synchronous standby after its local commit, and for a moment
// other sessions see a record the new primary will never have: a replay
// of it would acknowledge a lost effect (the failover soak found an order
// acknowledged, then gone). So ConfirmReplicated first commits a write,
// whose commit waits for the standby; without one, it costs a round trip.
func (s *Store) replayStored(ctx context.Context, rec Record) (*Response, error) {
	if err := queries.ConfirmReplicated(ctx, s.pool); err != nil {
		return nil, fmt.Errorf("confirm the stored answer is replicated: %w", err)
	}
	return storedResponse(rec)
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

// encodeHeaders is headers as stored: a JSON object of each name's values.
func encodeHeaders(h http.Header) ([]byte, error) { return json.Marshal(h) }
