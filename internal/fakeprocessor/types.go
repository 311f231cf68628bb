package fakeprocessor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// The wire types of the fake processor's API, exported so that the payments
// server's client and webhook receiver decode exactly what this encodes.

// Test payment methods (cf. Stripe's test cards). They are tokens: no card
// number exists anywhere in the processor.
const (
	// PaymentMethodVisa and PaymentMethodMastercard succeed.
	PaymentMethodVisa       = "pm_card_visa"
	PaymentMethodMastercard = "pm_card_mastercard"
	// PaymentMethodChargeDeclined and PaymentMethodInsufficientFunds are
	// declined (402) with decline code generic_decline or
	// insufficient_funds. A decline is an effect: a failed charge.
	PaymentMethodChargeDeclined    = "pm_card_chargeDeclined"
	PaymentMethodInsufficientFunds = "pm_card_insufficientFunds"

	// PaymentMethodFlaky answers 503 to the first Config.FlakyFailures
	// attempts on a downstream key, without an effect, then succeeds.
	PaymentMethodFlaky = "pm_card_flaky"
	// PaymentMethodRateLimited answers 429 with Retry-After: 1 to the first
	// attempt on a downstream key, without an effect, then succeeds.
	PaymentMethodRateLimited = "pm_card_rateLimited"
	// PaymentMethodInFlight answers 409 idempotency_key_in_use with
	// Retry-After: 1 to the first attempt on a key, without an effect, then
	// succeeds: Stripe's "an earlier request with the key still runs", not a refusal.
	PaymentMethodInFlight = "pm_card_inFlight"
	// PaymentMethodTimeout charges on the first attempt, then withholds the
	// answer until the client gives up (or Config.TimeoutHold passes): did it
	// charge? Later attempts on the key replay the stored success at once.
	PaymentMethodTimeout = "pm_card_timeout"
	// PaymentMethodLostResponse charges on the first attempt, then drops the
	// connection. Later attempts replay the stored success.
	PaymentMethodLostResponse = "pm_card_lostResponse"
)

// Charge and refund statuses, object names, and webhook event types
// (<object>.<status>).
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"

	ObjectCharge = "charge"
	ObjectRefund = "refund"

	EventChargeSucceeded = "charge.succeeded"
	EventChargeFailed    = "charge.failed"
	EventRefundSucceeded = "refund.succeeded"
)

// Error types (who is at fault, as in Stripe) and codes (the reason).
const (
	ErrorTypeInvalidRequest = "invalid_request_error"
	ErrorTypeCard           = "card_error"
	ErrorTypeIdempotency    = "idempotency_error"
	ErrorTypeAPI            = "api_error"
	ErrorTypeRateLimit      = "rate_limit_error"

	CodeIdempotencyKeyMissing = "idempotency_key_missing"
	CodeIdempotencyKeyInvalid = "idempotency_key_invalid"
	CodeIdempotencyKeyReused  = "idempotency_key_reused"
	CodeIdempotencyKeyInUse   = "idempotency_key_in_use"
	CodeBodyInvalid           = "body_invalid"
	CodeBodyTooLarge          = "body_too_large"
	CodeParameterInvalid      = "parameter_invalid"
	CodePaymentMethodUnknown  = "payment_method_unknown"
	CodeResourceMissing       = "resource_missing"
	CodeCardDeclined          = "card_declined"
	CodeAmountTooLarge        = "amount_too_large"
	CodeChargeNotRefundable   = "charge_not_refundable"
	CodeProcessorUnavailable  = "processor_unavailable"
	CodeRateLimited           = "rate_limited"

	// Decline codes, of the declining test payment methods.
	DeclineGeneric           = "generic_decline"
	DeclineInsufficientFunds = "insufficient_funds"
)

// CreateChargeRequest is the body of POST /v1/charges.
type CreateChargeRequest struct {
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	PaymentMethod string            `json:"payment_method"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// Charge is the 201 answer of POST /v1/charges.
type Charge struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	PaymentMethod string            `json:"payment_method"`
	Status        string            `json:"status"`
	DeclineCode   *string           `json:"decline_code"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	// IdempotencyKey is the downstream key of the charge; Created is Unix seconds.
	IdempotencyKey string `json:"idempotency_key"`
	Created        int64  `json:"created"`
}

// CreateRefundRequest is the body of POST /v1/refunds.
type CreateRefundRequest struct {
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
}

// Refund is the 201 answer of POST /v1/refunds.
type Refund struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Charge         string `json:"charge"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key"`
	Created        int64  `json:"created"`
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail describes an error. DeclineCode and Charge are set on a
// decline (402): the declined charge exists, with status failed.
type ErrorDetail struct {
	Type        string `json:"type"`
	Code        string `json:"code"`
	Message     string `json:"message"`
	DeclineCode string `json:"decline_code,omitempty"`
	Charge      string `json:"charge,omitempty"`
}

// LedgerEntry is one effect the processor performed: a charge (succeeded
// or failed), a refund or a payout.
type LedgerEntry struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	IdempotencyKey string `json:"idempotency_key"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Status         string `json:"status"`
	PaymentMethod  string `json:"payment_method,omitempty"`
	DeclineCode    string `json:"decline_code,omitempty"`
	Charge         string `json:"charge,omitempty"`
	// Set on payouts, whose Status moves from in_transit to paid or failed.
	Destination string `json:"destination,omitempty"`
	FailureCode string `json:"failure_code,omitempty"`
	Created     int64  `json:"created"`
}

// LedgerList is the answer of GET /v1/ledger, in the order of the effects.
type LedgerList struct {
	Data []LedgerEntry `json:"data"`
}

// Event is the body of a webhook delivery.
type Event struct {
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Created int64     `json:"created"`
	Data    EventData `json:"data"`
}

// EventData is the object an event is about.
type EventData struct {
	// ID is the charge (pch_…), refund (pre_…) or payout (ppo_…) id.
	ID string `json:"id"`
	// DownstreamKey is the Idempotency-Key of the effect, so the receiver
	// finds its record even when it never saw the answer (a timeout).
	DownstreamKey string  `json:"downstream_key"`
	Amount        int64   `json:"amount"`
	Currency      string  `json:"currency"`
	Status        string  `json:"status"`
	DeclineCode   *string `json:"decline_code"`
	Charge        string  `json:"charge,omitempty"`       // the refunded charge, on refund events
	FailureCode   *string `json:"failure_code,omitempty"` // why a payout failed, on payout.failed
}

// Chaos is the fault injection applied to every request, set in Config and
// changed at runtime with PUT /admin/chaos.
type Chaos struct {
	LatencyMS int     `json:"latency_ms"` // added to every /v1 call before it is handled
	ErrorRate float64 `json:"error_rate"` // the probability of a 503 before any effect
	// ErrorRetryAfter, if positive, is the Retry-After (seconds) of those
	// 503s: a processor telling its clients to stay away a while.
	ErrorRetryAfter int `json:"error_retry_after"`
	// TimeoutRate is the probability that a request with an effect
	// withholds its answer, as pm_card_timeout does.
	TimeoutRate float64 `json:"timeout_rate"`
	// DuplicateWebhookRate is the probability of delivering an event twice.
	DuplicateWebhookRate float64 `json:"duplicate_webhook_rate"`
}

// FetchLedger reads the ledger of the processor at baseURL, so that tests can
// check from outside that each downstream key had one effect.
func FetchLedger(ctx context.Context, baseURL string) ([]LedgerEntry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/ledger", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ledger: %s", res.Status)
	}
	var list LedgerList
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		return nil, err
	}
	return list.Data, nil
}

// SignatureHeader carries the signature of a webhook this processor sends
// (the scheme in internal/cardprocessor/signature.go).
const SignatureHeader = "Processor-Signature"
