package postgres

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A keyed request's transaction is a few statements, and most return only
// an error: the key's check, the record's insert or fenced completion, an
// event. Sent one at a time between BEGIN and COMMIT, each costs a round
// trip, and a round trip costs more CPU than an insert. So a PipelinedTx
// holds every statement whose result is only an error (sqlc's :exec
// queries) and sends it with the next statement that returns something,
// or with the COMMIT, in one pipeline (a pgx.Batch); BEGIN goes with the
// first statement that returns something. An order create is two round
// trips: the key's check and BEGIN with the order's insert, which returns
// the row; the record's insert with the COMMIT. A transaction of :exec
// statements alone is one, as an implicit transaction. No code above this
// package knows what travels together.
//
// What that changes for a caller: a held statement's error arrives with a
// later statement's, or the commit's. So nothing branches on an :exec
// query's error; a refusal the caller must see (a unique violation that is
// a 409) is declared once (Refuse) and becomes that problem wherever it
// surfaces. And a statement held for the commit must fail, not merely
// change nothing, when the transaction must not commit: after an error
// PostgreSQL skips the rest of the pipeline, COMMIT included, but an UPDATE
// that matches no row is a success. So the key's record is inserted
// without ON CONFLICT, and the fenced writes raise an error when they lose
// their fence (migration 0023).

// TransactPipelined is Transact with a PipelinedTx (what fn holds is sent
// with the COMMIT).
func TransactPipelined(ctx context.Context, pool *pgxpool.Pool, fn func(tx *PipelinedTx) error) (err error) {
	defer func() { err = Refusal(err) }()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Release hands a connection left inside a transaction (a failed
	// rollback) to the pool to be closed, never to the next caller.
	defer conn.Release()
	tx := &PipelinedTx{conn: conn}
	// As in Transact: always, on a context the request's cancellation does not reach.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// PipelinedTx is a pgx.Tx whose BEGIN is sent with its first statement.
// Exec and QueryRow send both in one round trip (a QueryRow's when its row
// is scanned, which sqlc's code does at once) with pgx's Batch.BeginTx,
// whose transaction then serves every later call. Anything else that comes
// first (Query, CopyFrom, ...) begins on a round trip of its own.
type PipelinedTx struct {
	conn      *pgxpool.Conn
	tx        pgx.Tx             // pgx's transaction, once BEGIN has been sent; nil before
	committed bool               // by Commit
	ended     bool               // committed, rolled back, or a COMMIT was sent
	later     []*pgx.QueuedQuery // :exec queries held for the next round trip
}

// held holds sql for the next round trip if its result is only an error:
// a query sqlc generated as :exec.
func (t *PipelinedTx) held(sql string, args []any) bool {
	header, _, _ := strings.Cut(sql, "\n")
	if !strings.HasPrefix(header, "-- name: ") || !strings.HasSuffix(header, " :exec") {
		return false
	}
	t.later = append(t.later, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	return true
}

var _ pgx.Tx = (*PipelinedTx)(nil)

// closed says whether nothing more may be sent: the transaction was ended
// here, or ended without us (the batch carrying BEGIN failed first, or a
// failed COMMIT ended it). Outside a transaction a statement would commit
// on its own, and so would the work of a caller that ignored an error.
func (t *PipelinedTx) closed() bool {
	return t.ended || (t.tx != nil && t.conn.Conn().PgConn().TxStatus() == 'I')
}

// send sends b and reads its results: the held statements' and BEGIN's
// (if b begins the transaction) here, the rest with read.
func (t *PipelinedTx) send(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	if err := t.prepare(ctx, b.QueuedQueries...); err != nil {
		t.ended = true // what the caller sent next would run outside the transaction
		return err
	}
	br := t.conn.SendBatch(ctx, b)
	var err error
	for range t.later {
		if err == nil {
			_, err = br.Exec()
		}
	}
	t.later = nil
	if tx := br.Tx(); tx != nil {
		// BEGIN was sent, whatever happens next: the transaction is pgx's
		// from now on, and its Rollback is what ends it after a failure.
		// (If a held statement failed first, BEGIN never ran, and there is
		// nothing to end: closed says so.)
		t.tx = tx
		if err == nil {
			_, err = br.Exec()
		}
	}
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batch is a Batch of the statements held for later, then BEGIN if
// begin, then sql unless it is "" (as from Commit, which sends only what is
// held). The held statements go before BEGIN: PostgreSQL runs a pipeline's
// statements up to BEGIN in an implicit transaction that BEGIN makes
// explicit, so they are in the transaction all the same, and if one fails
// (a key already taken) the rest is skipped and the implicit transaction
// rolls back at the pipeline's end, leaving no transaction to end.
func (t *PipelinedTx) batch(begin bool, sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	if begin {
		b.BeginTx(pgx.TxOptions{})
	}
	b.QueuedQueries = slices.Concat(t.later, b.QueuedQueries)
	if sql != "" {
		b.Queue(sql, args...)
	}
	return b
}

// prepare prepares sqlc's queries, BEGIN and COMMIT among qs on the connection,
// by name, once each: pgx drops the statements it caches for a batch after
// any error in it, and the error that stops a retry whose key is taken
// would cost the next batch two round trips, to deallocate them and to
// prepare them again.
func (t *PipelinedTx) prepare(ctx context.Context, qs ...*pgx.QueuedQuery) error {
	for _, q := range qs {
		if strings.HasPrefix(q.SQL, "-- name: ") || q.SQL == "begin" || q.SQL == "commit" {
			if _, err := t.conn.Conn().Prepare(ctx, q.SQL, q.SQL); err != nil {
				return err
			}
		}
	}
	return nil
}

// direct says whether a statement can go straight to pgx's transaction: it
// has begun, and no statement is held for later.
func (t *PipelinedTx) direct() bool { return t.tx != nil && len(t.later) == 0 }

// begun returns pgx's transaction, beginning it, and sending what is held
// for later, on a round trip of its own if need be.
func (t *PipelinedTx) begun(ctx context.Context) (pgx.Tx, error) {
	if t.closed() {
		return nil, pgx.ErrTxClosed
	}
	if !t.direct() {
		if err := t.send(ctx, t.batch(t.tx == nil, "", nil), func(pgx.BatchResults) error { return nil }); err != nil {
			return nil, err
		}
	}
	return t.tx, nil
}

// onBegun runs f on pgx's transaction, once begun.
func onBegun[T any](ctx context.Context, t *PipelinedTx, f func(tx pgx.Tx) (T, error)) (T, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	return f(tx)
}

// Exec runs sql in the transaction. An :exec query is held (see the top
// of this file): it returns nil, and its error comes with a later one's.
func (t *PipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.held(sql, args) {
		return pgconn.CommandTag{}, nil
	}
	if t.direct() {
		return t.tx.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := t.send(ctx, t.batch(t.tx == nil, sql, args), func(br pgx.BatchResults) (err error) {
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// QueryRow runs sql in the transaction; if it is the first statement, it
// is sent, with BEGIN, when its row is scanned.
func (t *PipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.direct() && !t.closed() {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	return pendingRow(func(dest []any) error {
		if t.closed() {
			return pgx.ErrTxClosed
		}
		if t.direct() { // another statement went first meanwhile
			return t.tx.QueryRow(ctx, sql, args...).Scan(dest...)
		}
		return t.send(ctx, t.batch(t.tx == nil, sql, args), func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) })
	})
}

// Query runs sql in the transaction.
func (t *PipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return onBegun(ctx, t, func(tx pgx.Tx) (pgx.Rows, error) { return tx.Query(ctx, sql, args...) })
}

// CopyFrom runs COPY FROM in the transaction.
func (t *PipelinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return onBegun(ctx, t, func(tx pgx.Tx) (int64, error) { return tx.CopyFrom(ctx, table, columns, src) })
}

// SendBatch sends b in the transaction.
func (t *PipelinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := t.begun(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.SendBatch(ctx, b)
}

// Prepare prepares a statement on the transaction's connection.
func (t *PipelinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return onBegun(ctx, t, func(tx pgx.Tx) (*pgconn.StatementDescription, error) { return tx.Prepare(ctx, name, sql) })
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *PipelinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return onBegun(ctx, t, func(tx pgx.Tx) (pgx.Tx, error) { return tx.Begin(ctx) })
}

// LargeObjects is the transaction's large objects.
func (t *PipelinedTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.begun(context.Background())
	if err != nil {
		// A transaction that is closed already: every method says so.
		var b pgx.Batch
		b.BeginTx(pgx.TxOptions{})
		tx = pgx.FailedBatchResults(&b, err).Tx()
	}
	return tx.LargeObjects()
}

// Conn is the transaction's connection.
func (t *PipelinedTx) Conn() *pgx.Conn { return t.conn.Conn() }

// Commit sends what is held with COMMIT, in one round trip. If nothing was
// sent before, the held statements are the whole transaction, with no
// BEGIN and no COMMIT: PostgreSQL runs a pipeline's statements up to its
// Sync (pgx sends one) as one implicit transaction, committed at the Sync,
// or rolled back, with nothing left to end, at the first error. A
// transaction that sent nothing has nothing to commit.
func (t *PipelinedTx) Commit(ctx context.Context) error {
	if t.closed() {
		return pgx.ErrTxClosed
	}
	t.ended = true
	explicit := t.tx != nil
	if !explicit && len(t.later) == 0 {
		return nil
	}
	b := t.batch(false, "", nil)
	if explicit {
		b.Queue("commit")
	}
	var commit pgconn.CommandTag
	err := t.send(ctx, b, func(br pgx.BatchResults) (err error) {
		if explicit {
			commit, err = br.Exec()
		}
		return err
	})
	if err == nil && commit.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	t.committed = err == nil
	return err
}

// Rollback rolls the transaction back; after a commit it does nothing.
func (t *PipelinedTx) Rollback(ctx context.Context) error {
	t.ended = true
	if t.committed || t.tx == nil {
		return nil
	}
	// A held statement that failed before BEGIN ran has ended the
	// transaction already, and pgx does not know it: nothing to send.
	if t.conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// pendingRow is a row whose statement is sent when it is scanned.
type pendingRow func(dest []any) error

func (r pendingRow) Scan(dest ...any) error { return r(dest) }
