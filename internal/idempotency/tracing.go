package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/postgres"
)

// tracer makes this package's spans (a key's claim, each phase) through the global
// API, as an instrumentation library does: the process decides whether spans go anywhere.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/idempotency")

// The attributes of this package's spans. They never carry a key in clear:
// it may mean something to the client (an order number), and a trace goes
// to a backend more people read. KeyHash stands in for it, as in the log.
const (
	attrOperation     = attribute.Key("idempotency.operation")
	attrKeyHash       = attribute.Key("idempotency.key_hash")
	attrOutcome       = attribute.Key("idempotency.outcome")
	attrAttempt       = attribute.Key("idempotency.attempt")
	attrRecoveryPoint = attribute.Key("idempotency.recovery_point")
	attrReachedPoint  = attribute.Key("idempotency.reached_point")
	attrReplayCache   = attribute.Key("idempotency.replay_cache")
)

// KeyHash is a short hash of a caller's Idempotency-Key: enough to find
// the log lines and spans of one key, not to read the key. The caller's
// id is hashed with it, so two callers' equal keys do not look alike.
func KeyHash(callerID, key string) string {
	sum := sha256.Sum256([]byte(callerID + "\x00" + key))
	return hex.EncodeToString(sum[:6])
}

// startClaim starts the span of one claim of req's key. Its attributes are
// computed only for a span that records: no hash when tracing is off.
func startClaim(ctx context.Context, req Request) (context.Context, trace.Span) {
	if !inTrace(ctx) {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, span := tracer.Start(ctx, "idempotency.claim")
	if span.IsRecording() {
		span.SetAttributes(attrOperation.String(req.Operation), attrKeyHash.String(KeyHash(req.CallerID, req.Key)))
	}
	return ctx, span
}

// startResume starts the reconciler's span for rec: a trace of its own, for
// its phases and processor call, since it may run an hour after the
// request, whose trace it would stretch over the hour as a child. It links
// to that request instead, if it was traced.
func startResume(ctx context.Context, rec Record) (context.Context, trace.Span) {
	return tracer.Start(ctx, "reconciler resume", append(postgres.LinkTo(&rec.Traceparent),
		trace.WithNewRoot(), trace.WithAttributes(
			attrOperation.String(rec.Operation), attrKeyHash.String(KeyHash(rec.CallerID, rec.Key)),
			attrAttempt.Int64(int64(rec.Attempt)), attrRecoveryPoint.String(string(rec.RecoveryPoint))))...)
}

// startPhase starts the span of one phase of rec's operation.
func startPhase(ctx context.Context, rec Record) (context.Context, trace.Span) {
	if !inTrace(ctx) {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, span := tracer.Start(ctx, "phase "+string(rec.RecoveryPoint))
	traceRecord(ctx, rec)
	return ctx, span
}

// annotate sets kv on ctx's span, if it records (one attribute: a slice
// of them would be allocated even when tracing is off).
func annotate(ctx context.Context, kv attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(kv)
	}
}

// traceRecord notes rec's attempt and recovery point on ctx's span, for a resumed operation's reader.
func traceRecord(ctx context.Context, rec Record) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrAttempt.Int64(int64(rec.Attempt)), attrRecoveryPoint.String(string(rec.RecoveryPoint)))
	}
}

// endWithError ends span, marking it failed when err is not nil.
func endWithError(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// inTrace says whether ctx belongs to a trace a span of ours would join.
// Outside one (tracing off, no traceparent from the client) no span is
// started: even the no-op tracer would allocate a context and a span.
func inTrace(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsValid() }
