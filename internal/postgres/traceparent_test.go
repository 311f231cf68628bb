package postgres

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Only a span this process records leaves a traceparent on a row:
// with tracing off a request has no span, or only its client's (a remote
// span context, continued by the no-op tracer), and nothing is stored.
func TestTraceparentIsStoredOnlyForARecordedSpan(t *testing.T) {
	if tp := Traceparent(context.Background()); tp != nil {
		t.Errorf("no span: traceparent %q; want none", *tp)
	}
	client := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	if tp := Traceparent(trace.ContextWithRemoteSpanContext(context.Background(), client)); tp != nil {
		t.Errorf("a client's span context only: traceparent %q; want none", *tp)
	}

	provider := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	ctx, span := provider.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	tp := Traceparent(ctx)
	sc := span.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; tp == nil || *tp != want {
		t.Fatalf("a recorded span: traceparent %v; want %q", tp, want)
	}

	// What is stored links back to that span; nothing stored, or
	// something that does not parse, links nowhere.
	_, linked := provider.Tracer("test").Start(context.Background(), "resume", LinkTo(tp)...)
	defer linked.End()
	if links := linked.(sdktrace.ReadOnlySpan).Links(); len(links) != 1 || !links[0].SpanContext.Equal(sc.WithRemote(true)) {
		t.Errorf("links %+v; want one, to %v", links, sc)
	}
	for _, bad := range []string{"", "00-zz", "00-00000000000000000000000000000000-0000000000000000-01"} {
		if opts := LinkTo(&bad); opts != nil {
			t.Errorf("LinkTo(%q) = %v; want no link", bad, opts)
		}
	}
}
