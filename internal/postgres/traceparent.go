package postgres

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Traceparent is the W3C trace context of ctx's span, for a row that
// background work will pick up long after the request (a key record the
// reconciler resumes, an event the relay delivers), so that the work's
// own trace can link back to it (LinkTo). It is nil unless the span is one
// this process records: with tracing off (or the request not sampled)
// nothing is stored and nothing is computed, and what is stored is always
// the SDK's own rendering of a span context, never a client's header.
func Traceparent(ctx context.Context) *string {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	// Only the version-00 form the columns' CHECK accepts: "00-" + 32 hex
	// digits + "-" + 16 hex digits + "-" + 2 hex digits.
	if tp := carrier["traceparent"]; len(tp) == 55 {
		return &tp
	}
	return nil
}

// LinkTo is the start option that links a new trace to the span a stored
// traceparent names; none when nothing is stored or it does not parse.
func LinkTo(tp *string) []trace.SpanStartOption {
	if tp == nil || *tp == "" {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": *tp})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	return []trace.SpanStartOption{trace.WithLinks(trace.LinkFromContext(ctx))}
}
