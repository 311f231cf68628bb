package postgres

// Errors are named where they leave the storage layer. Exported functions
// that reach the database or another service start with
//
//	defer Wrap(&err, "orders.Get(%q)", id)
//
// so that an unexpected error, logged once at the edge, says which
// operation it came from ("orders.Get(\"ord_…\"): conn closed") instead of
// the driver's bare words. It wraps with %w, so errors.Is and errors.As see
// through it: a *problem.Error is still answered as itself. (pkgsite's
// internal/derrors does the same.)

import "fmt"

// Wrap adds "<op>: " in front of *errp when it is not nil.
func Wrap(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), *errp)
	}
}
