package processor

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Id prefixes. They differ from the payments server's own (ch_, re_) so a
// processor id can never be mistaken for one of ours in logs.
const (
	prefixCharge = "pch"
	prefixRefund = "pre"
	prefixEvent  = "evt"
)

// newID is an opaque id with a type prefix, as a real processor's are: 128
// random bits in base32 (the processor is a service of its own, and shares
// no code with the payments server).
func newID(prefix string) string {
	return prefix + "_" + strings.ToLower(rand.Text())
}

var currencyPattern = regexp.MustCompile(`^[a-z]{3}$`)

// declines maps the declining test payment methods to their decline codes;
// succeeding maps the others to whether they are known at all.
var (
	declines = map[string]string{
		PaymentMethodChargeDeclined:    DeclineGeneric,
		PaymentMethodInsufficientFunds: DeclineInsufficientFunds,
	}
	succeeding = map[string]bool{
		PaymentMethodVisa:         true,
		PaymentMethodMastercard:   true,
		PaymentMethodFlaky:        true,
		PaymentMethodRateLimited:  true,
		PaymentMethodInFlight:     true,
		PaymentMethodTimeout:      true,
		PaymentMethodLostResponse: true,
	}
)

// inFlight is the answer of the in-flight fault methods' first attempt: a
// 409 that means "an earlier request with this key is still running", with
// no effect.
func inFlight(method string) outcome {
	return faultOutcome(http.StatusConflict, ErrorTypeIdempotency, CodeIdempotencyKeyInUse,
		method+": a request with this Idempotency-Key is still in progress; retry after the Retry-After delay", http.Header{"Retry-After": {"1"}})
}

func (s *Server) handleCreateCharge(w http.ResponseWriter, r *http.Request) {
	// Order of work: key, body, validation, and only then the key's turn.
	// Nothing before the turn is stored, so a corrected retry works.
	key, ok := idempotencyKey(w, r)
	if !ok {
		return
	}
	var req CreateChargeRequest
	if !decode(w, r, &req) {
		return
	}
	if !validMoney(w, req.Amount, req.Currency) {
		return
	}
	if !succeeding[req.PaymentMethod] && declines[req.PaymentMethod] == "" {
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodePaymentMethodUnknown, "no such payment method; use a test payment method such as pm_card_visa", nil)
		return
	}
	s.serveKeyed(w, r, "charges", key, fingerprint(req), func(attempt int) outcome {
		return s.executeCharge(key, req, attempt)
	})
}

// executeCharge runs while holding the key's turn: it either injects a
// fault that does nothing, or performs the charge (the effect) and answers.
func (s *Server) executeCharge(key string, req CreateChargeRequest, attempt int) outcome {
	switch {
	case req.PaymentMethod == PaymentMethodFlaky && attempt <= s.cfg.FlakyFailures:
		return faultOutcome(http.StatusServiceUnavailable, ErrorTypeAPI, CodeProcessorUnavailable,
			fmt.Sprintf("pm_card_flaky: attempt %d of %d that fail; retry with the same Idempotency-Key", attempt, s.cfg.FlakyFailures), nil)
	case req.PaymentMethod == PaymentMethodInFlight && attempt == 1:
		return inFlight("pm_card_inFlight")
	case req.PaymentMethod == PaymentMethodRateLimited && attempt == 1:
		return faultOutcome(http.StatusTooManyRequests, ErrorTypeRateLimit, CodeRateLimited,
			"pm_card_rateLimited: too many requests; retry after the Retry-After delay", http.Header{"Retry-After": {"1"}})
	}

	ch := Charge{
		ID:             newID(prefixCharge),
		Object:         ObjectCharge,
		Amount:         req.Amount,
		Currency:       req.Currency,
		PaymentMethod:  req.PaymentMethod,
		Status:         StatusSucceeded,
		Metadata:       req.Metadata,
		IdempotencyKey: key,
		Created:        s.cfg.Now().Unix(),
	}
	if code := declines[req.PaymentMethod]; code != "" {
		ch.Status, ch.DeclineCode = StatusFailed, &code
	}

	// The effect: the charge exists from here on, whatever happens to the
	// answer. A decline is an effect too (a failed charge), as in Stripe.
	s.mu.Lock()
	s.charges[ch.ID] = &chargeState{amount: ch.Amount, currency: ch.Currency, status: ch.Status}
	s.ledger = append(s.ledger, LedgerEntry{
		ID: ch.ID, Object: ObjectCharge, IdempotencyKey: key, Amount: ch.Amount, Currency: ch.Currency,
		Status: ch.Status, PaymentMethod: ch.PaymentMethod, DeclineCode: deref(ch.DeclineCode), Created: ch.Created,
	})
	s.mu.Unlock()

	out := outcome{status: http.StatusCreated, body: mustJSON(ch), effect: true}
	eventType := EventChargeSucceeded
	if ch.Status == StatusFailed {
		eventType = EventChargeFailed
		out.status = http.StatusPaymentRequired
		out.body = mustJSON(ErrorResponse{Error: ErrorDetail{
			Type: ErrorTypeCard, Code: CodeCardDeclined, Message: "the card was declined",
			DeclineCode: *ch.DeclineCode, Charge: ch.ID,
		}})
	}
	s.emit(eventType, EventData{
		ID: ch.ID, DownstreamKey: key, Amount: ch.Amount, Currency: ch.Currency,
		Status: ch.Status, DeclineCode: ch.DeclineCode,
	})

	// The two faults that strike after the effect. They can only strike
	// once per key: from now on the key has a stored answer, and every
	// later attempt replays it instead of executing.
	switch req.PaymentMethod {
	case PaymentMethodTimeout:
		out.how = deliverHold
	case PaymentMethodLostResponse:
		out.how = deliverDrop
	}
	return out
}

// validMoney checks an amount and a currency, answering 400 if either is
// wrong.
func validMoney(w http.ResponseWriter, amount int64, currency string) bool {
	switch {
	case amount <= 0:
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, "amount must be a positive integer in the currency's minor unit", nil)
		return false
	case !currencyPattern.MatchString(currency):
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, "currency must be a lower-case ISO 4217 code such as usd", nil)
		return false
	}
	return true
}

func (s *Server) handleCreateRefund(w http.ResponseWriter, r *http.Request) {
	key, ok := idempotencyKey(w, r)
	if !ok {
		return
	}
	var req CreateRefundRequest
	if !decode(w, r, &req) {
		return
	}
	switch {
	case req.Charge == "":
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, "charge is required", nil)
		return
	case req.Amount <= 0:
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, "amount must be a positive integer in the currency's minor unit", nil)
		return
	}
	s.serveKeyed(w, r, "refunds", key, fingerprint(req), func(int) outcome {
		return s.executeRefund(key, req)
	})
}

// executeRefund checks and records the refund under one lock: two refunds
// of one charge on different keys run concurrently, and a check made
// before taking the lock could be stale by the time the refund is written.
func (s *Server) executeRefund(key string, req CreateRefundRequest) outcome {
	s.mu.Lock()
	c := s.charges[req.Charge]
	switch {
	case c == nil:
		s.mu.Unlock()
		return faultOutcome(http.StatusNotFound, ErrorTypeInvalidRequest, CodeResourceMissing, "no such charge", nil)
	case c.status != StatusSucceeded:
		s.mu.Unlock()
		return faultOutcome(http.StatusBadRequest, ErrorTypeInvalidRequest, CodeChargeNotRefundable, "the charge failed; there is nothing to refund", nil)
	case req.Amount > c.amount-c.refunded:
		remaining := c.amount - c.refunded
		s.mu.Unlock()
		return faultOutcome(http.StatusBadRequest, ErrorTypeInvalidRequest, CodeAmountTooLarge,
			fmt.Sprintf("the refund exceeds what remains of the charge (%d)", remaining), nil)
	}
	c.refunded += req.Amount
	re := Refund{
		ID:             newID(prefixRefund),
		Object:         ObjectRefund,
		Charge:         req.Charge,
		Amount:         req.Amount,
		Currency:       c.currency,
		Status:         StatusSucceeded,
		IdempotencyKey: key,
		Created:        s.cfg.Now().Unix(),
	}
	s.ledger = append(s.ledger, LedgerEntry{
		ID: re.ID, Object: ObjectRefund, IdempotencyKey: key, Amount: re.Amount, Currency: re.Currency,
		Status: re.Status, Charge: re.Charge, Created: re.Created,
	})
	s.mu.Unlock()

	s.emit(EventRefundSucceeded, EventData{
		ID: re.ID, DownstreamKey: key, Amount: re.Amount, Currency: re.Currency,
		Status: re.Status, Charge: re.Charge,
	})
	return outcome{status: http.StatusCreated, body: mustJSON(re), effect: true}
}

func (s *Server) handleLedger(w http.ResponseWriter, r *http.Request) {
	filter, byKey := r.URL.Query()["idempotency_key"]
	list := LedgerList{Data: []LedgerEntry{}}
	s.mu.Lock()
	for _, e := range s.ledger {
		if !byKey || e.IdempotencyKey == filter[0] {
			list.Data = append(list.Data, e)
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, mustJSON(list), nil)
}

func (s *Server) handleGetChaos(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, mustJSON(s.Chaos()), nil)
}

// handlePutChaos replaces all the settings: a field left out is zero, so
// PUT {} switches chaos off.
func (s *Server) handlePutChaos(w http.ResponseWriter, r *http.Request) {
	var c Chaos
	if !decode(w, r, &c) {
		return
	}
	if err := s.SetChaos(c); err != nil {
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, err.Error(), nil)
		return
	}
	s.log.Info("chaos settings changed", "latency_ms", c.LatencyMS, "error_rate", c.ErrorRate,
		"timeout_rate", c.TimeoutRate, "duplicate_webhook_rate", c.DuplicateWebhookRate)
	writeJSON(w, http.StatusOK, mustJSON(c), nil)
}

// idempotencyKey reads the required Idempotency-Key: 1 to 255 printable
// ASCII characters, on one header line. The value is the key as sent (the
// processor, like Stripe, does not parse Structured Field quoting).
func idempotencyKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	vals := r.Header.Values("Idempotency-Key")
	if len(vals) == 0 || vals[0] == "" {
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeIdempotencyKeyMissing, "the Idempotency-Key header is required", nil)
		return "", false
	}
	key := vals[0]
	valid := len(vals) == 1 && len(key) <= 255
	for i := 0; valid && i < len(key); i++ {
		valid = key[i] >= 0x20 && key[i] <= 0x7e
	}
	if !valid {
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeIdempotencyKeyInvalid, "the Idempotency-Key must be one header of 1 to 255 printable ASCII characters", nil)
		return "", false
	}
	return key, true
}

// decode reads one JSON object into v, refusing unknown fields and trailing
// data. It answers the error itself and reports whether to go on.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data after the JSON object")
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, ErrorTypeInvalidRequest, CodeBodyTooLarge,
			"the request body exceeds "+strconv.Itoa(maxBodyBytes)+" bytes", nil)
		return false
	case err != nil:
		// The decoder's message names the field or offset, never a value.
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeBodyInvalid, "the body is not a valid JSON request: "+err.Error(), nil)
		return false
	}
	return true
}

// faultOutcome is an answer without an effect: nothing is stored for the
// key.
func faultOutcome(status int, typ, code, msg string, h http.Header) outcome {
	return outcome{status: status, body: errorJSON(typ, code, msg), header: h}
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string, h http.Header) {
	writeJSON(w, status, errorJSON(typ, code, msg), h)
}

func errorJSON(typ, code, msg string) []byte {
	return mustJSON(ErrorResponse{Error: ErrorDetail{Type: typ, Code: code, Message: msg}})
}

// writeJSON writes body as is: a replay must be byte for byte the answer
// that was stored, so bodies are encoded once, before storing.
func writeJSON(w http.ResponseWriter, status int, body []byte, h http.Header) {
	for k, vs := range h {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body) // a client that went away is not the processor's problem
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("processor: encode response: " + err.Error())
	}
	return b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
