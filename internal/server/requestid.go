package server

// Each HTTP request is named, so that every log line it causes (the request
// line, a warning deep in the idempotency layer, an error) can be found
// together, and a client can quote the id from its X-Request-Id response
// header to support.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// requestIDHeader carries the id, in both directions.
const requestIDHeader = "X-Request-Id"

type requestIDKey struct{}

// withRequestID returns ctx carrying the request id.
func withRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestIDFrom returns the request id ctx carries, or "".
func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// requestIDFromClient returns the id a client sent if it is one worth keeping (1 to
// 128 characters of letters, digits, '-', '_', '.', so that it can neither
// flood nor forge a log line), else a new one: 16 random bytes, in hex.
func requestIDFromClient(sent string) string {
	if len(sent) >= 1 && len(sent) <= 128 {
		ok := true
		for _, r := range sent {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
				ok = false
				break
			}
		}
		if ok {
			return sent
		}
	}
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// LogHandler wraps h so that every record logged with a context carrying
// a request id gets a request_id attribute, and one carrying a span (a
// request's, or a client's traceparent) its trace_id and span_id.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := requestIDFrom(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	// The trace the line belongs to: the request's span, or a background
	// job's, so that a line leads to its trace and a trace to its lines.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}
func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
