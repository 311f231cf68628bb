package events

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// An event keeps a traceparent only when written under a span this
// process records: with tracing off there is no span, or only a client's
// (continued by the no-op tracer), and the column stays empty.
func TestEventTraceparentIsStoredOnlyForARecordedSpan(t *testing.T) {
	if tp := traceparentOf(context.Background()); tp != nil {
		t.Errorf("no span: traceparent %q; want none", *tp)
	}
	client := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	if tp := traceparentOf(trace.ContextWithRemoteSpanContext(context.Background(), client)); tp != nil {
		t.Errorf("a client's span context only: traceparent %q; want none", *tp)
	}

	provider := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	ctx, span := provider.Tracer("test").Start(context.Background(), "phase")
	defer span.End()
	tp := traceparentOf(ctx)
	sc := span.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; tp == nil || *tp != want {
		t.Fatalf("a recorded span: traceparent %v; want %q", tp, want)
	}
	_, delivery := provider.Tracer("test").Start(context.Background(), "delivery", linkTo(tp)...)
	defer delivery.End()
	if links := delivery.(sdktrace.ReadOnlySpan).Links(); len(links) != 1 || !links[0].SpanContext.Equal(sc.WithRemote(true)) {
		t.Errorf("links %+v; want one, to %v", links, sc)
	}
	bad := "00-zz"
	for _, tp := range []*string{nil, &bad} {
		if opts := linkTo(tp); opts != nil {
			t.Errorf("linkTo(%v) = %v; want no link", tp, opts)
		}
	}
}
