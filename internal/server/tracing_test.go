package server

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// With tracing off, a request that carries no traceparent must cost the
// tracing code nothing: no span, no context, no allocation. (The spans'
// own tests are in internal/app, against the real server.)
func TestTracingOffAllocatesNothing(t *testing.T) {
	s := &Server{tracing: false}
	e := echo.New()
	req := httptest.NewRequest(http.MethodPost, "/v1/orders", nil)
	req.Header.Set("Idempotency-Key", "k-1")
	c := e.NewContext(req, httptest.NewRecorder())
	c.SetPath("/v1/orders")

	allocs := testing.AllocsPerRun(100, func() {
		if span := s.startSpan(c); span != nil {
			t.Fatal("tracing is off and no traceparent was sent, yet a span was started")
		}
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per request, want 0", allocs)
	}
	if c.Request() != req {
		t.Error("tracing off: the request was replaced (a new context), want it untouched")
	}

	// The same request with a traceparent is carried on (the client's
	// trace, for the logs), which is the one case that may allocate. The
	// propagator is the one internal/app installs in every process.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	span := s.startSpan(c)
	if span == nil {
		t.Fatal("a traceparent was sent: want the client's span carried on")
	}
	if got := span.SpanContext().TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("carried trace %s, want the client's", got)
	}
}
