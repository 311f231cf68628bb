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

// trace starts the request's span, the parent of everything the request
// does (the claim, the phases, the processor call), continuing the
// client's trace when it sent a W3C traceparent header. It runs inside
// Recover and outside observe, so that the request's log line, written
// by observe, carries the span's trace_id and span_id (LogHandler).
//
// The span's name is the route template, never the path: a path carries
// ids, and names must come from a fixed set. It records no header, no
// query and no body.
//
// With tracing off (no provider set), a request without traceparent is
// passed straight on. One with it gets the no-op tracer's span: the
// client's span context, carried along so that logs still name the
// client's trace, and nothing is recorded.
func (s *Server) trace(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if !s.tracing && req.Header.Get("traceparent") == "" {
			return next(c) // nothing to record, no trace to carry
		}
		ctx := otel.GetTextMapPropagator().Extract(req.Context(), propagation.HeaderCarrier(req.Header))
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		if !traced(route) {
			c.SetRequest(req.WithContext(ctx))
			return next(c)
		}
		method := methodLabel(req.Method)
		ctx, span := tracer.Start(ctx, method+" "+route, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		c.SetRequest(req.WithContext(ctx))
		err := next(c)
		if span.IsRecording() {
			status := c.Response().Status
			span.SetAttributes(semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRoute(route),
				semconv.HTTPResponseStatusCode(status))
			if status >= 500 {
				span.SetStatus(codes.Error, "")
			}
		}
		return err
	}
}

// traced says which routes get a span: the API's and the webhooks' (the
// processor's, and the relay's deliveries to the demo receiver). Not the
// page, the docs, the probes, /metrics or the demo's own endpoints: the
// demo page polls those, and each poll would be a trace of nothing that
// pushed a charge's trace out of the demo's store.
func traced(route string) bool {
	return strings.HasPrefix(route, "/v1/") || strings.HasPrefix(route, "/webhooks/") || strings.HasPrefix(route, "/demo/webhooks/")
}
