package charges

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/retrysafe/payments/internal/processor"
)

// ProcessorClient calls the card processor's API.
type ProcessorClient struct {
	baseURL string
	http    *http.Client
}

// NewProcessorClient returns a client for the processor at baseURL. Each
// call is bounded by timeout, which must stay well below the idempotency
// lease: the whole operation, processor call included, has to finish
// within the lease.
func NewProcessorClient(baseURL string, timeout time.Duration) *ProcessorClient {
	return &ProcessorClient{baseURL: baseURL, http: &http.Client{Timeout: timeout}}
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
func (c *ProcessorClient) Charge(ctx context.Context, downstreamKey string, req processor.CreateChargeRequest) (processor.Charge, error) {
	var ch processor.Charge
	body, err := json.Marshal(req)
	if err != nil {
		return ch, err
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return ch, err
	}
	httpReq.Header.Set("Content-Type", "application/json")
	httpReq.Header.Set("Idempotency-Key", downstreamKey)
	// net/http silently resends a request carrying an Idempotency-Key when a
	// reused connection fails before any answer. Safe here, but it would be
	// a second attempt hidden from our accounting; without GetBody the body
	// cannot be rewound, so it is not resent.
	httpReq.GetBody = nil

	res, err := c.http.Do(httpReq)
	if err != nil {
		return ch, &UncertainError{Err: err}
	}
	defer res.Body.Close()
	resBody, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return ch, &UncertainError{Err: err}
	}
	switch {
	case res.StatusCode == http.StatusCreated:
		if err := json.Unmarshal(resBody, &ch); err != nil {
			return ch, &UncertainError{Err: fmt.Errorf("decode processor charge: %w", err)}
		}
		return ch, nil
	case res.StatusCode == http.StatusPaymentRequired:
		var e processor.ErrorResponse
		if err := json.Unmarshal(resBody, &e); err != nil || e.Error.DeclineCode == "" {
			return ch, &UncertainError{Err: fmt.Errorf("undecodable decline: %s", resBody)}
		}
		return ch, &DeclinedError{DeclineCode: e.Error.DeclineCode, ProcessorChargeID: e.Error.Charge}
	case res.StatusCode == http.StatusTooManyRequests || res.StatusCode >= 500:
		retryAfter := time.Second
		if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && s > 0 {
			retryAfter = time.Duration(s) * time.Second
		}
		return ch, &UncertainError{Err: fmt.Errorf("processor answered %d", res.StatusCode), RetryAfter: retryAfter}
	default:
		// Any other 4xx means we sent something wrong: a bug, not a state
		// of the world. It is final, and loud.
		return ch, errors.New("processor rejected the request: " + strconv.Itoa(res.StatusCode) + " " + string(resBody))
	}
}
