// Package requestid names each HTTP request, so that every log line it
// causes (the request line, a warning deep in the idempotency layer, an
// error) can be found together, and a client can quote the id from its
// X-Request-Id response header to support.
package requestid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// Header carries the id, in both directions.
const Header = "X-Request-Id"

type key struct{}

// With returns ctx carrying the request id.
func With(ctx context.Context, id string) context.Context { return context.WithValue(ctx, key{}, id) }

// From returns the request id ctx carries, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}

// FromClient returns the id a client sent if it is one worth keeping (1 to
// 128 characters of letters, digits, '-', '_', '.', so that it can neither
// flood nor forge a log line), else a new one: 16 random bytes, in hex.
func FromClient(sent string) string {
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

// Handler wraps h so that every record logged with a context carrying a
// request id gets a request_id attribute.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ slog.Handler }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return handler{h.Handler.WithAttrs(attrs)}
}
func (h handler) WithGroup(name string) slog.Handler { return handler{h.Handler.WithGroup(name)} }
