package idempotency

import (
	"context"

	"github.com/retrysafe/payments/internal/metrics"
)

type requestKey struct{}

// WithRequest returns ctx carrying the keyed request the HTTP layer parsed.
func WithRequest(ctx context.Context, r Request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// RequestFrom returns the keyed request carried by ctx.
func RequestFrom(ctx context.Context) (Request, bool) {
	r, ok := ctx.Value(requestKey{}).(Request)
	return r, ok
}

type outcomeKey struct{}

// WithOutcome returns ctx carrying a place for what the claim of a keyed
// request found (an Outcome value), for the request log to read.
func WithOutcome(ctx context.Context) (_ context.Context, outcome func() string) {
	var o string
	return context.WithValue(ctx, outcomeKey{}, &o), func() string { return o }
}

// observe counts a claim's outcome, for the request log and ctx's span too.
func observe(ctx context.Context, operation, outcome string) {
	metrics.IdempotencyOutcomes.WithLabelValues(operation, outcome).Inc()
	annotate(ctx, attrOutcome.String(outcome))
	retell(ctx, outcome)
}

// retell changes what the request log and Idempotency-Outcome say of a
// request already counted: a fenced-out owner answers with a replay.
func retell(ctx context.Context, outcome string) {
	if p, ok := ctx.Value(outcomeKey{}).(*string); ok {
		*p = outcome
	}
}
