package fakeprocessor

import (
	"net/http"
	"time"
)

// Payouts: transfers from the merchant's balance to a bank account. Unlike
// a charge, a payout is not done when accepted: POST /v1/payouts starts the
// transfer (the effect: a ledger entry, an answer stored for the key) and
// answers in_transit. Config.PayoutDelay later the payout becomes paid or
// failed, in its ledger entry too, and a payout.paid or payout.failed
// webhook is sent. GET /v1/payouts/{id} shows where it is.

// Test bank accounts, the destinations of payouts.
const (
	// DestinationOK is paid PayoutDelay after the payout is accepted.
	DestinationOK = "ba_test_ok"
	// DestinationClosed is accepted, then fails with account_closed when
	// the transfer would arrive: the money comes back.
	DestinationClosed = "ba_test_closed"
	// DestinationFlaky answers 503 to the first Config.FlakyFailures
	// attempts on a key, without an effect, then acts as DestinationOK.
	DestinationFlaky = "ba_test_flaky"
	// DestinationSlow takes ten times PayoutDelay to arrive.
	DestinationSlow = "ba_test_slow"
	// DestinationInFlight answers 409 to the first attempt on a key, as
	// PaymentMethodInFlight does, then acts as DestinationOK.
	DestinationInFlight = "ba_test_inFlight"
)

// Payout statuses and their object name.
const (
	PayoutInTransit = "in_transit"
	PayoutPaid      = "paid"
	PayoutFailed    = "failed"
	ObjectPayout    = "payout"

	FailureAccountClosed   = "account_closed"
	CodeDestinationUnknown = "destination_unknown"
)

var destinations = map[string]bool{DestinationOK: true, DestinationClosed: true, DestinationFlaky: true, DestinationSlow: true, DestinationInFlight: true}

// CreatePayoutRequest is the body of POST /v1/payouts.
type CreatePayoutRequest struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
}

// Payout is the answer of POST /v1/payouts (201, in_transit) and of
// GET /v1/payouts/{id} (as it is now).
type Payout struct {
	ID             string  `json:"id"`
	Object         string  `json:"object"`
	Amount         int64   `json:"amount"`
	Currency       string  `json:"currency"`
	Destination    string  `json:"destination"`
	Status         string  `json:"status"`
	FailureCode    *string `json:"failure_code"`
	ArrivalDate    int64   `json:"arrival_date"` // when it arrives (or did), Unix seconds
	IdempotencyKey string  `json:"idempotency_key"`
	Created        int64   `json:"created"`
}

// payoutState is a payout and where its ledger entry is.
type payoutState struct {
	Payout
	arrives time.Time
	ledger  int // index of its entry in Server.ledger
}

func validPayout(w http.ResponseWriter, req CreatePayoutRequest) bool {
	return validCreate(w, req.Amount, req.Currency, destinations[req.Destination], CodeDestinationUnknown, "no such destination; use a test bank account such as ba_test_ok")
}

// executePayout runs while holding the key's turn: a flaky or in-flight
// destination's early attempts fail without an effect; otherwise the
// transfer starts.
func (s *Server) executePayout(key string, req CreatePayoutRequest, attempt int) outcome {
	if out, ok := s.earlyFault(req.Destination, attempt); ok {
		return out
	}
	delay := s.cfg.PayoutDelay
	if req.Destination == DestinationSlow {
		delay *= 10
	}
	now := s.cfg.Now()
	p := &payoutState{arrives: now.Add(delay), Payout: Payout{
		ID: newID("ppo"), Object: ObjectPayout, Amount: req.Amount, Currency: req.Currency, Destination: req.Destination,
		Status: PayoutInTransit, ArrivalDate: now.Add(delay).Unix(), IdempotencyKey: key, Created: now.Unix(),
	}}

	// The effect: the transfer has started.
	s.mu.Lock()
	defer s.mu.Unlock()
	p.ledger = len(s.ledger)
	s.ledger = append(s.ledger, LedgerEntry{
		ID: p.ID, Object: ObjectPayout, IdempotencyKey: key, Amount: p.Amount, Currency: p.Currency,
		Status: p.Status, Destination: p.Destination, Created: p.Created,
	})
	s.payouts[p.ID] = p
	// It arrives on its own; a GET after the time settles it too, so the
	// answer never depends on the timer having fired yet.
	time.AfterFunc(delay, func() { s.settlePayout(p.ID) })
	return outcome{status: http.StatusCreated, body: mustJSON(p.Payout), effect: true}
}

// settlePayout moves a payout whose transfer has arrived to its final
// status, once, and sends its webhook.
func (s *Server) settlePayout(id string) (Payout, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.payouts[id]
	if !ok {
		return Payout{}, false
	}
	if p.Status == PayoutInTransit && !s.cfg.Now().Before(p.arrives) {
		p.Status = PayoutPaid
		if p.Destination == DestinationClosed {
			p.Status, p.FailureCode = PayoutFailed, optional(FailureAccountClosed)
			s.ledger[p.ledger].FailureCode = FailureAccountClosed
		}
		s.ledger[p.ledger].Status = p.Status
		s.emit(s.ledger[p.ledger])
	}
	return p.Payout, true
}

func (s *Server) handleGetPayout(w http.ResponseWriter, r *http.Request) {
	p, ok := s.settlePayout(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, ErrorTypeInvalidRequest, CodeResourceMissing, "no such payout", nil)
		return
	}
	writeJSON(w, http.StatusOK, mustJSON(p), nil)
}
