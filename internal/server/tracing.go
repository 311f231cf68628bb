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

// tracer is the global API's, like every package's: internal/app
// (SetupTracing) decides whether spans are recorded and where they go.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/server")

// startSpan starts the request's span (named by route template, never the
// path; no header, query or body), continuing a client's traceparent, for
// endSpan; nil when there is nothing to record. observe calls it first, so
// its log line carries the span's ids. With tracing off and no traceparent
// it costs one map look-up, no allocation (TestTracingOffAllocatesNothing):
// hence a function, not a middleware (whose closure Echo builds per
// request), and no Header.Get (which canonicalises the key). With one, the
// no-op tracer carries the trace.
func (s *Server) startSpan(c echo.Context) trace.Span {
	req := c.Request()
	if !s.tracing && len(req.Header["Traceparent"]) == 0 {
		return nil // nothing to record, no trace to carry
	}
	ctx := otel.GetTextMapPropagator().Extract(req.Context(), propagation.HeaderCarrier(req.Header))
	var span trace.Span
	if route := routeLabel(c); traced(route) {
		ctx, span = tracer.Start(ctx, methodLabel(req.Method)+" "+route, trace.WithSpanKind(trace.SpanKindServer))
	}
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

// traced says which routes get a span: the API's and the webhooks'. Not
// the page, docs, probes, /metrics or the demo's endpoints: the page polls
// those, and each empty trace would push a charge's out of the demo's store.
func traced(route string) bool {
	return strings.HasPrefix(route, "/v1/") || strings.HasPrefix(route, "/webhooks/") || strings.HasPrefix(route, "/demo/webhooks/")
}
