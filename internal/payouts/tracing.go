package payouts

import (
	"context"
	"errors"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/postgres"
)

// tracer makes the span of each run of a payout job. The global API's, as
// everywhere: the process decides whether spans are recorded.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/payouts")

// traceparentOf is ctx's W3C trace context, for the job to link back to,
// or "" when ctx has no span (tracing is off and the client sent none).
func traceparentOf(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// startJob starts the span of one run of job: the root of a trace of its
// own, not a child of the request's. A payout runs for seconds or days,
// over many runs, each long after the request answered 202; as children
// they would stretch the request's trace over all of that. Instead each
// run links to the request that accepted the payout, so a reader goes from
// either to the other.
func startJob(ctx context.Context, job *river.Job[JobArgs]) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("payout.id", job.Args.PayoutID),
			attribute.Int("job.attempt", job.Attempt),
		),
	}
	opts = append(opts, postgres.LinkTo(&job.Args.Traceparent)...)
	return tracer.Start(ctx, "payout job", opts...)
}

// endJob ends a run's span. A snooze (the transfer is still in transit)
// is how a run ends between two steps, not a failure.
func endJob(span trace.Span, err error) {
	var snooze *river.JobSnoozeError
	if err != nil && !errors.As(err, &snooze) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	span.End()
}
