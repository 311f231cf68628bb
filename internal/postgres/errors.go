package postgres

// Errors are named where they leave the storage layer. Exported functions
// that reach the database or another service start with
//
//	defer Wrap(&err, "orders.Get(%q)", id)
//
// so that an unexpected error, logged once at the edge, says which operation
// it came from ("orders.Get(\"ord_…\"): conn closed"). It wraps with %w:
// errors.Is and errors.As see through it, and a *problem.Error is still
// answered as itself.

import "fmt"

// Wrap adds "<op>: " in front of *errp when it is not nil.
func Wrap(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), *errp)
	}
}
