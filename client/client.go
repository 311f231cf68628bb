// Package client is the retry-safe Go client of the payments API: the
// client generated from api/openapi.yaml (package apiclient), wrapped in
// the other half of exactly-once effect, retrying correctly:
//
//   - one Idempotency-Key per logical operation, sent on every retry of it
//     (generated, unless the caller supplies its own);
//   - retries only what is safe to retry: connection errors and timeouts,
//     409 idempotency_key_in_use, 429, 502, 503, 504; never another 4xx;
//   - Retry-After honoured (seconds or an HTTP-date), otherwise full-jitter
//     backoff, random(0, min(cap, base·2^attempt));
//   - a cap on attempts, the context's deadline, and a retry budget shared
//     by all calls (retries at most ~10% of calls plus a small floor), so
//     an outage is not amplified;
//   - what happened (attempts, whether the answer was a replay) returned
//     with every answer.
//
// The backoff and the budget are package retry, the policy the server's
// reconciler and outbox relay use too.
package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/retry"
)

// Policy is how a Client retries.
type Policy struct {
	// MaxAttempts caps the tries of one operation, the first included.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the full-jitter backoff.
	BaseDelay, MaxDelay time.Duration
	// Budget is shared by every call of the client (and may be shared by
	// several clients): each first try earns a tenth of a retry, each retry
	// spends one.
	Budget *retry.Budget
}

// DefaultPolicy: 5 attempts, 100ms to 5s backoff, a budget of 10% of calls
// with a floor of 10 retries.
func DefaultPolicy() Policy {
	return Policy{MaxAttempts: 5, BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second, Budget: retry.NewBudget(0.1, 10)}
}

// Client calls the API for one caller.
type Client struct {
	api    *apiclient.ClientWithResponses
	policy Policy
	// sleep waits between attempts; tests replace it to record the delays.
	sleep func(context.Context, time.Duration) error
	// OnAttempt, if set, is told about every attempt (for verbose output).
	OnAttempt func(Attempt)
}

// Attempt describes one try of an operation.
type Attempt struct {
	Number         int
	IdempotencyKey string
	Status         int   // 0 when no answer came
	Err            error // the transport error, if any
	Wait           time.Duration
}

// New returns a client for the API at baseURL, authenticated by apiKey.
func New(baseURL, apiKey string, policy Policy, httpClient *http.Client) (*Client, error) {
	api, err := apiclient.NewClientWithResponses(baseURL,
		apiclient.WithHTTPClient(cmp.Or(httpClient, &http.Client{Timeout: 30 * time.Second})),
		apiclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+apiKey)
			return nil
		}))
	if err != nil {
		return nil, err
	}
	return &Client{api: api, policy: policy, sleep: sleepCtx}, nil
}

// Result is what happened to one logical operation.
type Result struct {
	IdempotencyKey string
	Attempts       int
	Replayed       bool // the answer is an earlier attempt's (Idempotent-Replayed: true)
	Status         int
}

// Option adjusts one call.
type Option func(*callOptions)

type callOptions struct{ key string }

// WithIdempotencyKey sends key instead of a generated one, for a caller that
// persists its keys: after a restart, it still retries the same operation.
func WithIdempotencyKey(key string) Option { return func(o *callOptions) { o.key = key } }

// Error is a final answer that is not a success: an RFC 9457 problem.
type Error struct {
	Status  int
	Problem apiclient.Problem
	Result  Result
}

func (e *Error) Error() string {
	detail := ""
	if e.Problem.Detail != nil {
		detail = ": " + *e.Problem.Detail
	}
	return fmt.Sprintf("%d %s%s", e.Status, e.Problem.Code, detail)
}

// NewKey returns a fresh idempotency key: 128 random bits.
func NewKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// answer is one attempt's raw outcome.
type answer struct {
	resp *http.Response
	body []byte
}

// do runs one logical operation: send is called with the same key on every
// attempt, until an answer is final, the attempts or the budget run out, or
// the context's deadline would pass before the next try. parts picks out of
// send's response the raw answer and the value decoded for the status want.
func do[R, T any](ctx context.Context, c *Client, opts []Option, want int,
	send func(ctx context.Context, key string) (*R, error), parts func(*R) (*http.Response, []byte, *T),
) (T, Result, error) {
	o := callOptions{key: NewKey()}
	for _, opt := range opts {
		opt(&o)
	}
	res := Result{IdempotencyKey: o.key}
	if c.policy.Budget != nil {
		c.policy.Budget.Earn()
	}
	for {
		res.Attempts++
		r, err := send(ctx, o.key)
		var a answer
		var value *T
		att := Attempt{Number: res.Attempts, IdempotencyKey: o.key, Err: err}
		if err == nil {
			a.resp, a.body, value = parts(r)
			att.Status, res.Status = a.resp.StatusCode, a.resp.StatusCode
			res.Replayed = a.resp.Header.Get("Idempotent-Replayed") == "true"
		}
		wait, retryable := c.retryable(ctx, a, err, res.Attempts)
		deadline, hasDeadline := ctx.Deadline()
		switch {
		case !retryable:
		case res.Attempts >= c.policy.MaxAttempts:
			retryable = false
		case hasDeadline && time.Now().Add(wait).After(deadline):
			retryable = false // the next try could not finish in time
		case c.policy.Budget != nil && !c.policy.Budget.Spend():
			// Checked last, so that only a retry that will happen spends a
			// token. Spent: do not add load to an outage.
			retryable = false
		}
		if retryable {
			att.Wait = wait
		}
		if c.OnAttempt != nil {
			c.OnAttempt(att)
		}
		if !retryable {
			return final(a, value, want, res, err)
		}
		if err := c.sleep(ctx, wait); err != nil {
			return final(a, value, want, res, err)
		}
	}
}

// final turns the last answer into its value or an *Error.
func final[T any](a answer, value *T, want int, res Result, err error) (T, Result, error) {
	var zero T
	switch {
	case err != nil:
		return zero, res, err
	case a.resp.StatusCode == want && value != nil:
		return *value, res, nil
	case a.resp.StatusCode == want:
		return zero, res, fmt.Errorf("%d without a body", want)
	}
	e := &Error{Status: a.resp.StatusCode, Result: res}
	if err := json.NewDecoder(bytes.NewReader(a.body)).Decode(&e.Problem); err != nil {
		return zero, res, fmt.Errorf("unexpected answer %d: %s", a.resp.StatusCode, a.body)
	}
	return zero, res, e
}

// maxRetryAfter bounds how long a server may make the client wait.
const maxRetryAfter = 5 * time.Minute

// retryable says whether an attempt may be retried and after how long.
func (c *Client) retryable(ctx context.Context, a answer, err error, attempt int) (time.Duration, bool) {
	backoff := retry.FullJitter(c.policy.BaseDelay, c.policy.MaxDelay, attempt-1)
	if err != nil {
		// A connection error or a timeout of this attempt (the HTTP
		// client's own timeout too): the request may or may not have
		// arrived. With the same key a retry is safe either way. Only the
		// caller's context ending is the caller's decision to stop.
		return backoff, ctx.Err() == nil
	}
	switch a.resp.StatusCode {
	case http.StatusConflict:
		// Only "in progress" is transient; other conflicts are answers.
		var p apiclient.Problem
		if json.Unmarshal(a.body, &p) != nil || p.Code != apiclient.ProblemCodeIdempotencyKeyInUse {
			return 0, false
		}
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return 0, false
	}
	if d, ok := retryAfter(a.resp.Header.Get("Retry-After"), time.Now()); ok {
		if d > maxRetryAfter {
			return 0, false // longer than any retry horizon: give up now
		}
		return d, true
	}
	return backoff, true
}

// retryAfter parses Retry-After: delay-seconds or an HTTP-date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		// Beyond about 292 years the multiplication would overflow.
		return time.Duration(min(s, int64(maxRetryAfter/time.Second)+1)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d): // collected unfired since Go 1.23
		return nil
	}
}

// CreateOrder creates an order, retrying safely.
func (c *Client) CreateOrder(ctx context.Context, body apiclient.CreateOrderRequest, opts ...Option) (apiclient.Order, Result, error) {
	return do(ctx, c, opts, http.StatusCreated, func(ctx context.Context, key string) (*apiclient.CreateOrderResponse, error) {
		return c.api.CreateOrderWithResponse(ctx, &apiclient.CreateOrderParams{IdempotencyKey: key}, body)
	}, func(r *apiclient.CreateOrderResponse) (*http.Response, []byte, *apiclient.Order) {
		return r.HTTPResponse, r.Body, r.JSON201
	})
}

// Charge charges an order, retrying safely: however many attempts it
// takes, the card is charged at most once.
func (c *Client) Charge(ctx context.Context, orderID string, paymentMethod apiclient.CreateChargeRequestPaymentMethod, opts ...Option) (apiclient.Charge, Result, error) {
	return do(ctx, c, opts, http.StatusCreated, func(ctx context.Context, key string) (*apiclient.CreateChargeResponse, error) {
		return c.api.CreateChargeWithResponse(ctx, orderID, &apiclient.CreateChargeParams{IdempotencyKey: key},
			apiclient.CreateChargeRequest{PaymentMethod: paymentMethod})
	}, func(r *apiclient.CreateChargeResponse) (*http.Response, []byte, *apiclient.Charge) {
		return r.HTTPResponse, r.Body, r.JSON201
	})
}

// Refund refunds a charge (all that remains when amount is nil), retrying
// safely.
func (c *Client) Refund(ctx context.Context, chargeID string, amount *int64, opts ...Option) (apiclient.Refund, Result, error) {
	return do(ctx, c, opts, http.StatusCreated, func(ctx context.Context, key string) (*apiclient.CreateRefundResponse, error) {
		return c.api.CreateRefundWithResponse(ctx, chargeID, &apiclient.CreateRefundParams{IdempotencyKey: key},
			apiclient.CreateRefundRequest{Amount: amount})
	}, func(r *apiclient.CreateRefundResponse) (*http.Response, []byte, *apiclient.Refund) {
		return r.HTTPResponse, r.Body, r.JSON201
	})
}

// IdempotencyKey shows the record of one of the caller's keys (a safe
// read, retried like any other).
func (c *Client) IdempotencyKey(ctx context.Context, key string) (apiclient.IdempotencyKeyRecord, Result, error) {
	return do(ctx, c, []Option{WithIdempotencyKey(key)}, http.StatusOK, func(ctx context.Context, _ string) (*apiclient.GetIdempotencyKeyResponse, error) {
		return c.api.GetIdempotencyKeyWithResponse(ctx, key)
	}, func(r *apiclient.GetIdempotencyKeyResponse) (*http.Response, []byte, *apiclient.IdempotencyKeyRecord) {
		return r.HTTPResponse, r.Body, r.JSON200
	})
}

// Payout asks for a payout, retrying safely. The answer is 202 Accepted:
// the payout as accepted (pending), the same on every replay. It runs in
// the background; WaitForPayout follows it to its end.
func (c *Client) Payout(ctx context.Context, body apiclient.CreatePayoutRequest, opts ...Option) (apiclient.Payout, Result, error) {
	return do(ctx, c, opts, http.StatusAccepted, func(ctx context.Context, key string) (*apiclient.CreatePayoutResponse, error) {
		return c.api.CreatePayoutWithResponse(ctx, &apiclient.CreatePayoutParams{IdempotencyKey: key}, body)
	}, func(r *apiclient.CreatePayoutResponse) (*http.Response, []byte, *apiclient.Payout) {
		return r.HTTPResponse, r.Body, r.JSON202
	})
}

// GetPayout reads a payout as it is now, and how long the server suggests
// waiting before reading it again (0 once it is final).
func (c *Client) GetPayout(ctx context.Context, id string) (apiclient.Payout, time.Duration, error) {
	var header http.Header // the last answer's
	po, _, err := do(ctx, c, nil, http.StatusOK, func(ctx context.Context, _ string) (*apiclient.GetPayoutResponse, error) {
		return c.api.GetPayoutWithResponse(ctx, id)
	}, func(r *apiclient.GetPayoutResponse) (*http.Response, []byte, *apiclient.Payout) {
		header = r.HTTPResponse.Header
		return r.HTTPResponse, r.Body, r.JSON200
	})
	if err != nil {
		return po, 0, err
	}
	wait, _ := retryAfter(header.Get("Retry-After"), time.Now())
	return po, wait, nil
}

// WaitForPayout polls the payout id until it is paid or failed, waiting
// between reads as long as the server's Retry-After says (a second when it
// says nothing), and returns it. onPoll, if not nil, sees every state read.
// The context bounds the wait: a payout can take days.
func (c *Client) WaitForPayout(ctx context.Context, id string, onPoll func(apiclient.Payout)) (apiclient.Payout, error) {
	for {
		po, wait, err := c.GetPayout(ctx, id)
		if err != nil {
			return po, err
		}
		if onPoll != nil {
			onPoll(po)
		}
		if po.Status == apiclient.PayoutStatusPaid || po.Status == apiclient.PayoutStatusFailed {
			return po, nil
		}
		if err := c.sleep(ctx, cmp.Or(wait, time.Second)); err != nil {
			return po, err
		}
	}
}

// Balance reads the caller's balance.
func (c *Client) Balance(ctx context.Context) (apiclient.Balance, error) {
	b, _, err := do(ctx, c, nil, http.StatusOK, func(ctx context.Context, _ string) (*apiclient.GetBalanceResponse, error) {
		return c.api.GetBalanceWithResponse(ctx)
	}, func(r *apiclient.GetBalanceResponse) (*http.Response, []byte, *apiclient.Balance) {
		return r.HTTPResponse, r.Body, r.JSON200
	})
	return b, err
}
