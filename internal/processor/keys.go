package processor

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The processor's own idempotency, on the downstream Idempotency-Key its
// client sends. The rules, as in Stripe:
//
//   - A result is stored for a key exactly when the request performed an
//     effect (a ledger entry: a succeeded or declined charge, a refund).
//     Everything else (invalid input, an unknown charge, a refund that is
//     too large, an injected 503 or 429) stores nothing, so a corrected or
//     later retry with the same key can still do the work.
//   - The same key with the same request replays the stored answer: the
//     same status and the same bytes, plus Idempotent-Replayed: true.
//   - The same key with a different request is a 422, never a silent
//     replay of an answer to some other question.
//   - Keys are scoped per endpoint: a charge and a refund may use the same
//     key without colliding.
//   - Requests with the same key are serialized: a second request waits for
//     the first to finish and then gets its stored answer. It never gets a
//     409. The wait is short, because an answer is stored before it is
//     withheld or dropped (pm_card_timeout, pm_card_lostResponse), so a
//     retry does not wait for the hold of the attempt it is retrying.
//   - A stored answer is kept for Config.KeyRetention (24 hours, as Stripe
//     keeps its keys), counted from when it was stored; after that the key
//     is a new request. The payments server derives its downstream keys
//     from the caller's Idempotency-Key and request
//     (cardprocessor.DownstreamKey), so
//     that a retry after a failover that lost its rows sends the same key
//     again. It must find the first answer still here: a processor must
//     keep keys for as long as clients retry, which is the server's own
//     retention window. Keeping them longer would be harmless to the
//     server (it gives a new operation under an expired key a key of its
//     own, cardprocessor.NewDownstreamKey), but a processor that forgets sooner
//     than the server would charge twice a retry that arrived in between.

// keyStore holds one entry per (endpoint, key) ever seen. An entry whose
// answer has outlived the retention window is forgotten when its key comes
// again; nothing else removes entries: a fake that lives as long as a test
// run does not need to free their memory.
type keyStore struct {
	mu      sync.Mutex
	entries map[string]*keyEntry
}

// keyEntry is the state of one downstream key.
type keyEntry struct {
	// turn is a one-slot semaphore: whoever has put a token in it is the
	// only request working on this key. It is a channel rather than a
	// sync.Mutex so that a waiting request can give up when its client does.
	turn chan struct{}

	// Guarded by turn.
	attempts    int // requests that reached execution, for the fault methods
	fingerprint [sha256.Size]byte
	stored      *storedResponse
	storedAt    time.Time
}

type storedResponse struct {
	status int
	body   []byte
}

func (ks *keyStore) entry(endpoint, key string) *keyEntry {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	// The NUL cannot occur in a header value, so the scoped names of two
	// endpoints never collide.
	id := endpoint + "\x00" + key
	e := ks.entries[id]
	if e == nil {
		e = &keyEntry{turn: make(chan struct{}, 1)}
		ks.entries[id] = e
	}
	return e
}

// acquire waits for the key's turn, or for ctx to end.
func (e *keyEntry) acquire(ctx context.Context) error {
	select {
	case e.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *keyEntry) release() { <-e.turn }

// fingerprint identifies a request by its decoded value re-encoded:
// encoding/json writes struct fields in a fixed order and map keys sorted,
// so the same logical request with re-ordered keys or other whitespace has
// the same fingerprint.
func fingerprint(req any) [sha256.Size]byte {
	b, err := json.Marshal(req)
	if err != nil {
		// The request types are plain structs of strings and numbers.
		panic("processor: fingerprint: " + err.Error())
	}
	return sha256.Sum256(b)
}

// delivery says how an answer reaches the client.
type delivery int

const (
	deliverNow  delivery = iota
	deliverHold          // withhold until the client gives up (a timeout)
	deliverDrop          // close the connection without answering
)

// outcome is what one execution produced.
type outcome struct {
	status int
	body   []byte
	header http.Header // extra headers, such as Retry-After
	// effect means the ledger has a new entry: the answer is stored for
	// the key.
	effect bool
	how    delivery
}

// serveKeyed runs one request on a downstream key: chaos first, then the
// key's turn, then a stored answer or a new execution. execute runs while
// holding the turn and is given the attempt number on this key (1 for the
// first request that reached execution).
func (s *Server) serveKeyed(w http.ResponseWriter, r *http.Request, endpoint, key string, fp [sha256.Size]byte, execute func(attempt int) outcome) {
	ctx := r.Context()
	// An injected 5xx happens before the key is looked at, like a load
	// balancer failing in front of the processor: no effect, no attempt.
	if s.draw(func(c Chaos) float64 { return c.ErrorRate }) {
		var h http.Header
		if after := s.Chaos().ErrorRetryAfter; after > 0 {
			h = http.Header{"Retry-After": {strconv.Itoa(after)}}
		}
		writeError(w, http.StatusServiceUnavailable, ErrorTypeAPI, CodeProcessorUnavailable, "the processor is temporarily unavailable (chaos error_rate); retry with the same Idempotency-Key", h)
		return
	}

	e := s.keys.entry(endpoint, key)
	if err := e.acquire(ctx); err != nil {
		return // the client gave up while waiting for the key
	}
	out := s.answerOnce(e, fp, execute)

	switch out.how {
	case deliverHold:
		if !s.hold(ctx) {
			return
		}
	case deliverDrop:
		dropConnection(w)
		return
	}
	writeJSON(w, out.status, out.body, out.header)
}

// answerOnce runs while holding e's turn and releases it on return: a
// stored answer is replayed, otherwise execute runs and an answer with an
// effect is stored. The answer is stored before the turn is released, and
// the turn is released before the answer is withheld or dropped, so the
// client's retry replays it at once.
func (s *Server) answerOnce(e *keyEntry, fp [sha256.Size]byte, execute func(attempt int) outcome) outcome {
	defer e.release()
	if e.stored != nil && s.cfg.Now().Sub(e.storedAt) >= s.cfg.KeyRetention {
		// Forgotten: from here on the key is a new request.
		e.attempts, e.stored = 0, nil
	}
	if e.stored != nil {
		if e.fingerprint != fp {
			return faultOutcome(http.StatusUnprocessableEntity, ErrorTypeIdempotency, CodeIdempotencyKeyReused,
				"this Idempotency-Key was already used with a different request", nil)
		}
		return outcome{status: e.stored.status, body: e.stored.body, header: http.Header{"Idempotent-Replayed": {"true"}}}
	}
	e.attempts++
	out := execute(e.attempts)
	if out.effect {
		e.stored = &storedResponse{status: out.status, body: out.body}
		e.fingerprint, e.storedAt = fp, s.cfg.Now()
		// A chaos timeout only ever hits a request that did something:
		// that is the uncertain outcome worth testing.
		if out.how == deliverNow && s.draw(func(c Chaos) float64 { return c.TimeoutRate }) {
			out.how = deliverHold
		}
	}
	return out
}

// hold withholds an answer until the client gives up (false), or until
// TimeoutHold passes or the server closes (true: answer late).
func (s *Server) hold(ctx context.Context) bool {
	t := time.NewTimer(s.cfg.TimeoutHold)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-s.closing:
	}
	return true
}

// dropConnection closes the client's connection without a response, as a
// crashed processor or a broken network path would. The client sees EOF or
// a reset, not an HTTP status.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close() // dropping it is the point; nothing to do if that fails
		return
	}
	// Not hijackable (HTTP/2): the standard way to abort a response.
	panic(http.ErrAbortHandler)
}
