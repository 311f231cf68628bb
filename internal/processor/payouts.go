package processor

import (
	"fmt"
	"net/http"
	"time"
)

// Payouts: transfers from the merchant's balance to a bank account. Unlike
// a charge, a payout is not done when it is accepted: POST /v1/payouts
// performs the effect (the transfer starts, a ledger entry is written, the
// answer is stored for the key) and answers in_transit; the transfer
// arrives, or fails, Config.PayoutDelay later, when the payout becomes paid
// or failed, its ledger entry says so, and a payout.paid or payout.failed
// webhook is sent. GET /v1/payouts/{id} shows where it is.

// prefixPayout is the processor's payout id prefix (ours is po_).
const prefixPayout = "ppo"

// Test bank accounts, the destinations of payouts.
const (
	// DestinationOK is paid PayoutDelay after the payout is accepted.
	DestinationOK = "ba_test_ok"
	// DestinationClosed is accepted, then fails with account_closed when
	// the transfer would arrive: the money comes back.
	DestinationClosed = "ba_test_closed"
	// DestinationFlaky answers 503 to the first Config.FlakyFailures
	// attempts on a downstream key, without an effect, then behaves like
	// DestinationOK.
	DestinationFlaky = "ba_test_flaky"
	// DestinationSlow takes ten times PayoutDelay to arrive.
	DestinationSlow = "ba_test_slow"
	// DestinationInFlight answers 409 to the first attempt on a downstream
	// key, as if an earlier request with the key were still running (see
	// PaymentMethodInFlight), then behaves like DestinationOK.
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

	EventPayoutPaid   = "payout.paid"
	EventPayoutFailed = "payout.failed"
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
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Destination string  `json:"destination"`
	Status      string  `json:"status"`
	FailureCode *string `json:"failure_code"`
	// ArrivalDate is when the transfer is expected to arrive (or did), in
	// Unix seconds.
	ArrivalDate    int64  `json:"arrival_date"`
	IdempotencyKey string `json:"idempotency_key"`
	Created        int64  `json:"created"`
}

// payoutState is a payout and where its ledger entry is.
type payoutState struct {
	Payout
	arrives time.Time
	ledger  int // index of its entry in Server.ledger
}

func (s *Server) handleCreatePayout(w http.ResponseWriter, r *http.Request) {
	key, ok := idempotencyKey(w, r)
	if !ok {
		return
	}
	var req CreatePayoutRequest
	if !decode(w, r, &req) {
		return
	}
	if !validMoney(w, req.Amount, req.Currency) {
		return
	}
	if !destinations[req.Destination] {
		writeError(w, http.StatusBadRequest, ErrorTypeInvalidRequest, CodeDestinationUnknown, "no such destination; use a test bank account such as ba_test_ok", nil)
		return
	}
	s.serveKeyed(w, r, "payouts", key, fingerprint(req), func(attempt int) outcome {
		return s.executePayout(key, req, attempt)
	})
}

// executePayout runs while holding the key's turn: a flaky destination's
// early attempts fail without an effect; otherwise the transfer starts.
func (s *Server) executePayout(key string, req CreatePayoutRequest, attempt int) outcome {
	switch {
	case req.Destination == DestinationFlaky && attempt <= s.cfg.FlakyFailures:
		return faultOutcome(http.StatusServiceUnavailable, ErrorTypeAPI, CodeProcessorUnavailable,
			fmt.Sprintf("ba_test_flaky: attempt %d of %d that fail; retry with the same Idempotency-Key", attempt, s.cfg.FlakyFailures), nil)
	case req.Destination == DestinationInFlight && attempt == 1:
		return inFlight("ba_test_inFlight")
	}
	delay := s.cfg.PayoutDelay
	if req.Destination == DestinationSlow {
		delay *= 10
	}
	now := s.cfg.Now()
	p := &payoutState{
		Payout: Payout{
			ID: newID(prefixPayout), Object: ObjectPayout,
			Amount: req.Amount, Currency: req.Currency, Destination: req.Destination,
			Status: PayoutInTransit, ArrivalDate: now.Add(delay).Unix(),
			IdempotencyKey: key, Created: now.Unix(),
		},
		arrives: now.Add(delay),
	}

	// The effect: the transfer has started.
	s.mu.Lock()
	p.ledger = len(s.ledger)
	s.ledger = append(s.ledger, LedgerEntry{
		ID: p.ID, Object: ObjectPayout, IdempotencyKey: key, Amount: p.Amount, Currency: p.Currency,
		Status: p.Status, Destination: p.Destination, Created: p.Created,
	})
	s.payouts[p.ID] = p
	answer := p.Payout
	s.mu.Unlock()

	// It arrives on its own; a GET after the time settles it too, so the
	// answer never depends on the timer having fired yet.
	time.AfterFunc(delay, func() { s.settlePayout(p.ID) })
	return outcome{status: http.StatusCreated, body: mustJSON(answer), effect: true}
}

// settlePayout moves a payout whose transfer has arrived to its final
// status, once, and sends its webhook.
func (s *Server) settlePayout(id string) (Payout, bool) {
	s.mu.Lock()
	p, ok := s.payouts[id]
	if !ok {
		s.mu.Unlock()
		return Payout{}, false
	}
	settled := false
	if p.Status == PayoutInTransit && !s.cfg.Now().Before(p.arrives) {
		p.Status = PayoutPaid
		if p.Destination == DestinationClosed {
			code := FailureAccountClosed
			p.Status, p.FailureCode = PayoutFailed, &code
			s.ledger[p.ledger].FailureCode = code
		}
		s.ledger[p.ledger].Status = p.Status
		settled = true
	}
	out := p.Payout
	s.mu.Unlock()

	if settled {
		eventType := EventPayoutPaid
		if out.Status == PayoutFailed {
			eventType = EventPayoutFailed
		}
		s.emit(eventType, EventData{
			ID: out.ID, DownstreamKey: out.IdempotencyKey, Amount: out.Amount, Currency: out.Currency,
			Status: out.Status, FailureCode: out.FailureCode,
		})
	}
	return out, true
}

func (s *Server) handleGetPayout(w http.ResponseWriter, r *http.Request) {
	p, ok := s.settlePayout(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, ErrorTypeInvalidRequest, CodeResourceMissing, "no such payout", nil)
		return
	}
	writeJSON(w, http.StatusOK, mustJSON(p), nil)
}
