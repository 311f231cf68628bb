package postgres

import (
	"cmp"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/payments/internal/problem"
)

// A refusal is the database saying no to the caller: a unique or check
// constraint (an order that already has a live charge), or an error a
// function of ours raises (a debit the balance does not cover). The package
// that owns it declares once what it means (Refuse), and a transaction's
// error that names it becomes that problem (Transact, TransactPipelined),
// wherever it surfaced: a statement held for the commit reports its error
// in the idempotency layer's code, which would otherwise store a 500.
var refusals = map[string]problem.Error{} // by constraint name or SQLSTATE; written by init functions only

// Refuse declares that an error naming constraintOrCode is the problem
// code with detail (the database's message if ""). Call it from init.
func Refuse(constraintOrCode string, code problem.Code, detail string) {
	refusals[constraintOrCode] = problem.Error{Code: code, Detail: detail}
}

// Refusal is err as the caller's problem, if it names a declared refusal.
func Refusal(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	r, ok := refusals[pgErr.ConstraintName]
	if !ok {
		if r, ok = refusals[pgErr.Code]; !ok {
			return err
		}
	}
	return problem.New(r.Code, "%s", cmp.Or(r.Detail, pgErr.Message))
}
