package payouts

import (
	"context"
	"errors"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/postgres"
)

// tracer makes each job run's span; the global API's, as everywhere.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/payouts")

// startJob starts the span of one run of job: the root of its own trace,
// linked to the request that accepted the payout. As the request's children,
// the runs (over seconds or days after its 202) would stretch its trace.
func startJob(ctx context.Context, job *river.Job[JobArgs]) (context.Context, trace.Span) {
	return tracer.Start(ctx, "payout job", append(postgres.LinkTo(&job.Args.Traceparent),
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("payout.id", job.Args.PayoutID), attribute.Int("job.attempt", job.Attempt)))...)
}

// endJob ends a run's span. A snooze (the transfer still in transit) ends a
// run between two steps: not a failure.
func endJob(span trace.Span, err error) {
	if err != nil && !errors.As(err, new(*river.JobSnoozeError)) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	span.End()
}
