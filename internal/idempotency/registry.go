package idempotency

import "fmt"

// Registry maps each operation with an external effect to the one Handler
// that drives it from any recovery point. The request path runs that
// handler for a fresh claim or a client's takeover; the reconciler runs the
// same handler for a record nobody is finishing. So an operation's phases
// live in one place whoever drives them, as in rocket-rides' completer,
// which re-enters the API's own code path.
//
// A local operation (createOrder, run by ExecuteLocal) needs no entry: its
// record is written completed, with its effect, or not at all. (A record
// that never passed started, of any operation, is abandoned.)
//
// A registered Handler resumes with only what the record and the rows its
// earlier phases wrote can tell it: the request's body is not stored, so
// every phase after the first reads what it needs from its own rows.
type Registry struct {
	resumers map[string]Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{resumers: map[string]Handler{}} }

// Register names the handler that resumes operation. Registering an
// operation twice is a wiring mistake and panics at start-up, not at the
// first crash.
func (r *Registry) Register(operation string, resume Handler) {
	if _, dup := r.resumers[operation]; dup {
		panic(fmt.Sprintf("idempotency: operation %q registered twice", operation))
	}
	r.resumers[operation] = resume
}

// Lookup returns the handler that resumes operation.
func (r *Registry) Lookup(operation string) (Handler, bool) {
	h, ok := r.resumers[operation]
	return h, ok
}

// Operations lists the registered operations.
func (r *Registry) Operations() []string {
	ops := make([]string, 0, len(r.resumers))
	for op := range r.resumers {
		ops = append(ops, op)
	}
	return ops
}
