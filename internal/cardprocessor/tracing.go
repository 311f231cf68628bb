package cardprocessor

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracer makes the span of each call to the processor, a child of the
// phase or the job that makes it. The global API's, as everywhere: the
// process decides whether spans are recorded.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/cardprocessor")

// startCall starts the span of one call ("processor charges"), with the
// downstream key on it: the processor's logs and ledger name the effect by
// it, it tells a reader that two attempts' calls were one effect, and, a
// hash, it shows no Idempotency-Key in clear.
func startCall(ctx context.Context, call, downstreamKey string) (context.Context, trace.Span) {
	// Outside any trace (tracing off, and no client's traceparent) there
	// is nothing to join: no span, and nothing to send the processor.
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, span := tracer.Start(ctx, "processor "+call, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("processor.call", call))
		if downstreamKey != "" {
			span.SetAttributes(attribute.String("processor.downstream_key", downstreamKey))
		}
	}
	return ctx, span
}

// inject sends the call's trace context (W3C traceparent), so a processor
// that traces (the fake one does) continues the operation's trace. The span
// is ours, not otelhttp's transport's, so that one call is one span, named
// for what it does, with the answer as the operation reads it (endCall).
func inject(ctx context.Context, req *http.Request) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
}

// endCall ends a call's span with its outcome (from what observe counted) in
// the recovery-point pattern's words: definite (a success), declined (a
// definite "no": nothing was done), rejected (the processor refused our key)
// or uncertain (no definite answer: the next attempt asks again, same key).
func endCall(span trace.Span, result string) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	outcome := result
	switch result {
	case "success":
		outcome = "definite"
	case "refused":
		outcome = "declined"
	}
	span.SetAttributes(attribute.String("processor.outcome", outcome))
	if outcome == "uncertain" || outcome == "rejected" {
		span.SetStatus(codes.Error, outcome)
	}
}
