package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/server"
)

// Tracing is the process's OpenTelemetry setup. Every package makes its
// spans through the global API (otel.Tracer), as instrumentation libraries
// do; this is the one place that decides whether they are recorded and
// where they go.
type Tracing struct {
	Recent    *RecentTraces // the demo's latest traces (GET /demo/traces); nil outside DEMO_MODE
	Exporting bool          // spans are sent to an OTLP receiver

	provider *sdktrace.TracerProvider // nil: tracing is off
}

// SetupTracing sets the W3C trace context propagator, always (a client's
// traceparent is continued, and logged, even when nothing is recorded here),
// and a tracer provider for what is to receive spans: an OTLP/HTTP exporter
// when OTEL_EXPORTER_OTLP_ENDPOINT or _TRACES_ENDPOINT is set (it reads the
// OTEL_EXPORTER_OTLP_ variables itself), the demo's recent traces (demo),
// and extra (tests). With none, the global tracer stays the no-op one: a
// span costs a context lookup.
//
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the service
// ("payments" by default), OTEL_TRACES_SAMPLER (and _ARG) the sampler
// (parent-based, always on, by default), and OTEL_SDK_DISABLED=true turns
// recording off. Process-wide: call it once, and Shutdown before exit.
func SetupTracing(ctx context.Context, demo bool, extra ...sdktrace.SpanProcessor) (*Tracing, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t := &Tracing{}
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return t, nil
	}
	var opts []sdktrace.TracerProviderOption
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exporter, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exporter))
		t.Exporting = true
	}
	if demo {
		t.Recent = NewRecentTraces(recentTraces, spansPerTrace)
		opts = append(opts, sdktrace.WithSpanProcessor(t.Recent))
	}
	for _, p := range extra {
		opts = append(opts, sdktrace.WithSpanProcessor(p))
	}
	if len(opts) == 0 {
		return t, nil
	}
	// WithFromEnv comes later: OTEL_SERVICE_NAME overrides the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("payments")),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	t.provider = sdktrace.NewTracerProvider(append(opts,
		sdktrace.WithResource(res),
		// Every value bounded: an attribute is one of ours, but a bound
		// keeps a bug from making a span (and the demo's store) large.
		sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{AttributeValueLengthLimit: 256, AttributeCountLimit: 32,
			EventCountLimit: 8, LinkCountLimit: 8, AttributePerEventCountLimit: 8, AttributePerLinkCountLimit: 4}),
	)...)
	otel.SetTracerProvider(t.provider)
	return t, nil
}

// Recording says whether spans are recorded: a provider is installed.
func (t *Tracing) Recording() bool { return t != nil && t.provider != nil }

// Shutdown flushes the spans still buffered to the exporter, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Recording() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// The demo's store is bounded both ways: a client chooses its trace ids
// (traceparent), so it could otherwise make the server keep one per request.
const (
	recentTraces  = 200 // traces kept, the oldest dropped first
	spansPerTrace = 64  // spans kept of one trace, the first ones
)

// RecentTraces, a span processor, keeps the spans of the latest traces in
// memory for the demo page's waterfall (GET /demo/traces).
type RecentTraces struct {
	maxTraces, maxSpans int

	mu     sync.Mutex
	traces map[trace.TraceID][]server.TraceSpan
	order  []trace.TraceID // oldest first: the ring of what is kept
}

// NewRecentTraces keeps up to maxSpans spans of each of the last maxTraces traces.
func NewRecentTraces(maxTraces, maxSpans int) *RecentTraces {
	return &RecentTraces{maxTraces: maxTraces, maxSpans: maxSpans, traces: make(map[trace.TraceID][]server.TraceSpan)}
}

// OnEnd keeps s, if its trace is still kept and not full.
func (r *RecentTraces) OnEnd(s sdktrace.ReadOnlySpan) {
	sc := s.SpanContext()
	span := server.TraceSpan{Name: s.Name(), SpanID: sc.SpanID().String(), Start: s.StartTime(), End: s.EndTime(),
		Attributes: make(map[string]any, len(s.Attributes())), Failed: s.Status().Code == codes.Error}
	if p := s.Parent(); p.IsValid() && p.TraceID() == sc.TraceID() {
		span.Parent = p.SpanID().String()
	}
	for _, kv := range s.Attributes() {
		span.Attributes[string(kv.Key)] = kv.Value.AsInterface()
	}
	for _, l := range s.Links() {
		span.Links = append(span.Links, l.SpanContext.TraceID().String())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := sc.TraceID()
	spans, ok := r.traces[id]
	if !ok {
		if len(r.order) >= r.maxTraces {
			delete(r.traces, r.order[0])
			r.order = r.order[1:]
		}
		r.order = append(r.order, id)
	}
	if len(spans) < r.maxSpans {
		r.traces[id] = append(spans, span)
	}
}

// Trace returns the kept spans of the trace id (32 hex digits), in the
// order they ended, or false if it is not kept.
func (r *RecentTraces) Trace(id string) ([]server.TraceSpan, bool) {
	tid, err := trace.TraceIDFromHex(id)
	if err != nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	spans, ok := r.traces[tid]
	return append([]server.TraceSpan(nil), spans...), ok
}

// A span is kept when it ends, and nothing is buffered.
func (r *RecentTraces) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (r *RecentTraces) Shutdown(context.Context) error                  { return nil }
func (r *RecentTraces) ForceFlush(context.Context) error                { return nil }
