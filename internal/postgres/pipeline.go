package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A keyed create is five statements: the claim (on its own), then BEGIN,
// the order insert, the record's fenced completion and COMMIT. Sent one at
// a time, that is five round trips, and a round trip costs the server and
// PostgreSQL more CPU (system calls, wake-ups, a protocol message each
// way) than the insert itself. Nothing forces BEGIN to travel alone, nor
// COMMIT: BEGIN can go with the transaction's first statement, and COMMIT
// with its last, in one pipeline (a pgx.Batch: the messages are written
// together, and the server answers them in order). That is three round
// trips for the same statements, committing exactly the same writes
// together. docs/performance.md has what it saves.
//
// The one rule it needs: a statement sent with COMMIT must fail, not merely
// change nothing, when the transaction must not commit. After an error,
// PostgreSQL ignores the rest of the pipeline, COMMIT included, and the
// transaction is rolled back; but an UPDATE that matches no row is a
// success, and the COMMIT behind it would commit the work before it. So the
// idempotency layer's fenced writes raise an error when they lose their
// fence (migration 0023) instead of reporting zero rows.

// TransactPipelined is Transact with a PipelinedTx: fn's first statement
// carries BEGIN, and a statement fn sends through tx.ThenCommit() carries
// COMMIT. If fn returns nil without using ThenCommit, a COMMIT is sent on
// its own; if fn sent no statement at all, nothing is.
func TransactPipelined(ctx context.Context, pool *pgxpool.Pool, fn func(tx *PipelinedTx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Release hands a connection left inside a transaction (a failed
	// rollback) to the pool to be closed, never to the next caller.
	defer conn.Release()
	tx := &PipelinedTx{conn: conn}
	// As in Transact: always, and on a context the request's cancellation
	// does not reach (after a commit it does nothing).
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// PipelinedTx is a pgx.Tx whose BEGIN is sent with its first statement.
// Use it through TransactPipelined.
//
// Exec and QueryRow send BEGIN and the statement in one round trip (a
// QueryRow's when its row is scanned, which sqlc's code does at once), with
// pgx's own Batch.BeginTx, which gives back pgx's transaction: from then on
// every method is that transaction's. Anything else that comes first
// (Query, whose rows would have to be read before the batch ends; CopyFrom,
// SendBatch, Prepare, a nested Begin, LargeObjects) begins the transaction
// on its own round trip, as pgx.Conn.Begin does, and goes on from there.
//
// A QueryRow that comes first is sent when it is scanned: a statement sent
// in between (there is none in sqlc's code, which scans at once) would run
// before it.
type PipelinedTx struct {
	conn      *pgxpool.Conn
	tx        pgx.Tx // pgx's transaction, once BEGIN has been sent; nil before
	committed bool   // by Commit, or by a statement sent through ThenCommit
	ended     bool   // committed, rolled back, or a COMMIT was sent
	commitErr error  // why a COMMIT sent through ThenCommit did not commit
}

var _ pgx.Tx = (*PipelinedTx)(nil)

// closed says whether nothing more may be sent: the transaction was ended
// here, or it ended without us (its BEGIN never ran because the batch that
// carried it failed first, or a COMMIT that failed ended it). Outside a
// transaction, a statement would commit on its own; so would the work of a
// caller that ignored an error and went on.
func (t *PipelinedTx) closed() bool {
	return t.ended || (t.tx != nil && t.conn.Conn().PgConn().TxStatus() == 'I')
}

// send sends b, which starts with BEGIN unless the transaction has begun,
// and reads its results with read; BEGIN's is read here.
func (t *PipelinedTx) send(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	br := t.conn.SendBatch(ctx, b)
	var err error
	if t.tx == nil {
		// BEGIN was sent, whatever happens next: the transaction is pgx's
		// from now on, and its Rollback is what ends it after a failure.
		t.tx = br.Tx()
		_, err = br.Exec()
	}
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batch is a Batch that begins the transaction if it has not begun.
func (t *PipelinedTx) batch() *pgx.Batch {
	b := &pgx.Batch{}
	if t.tx == nil {
		b.BeginTx(pgx.TxOptions{})
	}
	return b
}

// begun returns pgx's transaction, beginning it on its own round trip if
// no statement has yet.
func (t *PipelinedTx) begun(ctx context.Context) (pgx.Tx, error) {
	if t.closed() {
		return nil, pgx.ErrTxClosed
	}
	if t.tx == nil {
		tx, err := t.conn.Begin(ctx)
		if err != nil {
			return nil, err
		}
		t.tx = tx
	}
	return t.tx, nil
}

// Exec runs sql in the transaction.
func (t *PipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	b := t.batch()
	b.Queue(sql, args...)
	var tag pgconn.CommandTag
	err := t.send(ctx, b, func(br pgx.BatchResults) (err error) {
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// QueryRow runs sql in the transaction; if it is the first statement, it
// is sent, with BEGIN, when its row is scanned.
func (t *PipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil && !t.closed() {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	return pendingRow(func(dest []any) error {
		if t.closed() {
			return pgx.ErrTxClosed
		}
		if t.tx != nil { // another statement went first meanwhile
			return t.tx.QueryRow(ctx, sql, args...).Scan(dest...)
		}
		b := t.batch()
		b.Queue(sql, args...)
		return t.send(ctx, b, func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) })
	})
}

// Query runs sql in the transaction.
func (t *PipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

// CopyFrom runs COPY FROM in the transaction.
func (t *PipelinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
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
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (t *PipelinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
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

// ThenCommit returns what to send the transaction's last statement
// through: its Exec sends the statement and COMMIT in one round trip (with
// BEGIN too, if nothing was sent before), and ends the transaction. The
// statement must fail, not just match nothing, when the transaction must
// not commit: see the top of this file.
func (t *PipelinedTx) ThenCommit() interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
} {
	return lastStatement{t}
}

// lastStatement is ThenCommit's: a dbsqlc.DBTX for one :exec query.
type lastStatement struct{ t *PipelinedTx }

func (l lastStatement) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t := l.t
	if t.closed() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	b := t.batch()
	b.Queue(sql, args...)
	b.Queue("commit")
	var tag, commit pgconn.CommandTag
	err := t.send(ctx, b, func(br pgx.BatchResults) (err error) {
		if tag, err = br.Exec(); err != nil {
			// The server skips the rest of the batch, COMMIT included:
			// the transaction is aborted, and Rollback ends it.
			return err
		}
		commit, err = br.Exec()
		return err
	})
	// A COMMIT was sent: whatever its fate, nothing more goes in this
	// transaction, and Commit reports what happened here.
	t.ended = true
	if err == nil && commit.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		t.commitErr = err
		return tag, err
	}
	t.committed = true
	return tag, nil
}

func (l lastStatement) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errOnlyExec
}

func (l lastStatement) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{errOnlyExec} }

var errOnlyExec = errors.New("postgres: only an Exec can be sent with the COMMIT")

// Commit commits the transaction, unless a statement sent through
// ThenCommit has. A transaction that sent nothing has nothing to commit.
func (t *PipelinedTx) Commit(ctx context.Context) error {
	if t.committed {
		return nil
	}
	if t.commitErr != nil {
		return t.commitErr
	}
	if t.closed() {
		return pgx.ErrTxClosed
	}
	t.ended = true
	if t.tx == nil {
		return nil
	}
	if err := t.tx.Commit(ctx); err != nil {
		return err
	}
	t.committed = true
	return nil
}

// Rollback rolls the transaction back; after a commit it does nothing.
func (t *PipelinedTx) Rollback(ctx context.Context) error {
	t.ended = true
	if t.committed || t.tx == nil {
		return nil
	}
	// A COMMIT sent through ThenCommit that failed has ended the
	// transaction already, and pgx does not know it: nothing to send.
	if t.conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// pendingRow is a row whose statement is sent when it is scanned.
type pendingRow func(dest []any) error

func (r pendingRow) Scan(dest ...any) error { return r(dest) }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
