package idempotency

import "context"

type requestKey struct{}

// WithRequest returns ctx carrying the keyed request, as parsed by the HTTP
// layer before the handler runs.
func WithRequest(ctx context.Context, r Request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// RequestFrom returns the keyed request carried by ctx.
func RequestFrom(ctx context.Context) (Request, bool) {
	r, ok := ctx.Value(requestKey{}).(Request)
	return r, ok
}
