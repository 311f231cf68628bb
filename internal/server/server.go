// Package server is the HTTP face of the service: the contract middleware,
// the handlers of the generated strict server interface, and the one error
// handler. Package app builds the domain services it is given (Deps).
package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
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
	Config     config.Server
	Pool       *pgxpool.Pool
	Log        *slog.Logger
	Keys       *idempotency.Store
	Operations *idempotency.Registry // every operation the spec marks keyed or tags declared (declaredRoutes)
	Inbox      *events.Inbox         // receives the processor's webhooks
	Demo       *Demo                 // the demo's own endpoints (DEMO_MODE); nil leaves them out
	Tracing    bool                  // spans are recorded; without it, no traceparent, no span
}

// Server implements the API.
type Server struct {
	cfg              config.Server
	pool             *pgxpool.Pool
	log              *slog.Logger
	auth             *auth.Authenticator
	keys             *idempotency.Store
	router           routers.Router
	routes           map[routeKey]*apiRoute // the router's answers, found once (routes.go)
	validation       openapi3filter.Options
	validationNoBody openapi3filter.Options // without the body: validateRequest checks it from its one decoding
	limits           *rateLimits
	inbox            *events.Inbox
	tracing          bool
}

var _ apigen.StrictServerInterface = (*Server)(nil)

// parsedSpec is the spec, parsed once for every server of the process (tests
// start hundreds, and parsing is most of a start's CPU): servers only read it.
var parsedSpec = sync.OnceValues(func() (*openapi3.T, error) {
	spec, err := api.Load()
	if err == nil {
		spec.Servers = nil // match on paths alone, whatever the host
	}
	return spec, err
})

// New returns the service's HTTP handler.
func New(d Deps) (http.Handler, error) {
	spec, err := parsedSpec()
	if err != nil {
		return nil, fmt.Errorf("load embedded spec: %w", err)
	}
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
			MultiError:          true,
			AuthenticationFunc:  openapi3filter.NoopAuthenticationFunc, // the contract authenticates
			SkipSettingDefaults: true,                                  // leave the request as sent: handlers apply defaults
		},
	}
	s.validationNoBody = s.validation
	s.validationNoBody.ExcludeRequestBody = true
	s.routes = newAPIRoutes(spec, router)
	declared, err := declaredRoutes(spec, d.Operations)
	if err != nil {
		return nil, err
	}
	refuseCrossOrigin, err := sameOrigin(d.Config.CORSAllowedOrigins)
	if err != nil {
		return nil, err
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.Recover(), s.observe, s.boundHeaders, refuseCrossOrigin)
	if d.Demo != nil {
		e.Use(ownHost(d.Config.HTTPAddr))
	}
	if origins := d.Config.CORSAllowedOrigins; len(origins) > 0 {
		e.Use(middleware.CORSWithConfig(middleware.CORSConfig{
			AllowOrigins:  origins,
			AllowHeaders:  []string{"Authorization", "Content-Type", "Idempotency-Key", requestIDHeader, "traceparent", "tracestate"},
			ExposeHeaders: []string{"Idempotent-Replayed", outcomeHeader, "Retry-After", "Location", requestIDHeader},
		}))
	}
	e.Use(s.contract)

	apigen.RegisterHandlers(e, apigen.NewStrictHandler(s, nil))
	for _, r := range declared {
		e.Add(r.method, r.path, s.declared(r.op))
	}
	if d.Demo != nil {
		s.registerDemo(e, d.Demo)
	}
	s.registerGuide(e) // the docs, rendered, for the demo page's links
	// Like /healthz, /metrics needs no API key and shows no tenant's data.
	// With METRICS_ADDR it is served there instead (cmd/server).
	if s.cfg.MetricsAddr == "" {
		e.GET("/metrics", echo.WrapHandler(metrics.Handler()))
	}
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", api.Spec) })
	e.GET("/*", echo.WrapHandler(http.FileServerFS(web.Files)))
	return e, nil
}

// outcomeHeader tells the client what the claim found (new, replayed,
// resumed, taken_over, in_progress, mismatch, dead), which the status
// hides. Never stored, so a replay says "replayed"; absent from an answer
// given before the claim (400, 401, 429...), which left the key untouched.
const outcomeHeader = "Idempotency-Outcome"

// observe is the outermost middleware but Recover: it starts the span,
// names the request (X-Request-Id: the client's if sane, else a new one),
// sets outcomeHeader, and once the answer is written counts it and logs
// one line. Never headers, bodies, API keys or card data, nor a key, which
// may mean something to the client: key_hash finds its lines, not its text.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if span := s.startSpan(c); span != nil {
			defer endSpan(c, span) // after the log line, which names the span
		}
		req := c.Request()
		id := requestIDFromClient(req.Header.Get(requestIDHeader))
		c.Response().Header().Set(requestIDHeader, id)
		ctx, outcome := idempotency.WithOutcome(context.WithValue(req.Context(), requestIDKey{}, id))
		c.SetRequest(req.WithContext(ctx))
		// Just before the status line, whoever writes it: by then the
		// claim, if the request reached it, has recorded its outcome.
		c.Response().Before(func() {
			if o := outcome(); o != "" {
				c.Response().Header().Set(outcomeHeader, o)
			}
		})

		if err := next(c); err != nil {
			c.Error(err) // write the response now, so the status below is final
		}

		req = c.Request() // as the inner middleware left it: with the caller and key
		// Every label is from a fixed set: route templates, methodLabel's, statuses.
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
		// A 5xx is the server's failure: a warning. The probes, the demo's
		// endpoints and, in demo mode, every answered read are debug: the
		// demo page polls them. (Without DEMO_MODE, every API request logs.)
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

// routeLabel is the route template Echo matched ("unmatched" for none),
// never the path: the name for metric labels, spans and the log line.
func routeLabel(c echo.Context) string { return cmp.Or(c.Path(), "unmatched") }

// GetHealthz reports that the process is up, and touches nothing else: a
// slow database must not get a healthy process restarted.
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

// apiList is rows in the API's shape: never nil, so an empty page is [].
func apiList[R interface{ API() A }, A any](rows []R) []A {
	out := make([]A, len(rows))
	for i, r := range rows {
		out[i] = r.API()
	}
	return out
}
