package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/problem"
)

// Demo is what the browser demo's own endpoints need. Not part of the
// contract, they exist only with DEMO_MODE (Deps.Demo not nil): they let
// anyone crash the server and make the processor fail.
//
//	GET  /demo/chaos        the fake processor's chaos settings
//	PUT  /demo/chaos        replace them ({"error_rate": 0.5, "latency_ms": 200, "timeout_rate": 0.1, ...})
//	GET  /demo/crash        the crash point armed for the next pass, if any, and when this process started
//	PUT  /demo/crash        arm one: {"point": "after_processor_call"}; "" disarms
//	GET  /demo/ledger       every effect the processor performed, with its downstream key
//	GET  /demo/deliveries   what the demo receiver got: ?caller=acme, each event with its delivery count
//	GET  /demo/traces       the spans of one recent trace: ?trace_id=<32 hex digits> (see TraceSpan)
type Demo struct {
	Crash        CrashPoints // armed by PUT /demo/crash
	ProcessorURL string      // the fake processor, whose admin and ledger the demo shows
	StartedAt    time.Time   // when this process started: a change shows the page a restart
	// Traces returns the spans kept of a recent trace (by its 32 hex digit
	// id), for the page's waterfall; nil, or false, when it has none.
	Traces func(traceID string) ([]TraceSpan, bool)
}

// TraceSpan is one span as GET /demo/traces shows it, for the waterfall.
type TraceSpan struct {
	Name   string `json:"name"`
	SpanID string `json:"span_id"`
	// Parent is the parent's id in this trace; "" for the trace's root
	// here (whose parent, if any, is the client's span).
	Parent     string         `json:"parent_span_id,omitempty"`
	Start      time.Time      `json:"start"`
	End        time.Time      `json:"end"`
	Attributes map[string]any `json:"attributes"`
	Failed     bool           `json:"failed,omitempty"` // its status is an error
	// Links are the ids of the traces this one is linked to: for a
	// background job's, the request's that started the work.
	Links []string `json:"links,omitempty"`
}

// CrashPoints are the places where the server can be made to kill itself
// (see internal/app).
type CrashPoints interface {
	Arm(point string) error // crash the next execution that passes point, once; "" disarms
	Armed() string          // the point armed, or ""
	Points() []string       // all of them
}

func (s *Server) registerDemo(e *echo.Echo, d *Demo) {
	e.POST("/demo/webhooks/:caller", s.demoReceiver)
	client := &http.Client{Timeout: 5 * time.Second}
	forward := func(method, path string) echo.HandlerFunc {
		return func(c echo.Context) error {
			req, err := http.NewRequestWithContext(c.Request().Context(), method, d.ProcessorURL+path, c.Request().Body)
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				p := problem.New(problem.ServiceUnavailable, "the card processor did not answer: %v", err)
				p.RetryAfter = 1
				return p
			}
			defer res.Body.Close()
			body, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
			if err != nil {
				return err
			}
			return c.Blob(res.StatusCode, res.Header.Get("Content-Type"), body)
		}
	}
	e.GET("/demo/chaos", forward(http.MethodGet, "/admin/chaos"))
	e.PUT("/demo/chaos", forward(http.MethodPut, "/admin/chaos"))
	e.GET("/demo/ledger", forward(http.MethodGet, "/v1/ledger"))

	e.GET("/demo/crash", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]any{"armed": d.Crash.Armed(), "points": d.Crash.Points(), "started_at": d.StartedAt})
	})
	e.PUT("/demo/crash", func(c echo.Context) error {
		var body struct {
			Point string `json:"point"`
		}
		dec := json.NewDecoder(io.LimitReader(c.Request().Body, 1<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			return problem.New(problem.InvalidRequest, "want {\"point\": \"<crash point>\"}: %v", err)
		}
		if err := d.Crash.Arm(body.Point); err != nil {
			return problem.New(problem.InvalidRequest, "%v", err)
		}
		s.log.WarnContext(c.Request().Context(), "demo: crash point armed", "point", body.Point)
		return c.JSON(http.StatusOK, map[string]any{"armed": body.Point, "points": d.Crash.Points()})
	})

	e.GET("/demo/traces", func(c echo.Context) error {
		id := c.QueryParam("trace_id")
		var spans []TraceSpan
		var ok bool
		if d.Traces != nil {
			spans, ok = d.Traces(id)
		}
		if !ok {
			return problem.New(problem.NotFound, "no recent trace with trace_id %.32q is kept here (the demo keeps the latest few hundred)", id)
		}
		return c.JSON(http.StatusOK, map[string]any{"trace_id": id, "spans": spans})
	})

	e.GET("/demo/deliveries", func(c echo.Context) error {
		limit := 50
		if v, err := strconv.Atoi(c.QueryParam("limit")); err == nil && v >= 1 && v <= 500 {
			limit = v
		}
		rows, err := events.ListDemoDeliveries(c.Request().Context(), s.pool, c.QueryParam("caller"), int32(limit)) // #nosec G115 -- limit is 1 to 500
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"data": rows})
	})
}
