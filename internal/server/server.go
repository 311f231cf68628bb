// Package server is the HTTP face of the service: the contract middleware,
// the handlers that implement the generated strict server interface, and the
// one error handler. It builds nothing but HTTP: package app builds the
// domain services it is given (Deps), and runs the background workers.
package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/retrysafe/payments/api"
	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/web"
)

// Deps is what the API needs, built by package app.
type Deps struct {
	Config config.Server
	Pool   *pgxpool.Pool
	Log    *slog.Logger
	Keys   *idempotency.Store
	// Operations are the declared keyed operations: every one the spec
	// marks keyed must be there (declaredKeyed).
	Operations *idempotency.Registry
	// Inbox receives the processor's webhooks.
	Inbox *events.Inbox
	// Demo turns on the browser demo's own endpoints (DEMO_MODE); nil, as
	// everywhere but `make run`, leaves them out.
	Demo *Demo
	// Tracing says that spans are recorded (a tracer provider is
	// installed). Without it, a request that carries no traceparent gets
	// no span at all: tracing off costs nothing.
	Tracing bool
}

// Server implements the API.
type Server struct {
	cfg        config.Server
	pool       *pgxpool.Pool
	log        *slog.Logger
	auth       *auth.Authenticator
	keys       *idempotency.Store
	router     routers.Router
	routes     map[routeKey]*apiRoute // the router's answers, found once (routes.go)
	validation openapi3filter.Options
	// validationNoBody is validation without the body, which
	// validateRequest checks from the body decoded once.
	validationNoBody openapi3filter.Options
	limits           *rateLimits
	inbox            *events.Inbox
	tracing          bool
}

var _ apigen.StrictServerInterface = (*Server)(nil)

// New returns the service's HTTP handler.
func New(d Deps) (http.Handler, error) {
	spec, err := api.Load()
	if err != nil {
		return nil, fmt.Errorf("load embedded spec: %w", err)
	}
	// Match operations on their paths alone, whatever host the service is
	// reached by.
	spec.Servers = nil
	router, err := gorillamux.NewRouter(spec)
	if err != nil {
		return nil, fmt.Errorf("route spec: %w", err)
	}
	s := &Server{
		cfg:     d.Config,
		pool:    d.Pool,
		log:     d.Log,
		auth:    auth.NewAuthenticator(d.Pool, d.Config.AuthCacheTTL, d.Config.SeedDemoCallers),
		keys:    d.Keys,
		router:  router,
		limits:  newRateLimits(d.Config.RateLimit, d.Config.RateBurst),
		inbox:   d.Inbox,
		tracing: d.Tracing,
		validation: openapi3filter.Options{
			MultiError: true,
			// Authentication already happened, in the contract middleware.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			// Leave the request as the client sent it; handlers apply defaults.
			SkipSettingDefaults: true,
		},
	}
	s.validationNoBody = s.validation
	s.validationNoBody.ExcludeRequestBody = true
	s.routes = newAPIRoutes(spec, router)
	keyedRoutes, err := declaredKeyed(spec, d.Operations)
	if err != nil {
		return nil, err
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.Recover())
	e.Use(s.observe)
	e.Use(s.boundHeaders)
	refuseCrossOrigin, err := sameOrigin(d.Config.CORSAllowedOrigins)
	if err != nil {
		return nil, err
	}
	e.Use(refuseCrossOrigin)
	if origins := d.Config.CORSAllowedOrigins; len(origins) > 0 {
		e.Use(middleware.CORSWithConfig(middleware.CORSConfig{
			AllowOrigins:  origins,
			AllowHeaders:  []string{"Authorization", "Content-Type", "Idempotency-Key", requestIDHeader, "traceparent", "tracestate"},
			ExposeHeaders: []string{"Idempotent-Replayed", outcomeHeader, "Retry-After", "Location", requestIDHeader},
		}))
	}
	e.Use(s.contract)

	apigen.RegisterHandlers(e, apigen.NewStrictHandler(s, nil))
	for _, r := range keyedRoutes {
		e.Add(r.method, r.path, s.keyed(r.op))
	}
	if d.Demo != nil {
		e.POST("/demo/webhooks/:caller", s.demoReceiver)
		s.registerDemo(e, d.Demo)
	}
	// The project's docs, rendered, for the demo page's links (guide.go).
	s.registerGuide(e)
	// Prometheus scrapes this; like /healthz it needs no API key (see
	// the contract middleware), and shows no tenant's data. With
	// METRICS_ADDR it is served there instead (cmd/server).
	if s.cfg.MetricsAddr == "" {
		e.GET("/metrics", echo.WrapHandler(metrics.Handler()))
	}
	e.GET("/openapi.yaml", func(c echo.Context) error {
		return c.Blob(http.StatusOK, "application/yaml", api.Spec)
	})
	e.GET("/*", echo.WrapHandler(http.FileServerFS(web.Files)))
	return e, nil
}

func decodeJSON(b []byte, v any) error { return json.Unmarshal(b, v) }

// outcomeHeader tells the client what the idempotency layer did with its
// key: the claim's outcome (new, replayed, resumed, taken_over,
// in_progress, mismatch, dead), the same word as the request log and the
// payments_idempotency_outcomes_total metric. A client, or the demo page,
// can then show a takeover or a resumption that the status alone hides
// (a 201 is a 201 whoever finished the work).
//
// It is set by observe on the way out and is never part of a stored
// response (it is not in the idempotency layer's allow-list of stored
// headers), so a replay says "replayed", not what the first answer said.
// An answer given before the claim (a 400, 401, 404, 429...) has none: it
// left the key untouched.
const outcomeHeader = "Idempotency-Outcome"

// observe is the outermost middleware but Recover: it starts the request's
// span (startSpan), names the request (X-Request-Id, the client's if it sent a sane one, else a new one, and
// returned either way), tells a keyed request's client what its claim
// found (outcomeHeader), and once the answer is written it counts it
// (metrics) and logs one line: the request id, the caller, the route, the
// status, the duration, and what the idempotency layer did with its key.
//
// It never logs headers, bodies, API keys or card data, and never an
// Idempotency-Key in full: a key is the client's name for an operation and
// may mean something to it, so the line carries a short hash of it
// (key_hash), enough to find the lines of one key, not to read it.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if span := s.startSpan(c); span != nil {
			defer endSpan(c, span) // after the log line, which names the span
		}
		req := c.Request()
		id := requestIDFromClient(req.Header.Get(requestIDHeader))
		c.Response().Header().Set(requestIDHeader, id)
		ctx, outcome := idempotency.WithOutcome(withRequestID(req.Context(), id))
		c.SetRequest(req.WithContext(ctx))
		// Just before the status line is written, whoever writes it (a
		// handler, a replay, the error handler): by then the claim, if
		// the request reached it, has recorded its outcome.
		c.Response().Before(func() {
			if o := outcome(); o != "" {
				c.Response().Header().Set(outcomeHeader, o)
			}
		})

		if err := next(c); err != nil {
			c.Error(err) // write the response now, so the status below is final
		}

		req = c.Request() // as the inner middleware left it: with the caller and key
		// Every label comes from a fixed set: the route templates this
		// server registered, the methods methodLabel knows, the statuses
		// it writes.
		route := routeLabel(c)
		method := methodLabel(req.Method)
		status := c.Response().Status
		elapsed := time.Since(start)
		metrics.HTTPRequests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		metrics.HTTPDuration.WithLabelValues(route, method).Observe(elapsed.Seconds())
		if (status == http.StatusConflict || status == http.StatusServiceUnavailable) && c.Response().Header().Get("Retry-After") != "" {
			metrics.RetryHints.WithLabelValues(strconv.Itoa(status)).Inc()
		}

		attrs := []slog.Attr{
			slog.String("method", method),
			slog.String("route", route),
			slog.Int("status", status),
			slog.Duration("duration", elapsed),
		}
		if caller, ok := auth.CallerOf(req.Context()); ok {
			attrs = append(attrs, slog.String("caller", caller.ID))
		}
		if keyed, ok := idempotency.RequestFrom(req.Context()); ok {
			attrs = append(attrs, slog.String("key_hash", idempotency.KeyHash(keyed.CallerID, keyed.Key)))
		}
		if o := outcome(); o != "" {
			attrs = append(attrs, slog.String("idempotency", o))
		}
		// A 5xx is the server's failure, not the client's: a warning. The
		// health checks, the demo's own endpoints and, in demo mode, every
		// answered read are debug: the demo page polls them, and with a
		// tab open they would be most of the terminal. (Production logs
		// every API request: DEMO_MODE is never on there.)
		level := slog.LevelInfo
		switch {
		case status >= 500:
			level = slog.LevelWarn
		case strings.HasPrefix(route, "/demo/"),
			status < 400 && method == http.MethodGet && (route == "/healthz" || route == "/readyz" || s.cfg.DemoMode):
			level = slog.LevelDebug
		}
		s.log.LogAttrs(req.Context(), level, "request", attrs...)
		return nil
	}
}

// routeLabel is the route template Echo matched for c ("unmatched" for
// none): a name from the fixed set this server registered, never the path,
// for metric labels, span names and the log line alike.
func routeLabel(c echo.Context) string {
	if route := c.Path(); route != "" {
		return route
	}
	return "unmatched"
}

// GetHealthz reports that the process is up. It touches nothing else, so
// an orchestrator does not restart a healthy process because of a slow
// database.
func (s *Server) GetHealthz(context.Context, apigen.GetHealthzRequestObject) (apigen.GetHealthzResponseObject, error) {
	return apigen.GetHealthz200JSONResponse{Status: "ok"}, nil
}

// GetReadyz reports whether the service can serve: the database answers.
func (s *Server) GetReadyz(ctx context.Context, _ apigen.GetReadyzRequestObject) (apigen.GetReadyzResponseObject, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		s.log.WarnContext(ctx, "readiness: database unreachable", "err", err)
		p := problem.New(problem.ServiceUnavailable, "the database is not reachable")
		p.RetryAfter = 1
		return nil, p
	}
	return apigen.GetReadyz200JSONResponse{Status: "ok"}, nil
}

// page reads the list parameters: limit defaults to 10 (the contract's
// default, which the validator does not fill in) and no cursor is "".
func page(limit *int, startingAfter *string) (int, string) {
	l, s := 10, ""
	if limit != nil {
		l = *limit
	}
	if startingAfter != nil {
		s = *startingAfter
	}
	return l, s
}
