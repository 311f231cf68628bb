// Package cardprocessor is our side of the card processor: the interface
// the charge, refund and payout operations need (Processor), and a client of the
// processor's HTTP API that implements it (Client), with the wire types it
// speaks. The fake processor in internal/processor serves the same API; a
// fork that uses a real processor implements Processor for it and builds
// it in internal/app (app.New) instead of this Client.
package cardprocessor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/payments/internal/metrics"
)

// Processor moves money. Each call is one attempt under a downstream
// idempotency key that the processor must honour: the same key always
// names the same effect, so a call repeated after a crash or a timeout
// collapses into the first one. Its errors say how certain the outcome is:
//
//   - nil: a definite success;
//   - *DeclinedError (charges) or *RefusedError (refunds, payouts): a
//     definite "no", nothing was done; a final outcome;
//   - *UncertainError: no definite answer (a timeout, a dropped
//     connection, a 5xx, a 429, a 409 because an earlier request with the
//     key is still running); the effect may or may not exist, and the
//     caller must ask again later under the same key;
//   - *RejectedError: the processor refuses the key itself (422: it was
//     used for a different request). That is our bug, not the customer's:
//     never a decline, and no retry can fix it; a person must look;
//   - anything else is treated as uncertain too.
type Processor interface {
	Charge(ctx context.Context, downstreamKey string, req ChargeRequest) (ChargeResult, error)
	Refund(ctx context.Context, downstreamKey string, req RefundRequest) (RefundResult, error)
	// Payout starts a transfer to a bank account: success means the
	// processor accepted it (in transit), not that it arrived.
	Payout(ctx context.Context, downstreamKey string, req PayoutRequest) (PayoutResult, error)
	// GetPayout reads a payout as it is now, by the processor's id. It is
	// safe, so it needs no key.
	GetPayout(ctx context.Context, id string) (PayoutResult, error)
}

// ChargeRequest is a charge to make: an amount in minor units of currency,
// from a payment method token (never a card number).
type ChargeRequest struct {
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	PaymentMethod string `json:"payment_method"`
}

// ChargeResult is a charge that succeeded: the processor's id for it.
type ChargeResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// RefundRequest is a refund of amount from the processor's charge.
type RefundRequest struct {
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
}

// RefundResult is a refund that succeeded: the processor's id for it.
type RefundResult struct {
	ID string `json:"id"`
}

// PayoutRequest is a transfer of amount in currency to destination (a
// bank account token).
type PayoutRequest struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
}

// PayoutResult is a payout as the processor sees it.
type PayoutResult struct {
	ID string `json:"id"`
	// Status is in_transit, paid or failed.
	Status      string  `json:"status"`
	FailureCode *string `json:"failure_code"`
	// ArrivalDate is when the transfer is expected to arrive, in Unix
	// seconds.
	ArrivalDate int64 `json:"arrival_date"`
}

// Payout statuses on the wire.
const (
	PayoutInTransit = "in_transit"
	PayoutPaid      = "paid"
	PayoutFailed    = "failed"
)

// SignatureHeader carries the signature of the processor's webhooks (the
// scheme in signature.go).
const SignatureHeader = "Processor-Signature"

// statusSucceeded is the status of a successful charge on the wire.
const statusSucceeded = "succeeded"

// errorResponse is the body of every error answer of the processor's API.
type errorResponse struct {
	Error struct {
		Code        string `json:"code"`
		DeclineCode string `json:"decline_code"`
		Charge      string `json:"charge"`
	} `json:"error"`
}

// Client calls the processor's HTTP API (the fake's, or one that speaks it).
type Client struct {
	baseURL string
	http    *http.Client
}

var _ Processor = (*Client)(nil)

// NewClient returns a client for the processor at baseURL. Each call is
// bounded by timeout (PROCESSOR_TIMEOUT). The owner of the operation renews
// its lease while the call runs, and one run of an operation is bounded by
// the timeout and a margin (config.Server.MaxRun), so a call that never
// returns cannot hold its key for ever.
func NewClient(baseURL string, timeout time.Duration) *Client {
	return &Client{baseURL: baseURL, http: &http.Client{Timeout: timeout}}
}

// UncertainError means the processor gave no definite answer: a timeout, a
// dropped connection, a 5xx or a 429. The charge may or may not exist; it
// must never be recorded as failed. The operation stays at its recovery
// point and a later attempt asks again with the same downstream key.
type UncertainError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *UncertainError) Error() string { return "processor outcome unknown: " + e.Err.Error() }
func (e *UncertainError) Unwrap() error { return e.Err }

// DeclinedError is a definite "no" from the processor: the card was
// declined. It is a final outcome.
type DeclinedError struct {
	DeclineCode       string
	ProcessorChargeID string
}

func (e *DeclinedError) Error() string { return "card declined: " + e.DeclineCode }

// Charge asks the processor to charge req under downstreamKey. It makes one
// attempt: retries belong to the client of our API and to the reconciler,
// and a retry loop here would multiply theirs.
func (c *Client) Charge(ctx context.Context, downstreamKey string, req ChargeRequest) (ChargeResult, error) {
	var ch ChargeResult
	status, header, resBody, err := c.post(ctx, "/v1/charges", downstreamKey, req)
	if err != nil {
		return ch, err
	}
	switch {
	case status == http.StatusCreated:
		if err := json.Unmarshal(resBody, &ch); err != nil {
			return ch, &UncertainError{Err: fmt.Errorf("decode processor charge: %w", err)}
		}
		if ch.Status != statusSucceeded || ch.ID == "" {
			// Not the success the API promises: we cannot record it (a
			// refund would have no charge to name), so ask again later.
			return ch, &UncertainError{Err: fmt.Errorf("processor answered 201 with status %q and id %q", ch.Status, ch.ID)}
		}
		return ch, nil
	case status == http.StatusPaymentRequired:
		var e errorResponse
		if err := json.Unmarshal(resBody, &e); err != nil || e.Error.DeclineCode == "" {
			return ch, &UncertainError{Err: fmt.Errorf("undecodable decline: %s", resBody)}
		}
		return ch, &DeclinedError{DeclineCode: e.Error.DeclineCode, ProcessorChargeID: e.Error.Charge}
	}
	err = notDone(status, header, resBody)
	var refused *RefusedError
	if errors.As(err, &refused) {
		// The processor refused the charge request and did nothing: the
		// charge is recorded as failed, with the processor's reason.
		return ch, &DeclinedError{DeclineCode: refused.Code}
	}
	return ch, err
}

// notDone reads an answer that is not the call's success. Only a few
// answers say "definitely not": 400 (the request is invalid) and 404 (what
// it names does not exist) are refusals, and nothing was done. 422 means
// the processor saw our downstream key with a different request: our bug,
// set aside. Everything else (429, 5xx, a 409 while an earlier request
// with the key runs, a 401 or 403 from a misconfigured key, any status we
// do not know) does not say what happened, so it is uncertain: asked again
// later under the same key, never recorded as a failure.
func notDone(status int, header http.Header, body []byte) error {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound:
		return &RefusedError{Code: refusalCode(body, status)}
	case http.StatusUnprocessableEntity:
		return &RejectedError{Status: status, Code: refusalCode(body, status)}
	}
	return &UncertainError{Err: fmt.Errorf("processor answered %d", status), RetryAfter: retryAfter(header)}
}

// RejectedError is the processor refusing our downstream key itself: it
// has seen the key with a different request (422). No retry under the key
// can succeed and nothing says the customer is at fault, so it is neither
// retried nor recorded as a decline: the operation is set aside for a
// person.
type RejectedError struct {
	Status int
	Code   string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("processor rejected the downstream key (%d %s)", e.Status, e.Code)
}

// refusalCode is the processor's error code, or a generic one.
func refusalCode(body []byte, status int) string {
	var e errorResponse
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return e.Error.Code
	}
	return "processor_refused_" + strconv.Itoa(status)
}

// post sends one request under downstreamKey. A failure to get a complete
// answer is an UncertainError: the processor may have acted.
func (c *Client) post(ctx context.Context, path, downstreamKey string, req any) (status int, _ http.Header, _ []byte, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, nil, nil, err
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	httpReq.Header.Set("Content-Type", "application/json")
	httpReq.Header.Set("Idempotency-Key", downstreamKey)
	// net/http silently resends a request carrying an Idempotency-Key when a
	// reused connection fails before any answer. Safe here, but it would be
	// a second attempt hidden from our accounting; without GetBody the body
	// cannot be rewound, so it is not resent.
	httpReq.GetBody = nil
	start := time.Now()

	call := strings.TrimPrefix(path, "/v1/")
	ctx, span := startCall(ctx, call, downstreamKey)
	inject(ctx, httpReq)
	defer func() { endCall(span, observe(call, start, status, err)) }()
	res, err := c.http.Do(httpReq.WithContext(ctx))
	if err != nil {
		return 0, nil, nil, &UncertainError{Err: err}
	}
	defer res.Body.Close()
	resBody, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, &UncertainError{Err: err}
	}
	return res.StatusCode, res.Header, resBody, nil
}

// observe counts one call by its result, as the caller will judge it: a
// 2xx is a success; a 400, 402 or 404 a definite refusal; a 422 a rejected
// key; anything else (no answer, a 5xx, a 429, a 409) uncertain.
func observe(call string, start time.Time, status int, err error) (result string) {
	result = "uncertain"
	switch {
	case err != nil:
	case status >= 200 && status < 300:
		result = "success"
	case status == http.StatusBadRequest || status == http.StatusPaymentRequired || status == http.StatusNotFound:
		result = "refused"
	case status == http.StatusUnprocessableEntity:
		result = "rejected"
	}
	metrics.ProcessorCalls.WithLabelValues(call, result).Inc()
	metrics.ProcessorDuration.WithLabelValues(call).Observe(time.Since(start).Seconds())
	return result
}

func retryAfter(h http.Header) time.Duration {
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// RefusedError is a definite "no" from the processor to a refund (the
// amount is too large, the charge cannot be refunded). Our own reservation
// should make it impossible; it is final all the same.
type RefusedError struct {
	Code string
}

func (e *RefusedError) Error() string { return "processor refused the refund: " + e.Code }

// Refund asks the processor to refund req under downstreamKey, in one
// attempt (see Charge).
func (c *Client) Refund(ctx context.Context, downstreamKey string, req RefundRequest) (RefundResult, error) {
	var re RefundResult
	status, header, body, err := c.post(ctx, "/v1/refunds", downstreamKey, req)
	if err != nil {
		return re, err
	}
	switch {
	case status == http.StatusCreated:
		if err := json.Unmarshal(body, &re); err != nil || re.ID == "" {
			return re, &UncertainError{Err: fmt.Errorf("decode processor refund (%s): %v", body, err)}
		}
		return re, nil
	}
	// A definite "no" is a 400 (too large, not refundable) or a 404 (no
	// such charge); see notDone.
	return re, notDone(status, header, body)
}

// Payout asks the processor to start the transfer req under
// downstreamKey, in one attempt (see Charge). A 400 or 404 is a definite
// "no" (*RefusedError): no transfer was started.
func (c *Client) Payout(ctx context.Context, downstreamKey string, req PayoutRequest) (PayoutResult, error) {
	var po PayoutResult
	status, header, body, err := c.post(ctx, "/v1/payouts", downstreamKey, req)
	if err != nil {
		return po, err
	}
	switch {
	case status == http.StatusCreated:
		if err := json.Unmarshal(body, &po); err != nil || po.ID == "" || !knownPayoutStatus(po.Status) {
			return po, &UncertainError{Err: fmt.Errorf("decode processor payout (%s): %v", body, err)}
		}
		return po, nil
	}
	return po, notDone(status, header, body)
}

// GetPayout reads the processor's payout id. Any failure is an
// UncertainError: reading changes nothing, so the caller simply asks
// again later.
func (c *Client) GetPayout(ctx context.Context, id string) (_ PayoutResult, err error) {
	var po PayoutResult
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+"/v1/payouts/"+url.PathEscape(id), nil)
	if err != nil {
		return po, err
	}
	status := 0
	ctx, span := startCall(ctx, "get_payout", "")
	inject(ctx, req)
	defer func() { endCall(span, observe("get_payout", start, status, err)) }()
	res, err := c.http.Do(req.WithContext(ctx))
	if err != nil {
		return po, &UncertainError{Err: err}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return po, &UncertainError{Err: err}
	}
	status = res.StatusCode
	if res.StatusCode != http.StatusOK {
		return po, &UncertainError{Err: fmt.Errorf("processor answered %d to GET payout %s", res.StatusCode, id), RetryAfter: retryAfter(res.Header)}
	}
	if err := json.Unmarshal(body, &po); err != nil || po.ID != id || !knownPayoutStatus(po.Status) {
		return po, &UncertainError{Err: fmt.Errorf("decode processor payout (%s): %v", body, err)}
	}
	return po, nil
}

func knownPayoutStatus(s string) bool {
	return s == PayoutInTransit || s == PayoutPaid || s == PayoutFailed
}

// IsDefinite reports whether err is a definite "no" from the processor (a
// decline or a refusal): nothing was done, and the outcome is final.
func IsDefinite(err error) bool {
	var declined *DeclinedError
	var refused *RefusedError
	return errors.As(err, &declined) || errors.As(err, &refused)
}

// RefusalCode is the processor's reason for a definite "no" (a decline
// code, or a refusal code), or "" when err is not one.
func RefusalCode(err error) string {
	var declined *DeclinedError
	var refused *RefusedError
	switch {
	case errors.As(err, &declined):
		return declined.DeclineCode
	case errors.As(err, &refused):
		return refused.Code
	}
	return ""
}
