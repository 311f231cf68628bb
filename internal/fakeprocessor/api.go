package fakeprocessor

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// newID is an opaque id with a type prefix, as a real processor's are: 128
// random bits in base32. The prefixes (pch, pre, ppo, evt) differ from the
// payments server's (ch, re, po), so logs never confuse the two.
func newID(prefix string) string {
	return prefix + "_" + strings.ToLower(rand.Text())
}

var currencyPattern = regexp.MustCompile(`^[a-z]{3}$`)

// paymentMethods maps each test payment method to its decline code ("" if none).
var paymentMethods = map[string]string{
	PaymentMethodVisa: "", PaymentMethodMastercard: "", PaymentMethodFlaky: "", PaymentMethodRateLimited: "",
	PaymentMethodInFlight: "", PaymentMethodTimeout: "", PaymentMethodLostResponse: "",
	PaymentMethodChargeDeclined:    DeclineGeneric,
	PaymentMethodInsufficientFunds: DeclineInsufficientFunds,
}

func validCharge(w http.ResponseWriter, req CreateChargeRequest) bool {
	_, known := paymentMethods[req.PaymentMethod]
	return validCreate(w, req.Amount, req.Currency, known, CodePaymentMethodUnknown, "no such payment method; use a test payment method such as pm_card_visa")
}

// earlyFault is the answer of a fault test method's attempt that fails
// without an effect, if this attempt is one (ok false otherwise).
func (s *Server) earlyFault(method string, attempt int) (out outcome, ok bool) {
	retryAfter := http.Header{"Retry-After": {"1"}}
	switch {
	case (method == PaymentMethodFlaky || method == DestinationFlaky) && attempt <= s.cfg.FlakyFailures:
		return faultOutcome(http.StatusServiceUnavailable, ErrorTypeAPI, CodeProcessorUnavailable,
			fmt.Sprintf("%s: attempt %d of %d that fail; retry with the same Idempotency-Key", method, attempt, s.cfg.FlakyFailures), nil), true
	case (method == PaymentMethodInFlight || method == DestinationInFlight) && attempt == 1:
		return faultOutcome(http.StatusConflict, ErrorTypeIdempotency, CodeIdempotencyKeyInUse,
			method+": a request with this Idempotency-Key is still in progress; retry after the Retry-After delay", retryAfter), true
	case method == PaymentMethodRateLimited && attempt == 1:
		return faultOutcome(http.StatusTooManyRequests, ErrorTypeRateLimit, CodeRateLimited,
			"pm_card_rateLimited: too many requests; retry after the Retry-After delay", retryAfter), true
	}
	return outcome{}, false
}

// executeCharge runs while holding the key's turn: it either injects a
// fault that does nothing, or performs the charge (the effect) and answers.
func (s *Server) executeCharge(key string, req CreateChargeRequest, attempt int) outcome {
	if out, ok := s.earlyFault(req.PaymentMethod, attempt); ok {
		return out
	}
	e := LedgerEntry{
		ID: newID("pch"), Object: ObjectCharge, IdempotencyKey: key, Amount: req.Amount, Currency: req.Currency,
		Status: StatusSucceeded, PaymentMethod: req.PaymentMethod, DeclineCode: paymentMethods[req.PaymentMethod], Created: s.cfg.Now().Unix(),
	}
	if e.DeclineCode != "" {
		e.Status = StatusFailed
	}

	// The effect: the charge exists from here on, whatever happens to the
	// answer. A decline is an effect too (a failed charge), as in Stripe.
	s.mu.Lock()
	s.charges[e.ID] = &chargeState{LedgerEntry: e}
	s.ledger = append(s.ledger, e)
	s.mu.Unlock()

	out := outcome{status: http.StatusCreated, effect: true, body: mustJSON(Charge{
		ID: e.ID, Object: e.Object, Amount: e.Amount, Currency: e.Currency, PaymentMethod: e.PaymentMethod, Status: e.Status,
		DeclineCode: optional(e.DeclineCode), Metadata: req.Metadata, IdempotencyKey: key, Created: e.Created,
	})}
	if e.Status == StatusFailed {
		out.status = http.StatusPaymentRequired
		out.body = mustJSON(ErrorResponse{Error: ErrorDetail{
			Type: ErrorTypeCard, Code: CodeCardDeclined, Message: "the card was declined",
			DeclineCode: e.DeclineCode, Charge: e.ID,
		}})
	}
	s.emit(e)

	// The faults that strike after the effect, once per key: from now on
	// the key has a stored answer, which later attempts replay.
	switch req.PaymentMethod {
	case PaymentMethodTimeout:
		out.how = deliverHold
	case PaymentMethodLostResponse:
		out.how = deliverDrop
	}
	return out
}

// validCreate checks the amount, the currency and whether the test token (a
// payment method or a destination) is known, answering 400 for the first
// that is wrong: parameter_invalid, or unknownCode with unknownMsg.
func validCreate(w http.ResponseWriter, amount int64, currency string, known bool, unknownCode, unknownMsg string) bool {
	switch {
	case amount <= 0:
		badRequest(w, "amount must be a positive integer in the currency's minor unit")
	case !currencyPattern.MatchString(currency):
		badRequest(w, "currency must be a lower-case ISO 4217 code such as usd")
	case !known:
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, unknownCode, unknownMsg, nil)
	default:
		return true
	}
	return false
}

func validRefund(w http.ResponseWriter, req CreateRefundRequest) bool {
	switch {
	case req.Charge == "":
		badRequest(w, "charge is required")
	case req.Amount <= 0:
		badRequest(w, "amount must be a positive integer in the currency's minor unit")
	default:
		return true
	}
	return false
}

// executeRefund checks and records the refund under one lock: two refunds
// of one charge on different keys run concurrently, and a check made
// before taking the lock could be stale by the time the refund is written.
func (s *Server) executeRefund(key string, req CreateRefundRequest, _ int) outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.charges[req.Charge]
	switch {
	case c == nil:
		return faultOutcome(http.StatusNotFound, ErrorTypeInvalidRequest, CodeResourceMissing, "no such charge", nil)
	case c.Status != StatusSucceeded:
		return faultOutcome(http.StatusBadRequest, ErrorTypeInvalidRequest, CodeChargeNotRefundable, "the charge failed; there is nothing to refund", nil)
	case req.Amount > c.Amount-c.refunded:
		return faultOutcome(http.StatusBadRequest, ErrorTypeInvalidRequest, CodeAmountTooLarge,
			fmt.Sprintf("the refund exceeds what remains of the charge (%d)", c.Amount-c.refunded), nil)
	}
	c.refunded += req.Amount
	e := LedgerEntry{
		ID: newID("pre"), Object: ObjectRefund, IdempotencyKey: key, Amount: req.Amount, Currency: c.Currency,
		Status: StatusSucceeded, Charge: req.Charge, Created: s.cfg.Now().Unix(),
	}
	s.ledger = append(s.ledger, e)
	s.emit(e)
	return outcome{status: http.StatusCreated, effect: true, body: mustJSON(Refund{
		ID: e.ID, Object: e.Object, Charge: e.Charge, Amount: e.Amount, Currency: e.Currency,
		Status: e.Status, IdempotencyKey: key, Created: e.Created,
	})}
}

func (s *Server) handleLedger(w http.ResponseWriter, r *http.Request) {
	filter, byKey := r.URL.Query()["idempotency_key"]
	list := LedgerList{Data: []LedgerEntry{}} // [] when empty, never null
	s.mu.Lock()
	for _, e := range s.ledger {
		if !byKey || e.IdempotencyKey == filter[0] {
			list.Data = append(list.Data, e)
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, mustJSON(list), nil)
}

// handlePutChaos replaces all the settings: a field left out is zero, so
// PUT {} switches chaos off.
func (s *Server) handlePutChaos(w http.ResponseWriter, r *http.Request) {
	var c Chaos
	if !decode(w, r, &c) {
		return
	}
	if err := s.SetChaos(c); err != nil {
		badRequest(w, err.Error())
		return
	}
	s.cfg.Logger.Info("chaos settings changed", "latency_ms", c.LatencyMS, "error_rate", c.ErrorRate,
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
	if len(vals) > 1 || len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
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
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		writeError(w, http.StatusRequestEntityTooLarge, ErrorTypeInvalidRequest, CodeBodyTooLarge,
			"the request body exceeds "+strconv.Itoa(maxBodyBytes)+" bytes", nil)
	case err != nil:
		// The decoder's message names the field or offset, never a value.
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeBodyInvalid, "the body is not a valid JSON request: "+err.Error(), nil)
	default:
		return true
	}
	return false
}

// faultOutcome is an answer without an effect: nothing is stored for the key.
func faultOutcome(status int, typ, code, msg string, h http.Header) outcome {
	return outcome{status: status, header: h, body: mustJSON(ErrorResponse{Error: ErrorDetail{Type: typ, Code: code, Message: msg}})}
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string, h http.Header) {
	out := faultOutcome(status, typ, code, msg, h)
	writeJSON(w, out.status, out.body, out.header)
}

// writeJSON writes body as is: a replay must be byte for byte the answer
// that was stored, so bodies are encoded once, before storing.
func writeJSON(w http.ResponseWriter, status int, body []byte, h http.Header) {
	maps.Copy(w.Header(), h)
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

// badRequest answers 400 parameter_invalid.
func badRequest(w http.ResponseWriter, msg string) {
	writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeParameterInvalid, msg, nil)
}

// optional is s as a JSON string that is null when empty.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
