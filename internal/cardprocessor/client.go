// Package cardprocessor is our side of the card processor: the interface
// the charge, refund and payout operations need (Processor), and a client
// of the processor's HTTP API (Client), which the fake in internal/fakeprocessor
// serves. A fork that uses a real processor implements Processor for it
// and builds it in internal/app (app.New) instead.
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

// PayoutRequest is a transfer to destination, a bank account token.
type PayoutRequest struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
}

// PayoutResult is a payout as the processor sees it.
type PayoutResult struct {
	ID          string  `json:"id"`
	Status      string  `json:"status"` // in_transit, paid or failed
	FailureCode *string `json:"failure_code"`
	ArrivalDate int64   `json:"arrival_date"` // when the transfer should arrive, Unix seconds
}

// Statuses on the wire: of a successful charge, and of a payout.
const (
	statusSucceeded = "succeeded"
	PayoutInTransit = "in_transit"
	PayoutPaid      = "paid"
	PayoutFailed    = "failed"
)

// SignatureHeader carries the signature of the processor's webhooks (the
// scheme in signature.go).
const SignatureHeader = "Processor-Signature"

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
// bounded by timeout (PROCESSOR_TIMEOUT), and a run of an operation by the
// timeout and a margin (config.Server.MaxRun), so a call that never returns
// cannot hold its key for ever (the owner renews its lease meanwhile).
func NewClient(baseURL string, timeout time.Duration) *Client {
	// One host, many calls at once: keep an idle connection for each, not
	// net/http's two, past which a burst's calls dial anew (and use up ports).
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = t.MaxIdleConns
	return &Client{baseURL: baseURL, http: &http.Client{Timeout: timeout, Transport: t}}
}

// UncertainError means the processor gave no definite answer (see
// Processor). It is never recorded as failed: the operation stays at its
// recovery point and a later attempt asks again under the same key.
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
	switch {
	case err != nil:
		return ch, err
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
	if refused, ok := errors.AsType[*RefusedError](err); ok {
		// The processor refused the charge request and did nothing: the
		// charge is recorded as failed, with the processor's reason.
		return ch, &DeclinedError{DeclineCode: refused.Code}
	}
	return ch, err
}

// notDone reads an answer that is not the call's success. Only 400 (the
// request is invalid) and 404 (what it names does not exist) say
// "definitely not": nothing was done. 422 is our key seen with a different
// request: our bug, set aside. Everything else (429, 5xx, a 409 while an
// earlier request with the key runs, a 401 or 403 from a misconfigured key,
// any status we do not know) does not say what happened: uncertain.
func notDone(status int, header http.Header, body []byte) error {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound:
		return &RefusedError{Code: refusalCode(body, status)}
	case http.StatusUnprocessableEntity:
		return &RejectedError{Status: status, Code: refusalCode(body, status)}
	}
	return &UncertainError{Err: fmt.Errorf("processor answered %d", status), RetryAfter: retryAfter(header)}
}

// RejectedError is the processor refusing our downstream key itself (422):
// no retry can succeed and the customer is not at fault; a person must look.
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

// post sends req under downstreamKey (see send).
func (c *Client) post(ctx context.Context, path, downstreamKey string, req any) (int, http.Header, []byte, error) {
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
	// reused connection fails before any answer: safe, but an attempt hidden
	// from our accounting. Without GetBody it cannot rewind the body to resend.
	httpReq.GetBody = nil
	return c.send(ctx, httpReq, strings.TrimPrefix(path, "/v1/"), downstreamKey, nil)
}

// send makes one call in its own span, and counts it (observe). No complete
// answer is an UncertainError: the processor may have acted. check, if set,
// judges the answer; the call counts as uncertain when it fails.
func (c *Client) send(ctx context.Context, req *http.Request, call, downstreamKey string, check func(status int, header http.Header, body []byte) error) (status int, header http.Header, body []byte, err error) {
	start := time.Now()
	ctx, span := startCall(ctx, call, downstreamKey)
	inject(ctx, req)
	defer func() { endCall(span, observe(call, start, status, err)) }()
	res, err := c.http.Do(req.WithContext(ctx))
	if err != nil {
		return 0, nil, nil, &UncertainError{Err: err}
	}
	defer res.Body.Close()
	body, err = io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, &UncertainError{Err: err}
	}
	if check != nil {
		err = check(res.StatusCode, res.Header, body)
	}
	return res.StatusCode, res.Header, body, err
}

// observe counts one call by its result, as the caller will judge it (see
// notDone; a 402 is a decline).
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
	return create(ctx, c, "/v1/refunds", "refund", downstreamKey, req, func(re RefundResult) bool { return re.ID != "" })
}

// Payout asks the processor to start the transfer req under
// downstreamKey, in one attempt (see Charge). A 400 or 404 is a definite
// "no" (*RefusedError): no transfer was started.
func (c *Client) Payout(ctx context.Context, downstreamKey string, req PayoutRequest) (PayoutResult, error) {
	return create(ctx, c, "/v1/payouts", "payout", downstreamKey, req, func(po PayoutResult) bool {
		return po.ID != "" && knownPayoutStatus(po.Status)
	})
}

// create posts req under downstreamKey and reads a 201 as a T, which must
// be valid: a 201 we cannot read is uncertain. Other answers are notDone's.
func create[T any](ctx context.Context, c *Client, path, what, downstreamKey string, req any, valid func(T) bool) (T, error) {
	var v T
	status, header, body, err := c.post(ctx, path, downstreamKey, req)
	switch {
	case err != nil:
		return v, err
	case status != http.StatusCreated:
		return v, notDone(status, header, body)
	}
	if err := json.Unmarshal(body, &v); err != nil || !valid(v) {
		return v, &UncertainError{Err: fmt.Errorf("decode processor %s (%s): %v", what, body, err)}
	}
	return v, nil
}

// GetPayout reads the processor's payout id. Any failure is uncertain:
// reading changes nothing, so the caller simply asks again later.
func (c *Client) GetPayout(ctx context.Context, id string) (PayoutResult, error) {
	var po PayoutResult
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+"/v1/payouts/"+url.PathEscape(id), nil)
	if err != nil {
		return po, err
	}
	_, _, _, err = c.send(ctx, req, "get_payout", "", func(status int, header http.Header, body []byte) error {
		if status != http.StatusOK {
			return &UncertainError{Err: fmt.Errorf("processor answered %d to GET payout %s", status, id), RetryAfter: retryAfter(header)}
		}
		if err := json.Unmarshal(body, &po); err != nil || po.ID != id || !knownPayoutStatus(po.Status) {
			return &UncertainError{Err: fmt.Errorf("decode processor payout (%s): %v", body, err)}
		}
		return nil
	})
	return po, err
}

func knownPayoutStatus(s string) bool {
	return s == PayoutInTransit || s == PayoutPaid || s == PayoutFailed
}

// IsDefinite reports whether err is a definite "no" from the processor (a
// decline or a refusal): nothing was done, and the outcome is final.
func IsDefinite(err error) bool {
	_, declined := errors.AsType[*DeclinedError](err)
	_, refused := errors.AsType[*RefusedError](err)
	return declined || refused
}

// RefusalCode is the processor's reason for a definite "no" (a decline
// code, or a refusal code), or "" when err is not one.
func RefusalCode(err error) string {
	if declined, ok := errors.AsType[*DeclinedError](err); ok {
		return declined.DeclineCode
	}
	if refused, ok := errors.AsType[*RefusedError](err); ok {
		return refused.Code
	}
	return ""
}
