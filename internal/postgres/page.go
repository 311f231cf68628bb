package postgres

import (
	"time"

	"github.com/retrysafe/payments/internal/problem"
)

// Every list is cut into pages by keyset pagination: a page starts strictly
// after the (created_at, id) of the row the client names in starting_after,
// in the list's own order (its query's ORDER BY). That row is looked up
// first (an unknown cursor is an error, not an empty page), and one row more
// than the page is asked for: its presence is has_more.

// A Cursor is where a page starts; the first page has none (Set false).
type Cursor struct {
	Set       bool
	CreatedAt time.Time
	ID        string
}

// Page returns up to limit rows (1 to 100, checked against the contract)
// after the row startingAfter names, converted by conv, and whether more
// exist. find reads the cursor's row; one it does not find is a 400 that
// says there is no such what ("order of yours"). list reads up to rowLimit
// rows after the cursor.
func Page[R, T any](limit int, startingAfter, what string,
	find func(id string) (Cursor, error), list func(c Cursor, rowLimit int32) ([]R, error), conv func(R) T) ([]T, bool, error) {
	var c Cursor
	if startingAfter != "" {
		var err error
		c, err = find(startingAfter)
		if IsNotFound(err) {
			e := problem.New(problem.InvalidRequest, "starting_after names no %s", what)
			e.Errors = []problem.FieldError{{Field: "starting_after", Message: "no such " + what}}
			return nil, false, e
		}
		if err != nil {
			return nil, false, err
		}
		c.Set = true
	}
	rows, err := list(c, int32(limit)+1) // #nosec G115 -- limit is 1 to 100
	if err != nil {
		return nil, false, err
	}
	out := make([]T, min(len(rows), limit))
	for i := range out {
		out[i] = conv(rows[i])
	}
	return out, len(rows) > limit, nil
}
