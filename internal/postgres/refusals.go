package postgres

import (
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/problem"
)

// A refusal is the database saying no to the caller's request: a unique or
// check constraint (an order that already has a live charge), or an error a
// function of ours raises (a debit the balance does not cover). The domain
// that owns the constraint says once what it means to the caller (Refuse),
// and every transaction's error that names it becomes that problem
// (Transact, TransactPipelined), wherever it surfaced. A statement held for
// the commit reports its error at the commit, in the idempotency layer's
// code, not the domain's: without this, a duplicate would be stored as a
// 500 there rather than the 409 the caller can act on.
var refusals sync.Map // constraint name or SQLSTATE -> refusal

type refusal struct {
	code   problem.Code
	detail string // "": the database's own message
}

// Refuse declares that an error naming constraint (or raising SQLSTATE
// code) is the problem code with detail, or with the database's message if
// detail is "". Call it from the owning package's init.
func Refuse(constraintOrCode string, code problem.Code, detail string) {
	refusals.Store(constraintOrCode, refusal{code, detail})
}

// Refusal is err as the caller's problem, if it names a declared refusal;
// otherwise err.
func Refusal(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	r, ok := refusals.Load(pgErr.ConstraintName)
	if !ok || pgErr.ConstraintName == "" {
		if r, ok = refusals.Load(pgErr.Code); !ok {
			return err
		}
	}
	ref := r.(refusal)
	if ref.detail == "" {
		ref.detail = pgErr.Message
	}
	return problem.New(ref.code, "%s", ref.detail)
}
