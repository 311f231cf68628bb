package server

// Each HTTP request is named, so that every log line it causes can be
// found together, and a client can quote its X-Request-Id to support.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// requestIDHeader carries the id, in both directions.
const requestIDHeader = "X-Request-Id"

type requestIDKey struct{}

// requestIDFromClient returns the id a client sent if it is worth keeping
// (1 to 128 letters, digits, '-', '_', '.': it can neither flood nor forge
// a log line), else a new one: 16 random bytes, in hex.
func requestIDFromClient(sent string) string {
	bad := func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}
	if len(sent) >= 1 && len(sent) <= 128 && !strings.ContainsFunc(sent, bad) {
		return sent
	}
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// LogHandler wraps h to add to each record the request_id, trace_id and
// span_id its context carries.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, _ := ctx.Value(requestIDKey{}).(string); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	// The request's or a job's span: a line leads to its trace, and back.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}
func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
