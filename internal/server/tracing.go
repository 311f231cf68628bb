package server

import (
	"strings"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracer makes the span of each request. Like every package's, it is the
// global API's: the process decides (internal/app, SetupTracing) whether
// spans are recorded and where they go.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/server")

// startSpan starts the request's span, the parent of everything the
// request does (the claim, the phases, the processor call), continuing the
// client's trace when it sent a W3C traceparent header, and returns it for
// endSpan; or nil, when there is nothing to record. observe calls it first
// thing, so that the request's log line carries the span's trace_id and
// span_id (LogHandler).
//
// The span's name is the route template, never the path: a path carries
// ids, and names must come from a fixed set. It records no header, no
// query and no body.
//
// With tracing off (no provider set), a request without traceparent costs
// one map look-up and nothing else: no allocation (TestTracingOffAllocatesNothing).
// That is why this is a function observe calls and not a middleware of its
// own (Echo builds every middleware's closure again for each request), and
// why it reads the header map directly: net/http has already canonicalised
// the names, and Header.Get("traceparent") would canonicalise the key again,
// an allocation per request. A request with a traceparent gets the no-op
// tracer's span: the client's span context, carried along so that logs
// still name the client's trace, and nothing is recorded.
func (s *Server) startSpan(c echo.Context) trace.Span {
	req := c.Request()
	if !s.tracing && len(req.Header["Traceparent"]) == 0 {
		return nil // nothing to record, no trace to carry
	}
	ctx := otel.GetTextMapPropagator().Extract(req.Context(), propagation.HeaderCarrier(req.Header))
	route := routeLabel(c)
	if !traced(route) {
		c.SetRequest(req.WithContext(ctx))
		return nil
	}
	ctx, span := tracer.Start(ctx, methodLabel(req.Method)+" "+route, trace.WithSpanKind(trace.SpanKindServer))
	c.SetRequest(req.WithContext(ctx))
	return span
}

// endSpan records the answer's status on the request's span and ends it.
func endSpan(c echo.Context, span trace.Span) {
	if span.IsRecording() {
		status := c.Response().Status
		span.SetAttributes(semconv.HTTPRequestMethodKey.String(methodLabel(c.Request().Method)), semconv.HTTPRoute(routeLabel(c)),
			semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, "")
		}
	}
	span.End()
}

// traced says which routes get a span: the API's and the webhooks' (the
// processor's, and the relay's deliveries to the demo receiver). Not the
// page, the docs, the probes, /metrics or the demo's own endpoints: the
// demo page polls those, and each poll would be a trace of nothing that
// pushed a charge's trace out of the demo's store.
func traced(route string) bool {
	return strings.HasPrefix(route, "/v1/") || strings.HasPrefix(route, "/webhooks/") || strings.HasPrefix(route, "/demo/webhooks/")
}
