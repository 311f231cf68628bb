package server

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/retrysafe/payments/internal/problem"
)

// Abuse limits: what one client can make this process spend is bounded
// before it is spent. Bodies are bounded in readBody (size) and checkJSON
// (depth, one linear pass); headers here, by count (their size in bytes is
// http.Server.MaxHeaderBytes); requests per caller by a token bucket; and
// metric labels take their values from fixed sets (methodLabel), never
// from what a client sent.

// boundHeaders refuses a request with more header lines than the
// configured limit, before anything reads them, and a request framed by
// Transfer-Encoding.
//
// Sent with a Content-Length too, a Transfer-Encoding is request
// smuggling's tool: a proxy that frames the body by one and this server by
// the other disagree on where the next request starts. net/http frames it
// by Transfer-Encoding and drops the Content-Length before a handler can
// see it, so the two cannot be told apart here; and a JSON body of at most
// 64 KiB never needs chunks. So every such request is a 400, and its
// connection is closed (RFC 9112 §6.1), whatever was pipelined behind it.
func (s *Server) boundHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if te := c.Request().TransferEncoding; len(te) > 0 {
			c.Response().Header().Set(echo.HeaderConnection, "close")
			return problem.New(problem.InvalidRequest, "a body sent with Transfer-Encoding: %s is refused; send it with a Content-Length", te[0])
		}
		lines := 0
		for _, values := range c.Request().Header {
			lines += len(values)
		}
		if lines > s.cfg.MaxHeaders {
			return problem.New(problem.HeadersTooLarge, "the request has %d header lines; the limit is %d", lines, s.cfg.MaxHeaders)
		}
		return next(c)
	}
}

// sameOrigin refuses, with a 403 and before anything is read, a request a
// browser sent from a page of another origin than the server's own (or
// than allowed, CORS_ALLOWED_ORIGINS): any state-changing one, and any
// under /demo/. An API key is no defence against such a page: the demo's
// keys are published, and the demo's own endpoints take none. Go's
// http.CrossOriginProtection tells them apart by Sec-Fetch-Site, or Origin
// against Host; a client that is not a browser sends neither, and passes.
func sameOrigin(allowed []string) (echo.MiddlewareFunc, error) {
	protect := http.NewCrossOriginProtection()
	for _, o := range allowed {
		if err := protect.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("CORS_ALLOWED_ORIGINS: %w", err)
		}
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			if strings.HasPrefix(req.URL.Path, "/demo/") {
				// Even a read: the demo's GETs show every caller's data.
				asWrite := *req
				asWrite.Method = http.MethodPost
				req = &asWrite
			}
			if err := protect.Check(req); err != nil {
				return problem.New(problem.CrossOrigin, "a browser page of another origin may not send this request (%v)", err)
			}
			return next(c)
		}
	}, nil
}

// rateLimits gives each caller a token bucket: rate requests a second, in
// bursts of up to burst. The buckets are per process, so n replicas let a
// caller send up to n times the rate; a limit shared by every replica
// would cost a database or cache round trip on every request. There is one
// bucket per caller, and callers are authenticated first, so the map is as
// big as the callers table and no client can grow it.
type rateLimits struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// newRateLimits returns the limits, or nil (no limit) when perSecond is 0.
func newRateLimits(perSecond float64, burst int) *rateLimits {
	if perSecond <= 0 {
		return nil
	}
	return &rateLimits{rate: rate.Limit(perSecond), burst: burst, buckets: map[string]*rate.Limiter{}}
}

// allow takes a token from caller's bucket, or returns the 429 that tells
// it when one will be there. A refused request takes no token.
func (l *rateLimits) allow(caller string) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	b := l.buckets[caller]
	if b == nil {
		b = rate.NewLimiter(l.rate, l.burst)
		l.buckets[caller] = b
	}
	l.mu.Unlock()
	r := b.Reserve()
	wait := r.Delay()
	if wait == 0 {
		return nil
	}
	r.Cancel()
	p := problem.New(problem.RateLimited,
		"this API key sent more than %g requests per second (bursts of %d); retry after the Retry-After delay", float64(l.rate), l.burst)
	p.RetryAfter = max(1, int(math.Ceil(wait.Seconds())))
	return p
}

// methodLabel is a request's method as a metric label or a log field: one
// of the methods HTTP defines for an API like this one, or "other". A
// client can send any token as a method; used as it came, each new one
// would be a new time series (thousands of 8 KB methods once grew
// /metrics to 700 MB).
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}
