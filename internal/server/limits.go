package server

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/retrysafe/payments/internal/problem"
)

// Abuse limits bound what one client can make this process spend, before
// it is spent: here headers, requests per caller and metric labels;
// bodies in readBody and checkJSON.

// boundHeaders refuses, before anything reads them, a request with more
// header lines than the limit, and a request framed by Transfer-Encoding:
// with a Content-Length too, that is request smuggling's tool (a proxy
// framing by one and this server by the other disagree on where the next
// request starts). net/http hides the Content-Length from a handler, and a
// JSON body of at most 64 KiB never needs chunks: so every such request is
// a 400, and its connection closed (RFC 9112 §6.1).
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

// sameOrigin refuses (403, before anything is read) a browser's request
// from a page of another origin than ours or CORS_ALLOWED_ORIGINS': any
// state-changing one, and any under /demo/. An API key is no defence: the
// demo's keys are published, and its endpoints take none. A client that is
// not a browser sends neither Sec-Fetch-Site nor Origin, and passes.
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

// ownHost refuses (403) a demo request for another host: a page whose name was rebound
// to 127.0.0.1 is same-origin. Any IP (it cannot be rebound), localhost and HTTP_ADDR's host pass.
func ownHost(httpAddr string) echo.MiddlewareFunc {
	configured, _, _ := net.SplitHostPort(httpAddr)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			host := c.Request().Host
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
			if _, err := netip.ParseAddr(host); err != nil && !strings.EqualFold(host, "localhost") && !strings.EqualFold(host, configured) {
				return problem.New(problem.CrossOrigin, "the demo answers only for localhost, an IP address or HTTP_ADDR's host, not %q", host)
			}
			return next(c)
		}
	}
}

// rateLimits gives each caller a token bucket: rate requests a second, in
// bursts of up to burst. Per process, so n replicas allow n times the rate
// (a shared limit would cost a round trip per request). Callers are
// authenticated first, so no client can grow the map.
type rateLimits struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// newRateLimits returns nil (no limit) when perSecond is 0.
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

// methodLabel is a request's method as a metric label or log field: a
// standard method, or "other", since a client can send any token (8 KB
// methods, each a new time series, once grew /metrics to 700 MB).
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}
