package fakeprocessor

import (
	"crypto/sha256"
	"net/http"
	"strconv"
	"time"
)

// The processor's own idempotency, on the downstream Idempotency-Key its
// client sends. The rules, as in Stripe:
//
//   - An answer is stored for a key exactly when the request performed an
//     effect (a ledger entry). Anything else (invalid input, an unknown
//     charge, an injected 503 or 429) stores nothing, so a corrected or
//     later retry with the same key can still do the work.
//   - The same key and request replay the stored answer byte for byte, plus
//     Idempotent-Replayed: true. The same key with a different request is a
//     422, never a replay of the answer to another question.
//   - Keys are scoped per endpoint: a charge and a refund may share one.
//   - Requests with the same key are serialized: a second one waits for the
//     first, then gets its stored answer, never a 409. The wait is short:
//     an answer is stored before it is withheld or dropped (pm_card_timeout,
//     pm_card_lostResponse), so a retry does not wait out that hold.
//   - A stored answer is kept for Config.KeyRetention (24h, as Stripe),
//     then the key is a new request. A retry after a failover that lost the
//     server's rows sends the same derived key (cardprocessor.DownstreamKey),
//     so forgetting sooner than the server's own retention would charge
//     twice. Keeping keys longer is harmless: a new operation under an
//     expired key gets a new one (cardprocessor.NewDownstreamKey).

// keyEntry is the state of one downstream key.
type keyEntry struct {
	// turn is a one-slot semaphore: whoever put a token in it is the only
	// request working on this key. A channel, not a sync.Mutex, so that a
	// waiting request can give up when its client does.
	turn chan struct{}

	// Guarded by turn.
	attempts    int // requests that reached execution, for the fault methods
	fingerprint [sha256.Size]byte
	stored      *outcome // status and body only
	storedAt    time.Time
}

// entry is the entry of key on endpoint, made on first sight. An expired
// answer is forgotten when its key comes again; nothing removes entries, as
// a fake that lives as long as a test run need not free their memory.
func (s *Server) entry(endpoint, key string) *keyEntry {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	// The NUL cannot occur in a header value, so the scoped names of two
	// endpoints never collide.
	id := endpoint + "\x00" + key
	e := s.keys[id]
	if e == nil {
		e = &keyEntry{turn: make(chan struct{}, 1)}
		s.keys[id] = e
	}
	return e
}

// fingerprint identifies a request by its decoded value re-encoded:
// encoding/json writes fields in a fixed order and map keys sorted, so key
// order and whitespace in the body do not change it.
func fingerprint(req any) [sha256.Size]byte {
	return sha256.Sum256(mustJSON(req)) // cannot panic: plain structs of strings and numbers
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
	effect bool        // the ledger has a new entry: store the answer for the key
	how    delivery
}

// keyed is the handler of a POST on endpoint: the key and the body (valid)
// are checked first, storing nothing, so a corrected retry works; then come
// chaos, the key's turn, and a stored answer or execute, run holding the
// turn with the attempt number on this key (1 for the first to get there).
func keyed[T any](s *Server, endpoint string, valid func(http.ResponseWriter, T) bool, execute func(key string, req T, attempt int) outcome) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := idempotencyKey(w, r)
		var req T
		if !ok || !decode(w, r, &req) || !valid(w, req) {
			return
		}
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

		e := s.entry(endpoint, key)
		select {
		case e.turn <- struct{}{}: // answerOnce releases it
		case <-r.Context().Done():
			return // the client gave up while waiting for the key
		}
		out := s.answerOnce(e, fingerprint(req), func(attempt int) outcome { return execute(key, req, attempt) })
		switch out.how {
		case deliverHold:
			// Until the client gives up, or, if it waits that long, until
			// TimeoutHold passes or the server closes: then answer late.
			if !sleep(r.Context(), s.cfg.TimeoutHold, s.closing) {
				return
			}
		case deliverDrop:
			dropConnection(w)
			return
		}
		writeJSON(w, out.status, out.body, out.header)
	}
}

// answerOnce replays e's stored answer, or runs execute and stores an
// answer with an effect. It releases e's turn on return: after storing,
// before the answer is withheld or dropped, so a retry replays it at once.
func (s *Server) answerOnce(e *keyEntry, fp [sha256.Size]byte, execute func(attempt int) outcome) outcome {
	defer func() { <-e.turn }()
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
		e.stored = &outcome{status: out.status, body: out.body}
		e.fingerprint, e.storedAt = fp, s.cfg.Now()
		// A chaos timeout only ever hits a request that did something:
		// that is the uncertain outcome worth testing.
		if out.how == deliverNow && s.draw(func(c Chaos) float64 { return c.TimeoutRate }) {
			out.how = deliverHold
		}
	}
	return out
}

// dropConnection closes the client's connection without a response, as a
// crashed processor or a broken network would: the client sees EOF or a reset.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // not hijackable (HTTP/2): the standard way to abort a response
	}
	_ = conn.Close() // dropping it is the point; nothing to do if that fails
}
