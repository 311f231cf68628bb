// Package postgres is the storage edge every other package shares: it
// opens the connection pool, applies the migrations (River's too,
// river.go), and holds the one transaction helper everything else uses
// (Transact), how errors are named and classified (errors.go, NotFound,
// IsTransient), the public ids (ids.go) and the polling loop of the
// background workers (poll.go).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/retrysafe/payments/db"
)

// ErrUnreachable wraps a failure to reach the PostgreSQL server at all, so
// main can print how to get one rather than a bare dial error.
var ErrUnreachable = errors.New("PostgreSQL is not answering")

// Open connects a pool to databaseURL. When createIfMissing is set and the
// database does not exist yet, it is created first (through the server's
// "postgres" maintenance database), so a newcomer's first `make run` works
// on a fresh local PostgreSQL.
func Open(ctx context.Context, databaseURL string, createIfMissing bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	// A connection whose server has become read-only (a fenced primary, or
	// now a standby) is dropped, not handed out again: its writes would fail
	// for its lifetime, while a new one goes to the current primary. The
	// server reports both settings on every change, so the check costs no
	// round trip; the request that found out has had a 503. (Not at
	// acquisition, PrepareConn: while new connections also reach a read-only
	// server, the pool would dial and refuse them until Acquire failed with
	// no 503, reads too: TestServerReadOnlyForEveryConnectionFailsOnlyWrites.)
	cfg.AfterRelease = func(c *pgx.Conn) bool { return !ReadOnly(c.PgConn()) }
	// While no node takes writes, each new connection would start a backend
	// on every standby to be refused, for every request, tick and retry an
	// attacker sends: after a failed attempt, the pool waits a second.
	gate := &dialGate{}
	cfg.ConnConfig.Tracer, cfg.BeforeConnect = gate, gate.check
	// Each run of a statement is planned for the table as it is then. The
	// generic plan PostgreSQL would otherwise keep after five runs, for the
	// connection's life, is made while a new database's tables are empty and
	// every index looks as good: one matching caller_id alone would go on
	// scanning all of a merchant's rows (docs/performance.md).
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = pool.Ping(ctx)
	if err != nil && createIfMissing && isCode(err, "3D000") { // invalid_catalog_name
		if err = createDatabase(ctx, cfg.ConnConfig); err == nil {
			err = pool.Ping(ctx)
		}
	}
	if err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return nil, fmt.Errorf("%w at %s:%d: %v", ErrUnreachable, cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
		}
		return nil, err
	}
	return pool, nil
}

// ErrNoPrimary is a pool's answer for a second after it found no writable node.
var ErrNoPrimary = errors.New("no writable PostgreSQL node in the last second")

// dialGate, Open's pgx tracer, keeps when a connection attempt last failed
// for a reason worth retrying (unix nanoseconds, 0 after a success).
type dialGate struct{ failed atomic.Int64 }

func (g *dialGate) check(context.Context, *pgx.ConnConfig) error {
	if f := g.failed.Load(); f != 0 && time.Since(time.Unix(0, f)) < time.Second {
		return ErrNoPrimary
	}
	return nil
}

func (g *dialGate) TraceConnectEnd(_ context.Context, end pgx.TraceConnectEndData) {
	if end.Err == nil {
		g.failed.Store(0)
	} else if IsTransient(end.Err) { // not a missing database or a wrong password
		g.failed.Store(time.Now().UnixNano())
	}
}

// The rest of pgx's tracer interfaces, which the gate ignores.
func (*dialGate) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}
func (*dialGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*dialGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func createDatabase(ctx context.Context, target *pgx.ConnConfig) error {
	admin := target.Copy()
	admin.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to the maintenance database to create %q: %w", target.Database, err)
	}
	defer conn.Close(ctx)
	// CREATE DATABASE takes no parameters; the name is quoted as an identifier.
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{target.Database}.Sanitize())
	if err != nil && !isCode(err, "42P04") { // duplicate_database: another process won the race
		return fmt.Errorf("create database %q: %w", target.Database, err)
	}
	return nil
}

// Migrate applies every pending migration from db/migrations. Several
// processes may call it at once: golang-migrate takes an advisory lock.
func Migrate(pool *pgxpool.Pool) error {
	src, err := iofs.New(db.Migrations, "migrations")
	if err != nil {
		return err
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// Close returns the connection the driver holds to the pool; without it
	// pool.Close would wait for that connection forever.
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Transact runs fn in a transaction and commits it if fn returns nil. The
// deferred rollback always runs (after a commit it does nothing), so a panic
// in fn cannot leave the connection checked out and its locks held; and on a
// context ctx's cancellation does not reach, or a canceled request's
// connection would go back to the pool mid-transaction. An error that
// names a declared refusal is returned as the caller's problem (Refuse).
func Transact(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) (err error) {
	defer func() { err = Refusal(err) }()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// IsTransient reports whether err is a database failure worth retrying: a
// connection broken or timed out, a server shutting down or out of
// resources, a serialization failure or deadlock, or a read-only server (a
// failover is under way: the new primary will take writes). It separates
// "tell the client to retry" (503) from a final error, so it errs towards
// transient for anything that looks like the network: a blip must never be
// stored as an operation's final answer.
func IsTransient(err error) bool {
	// Canceled covers a worker stopped mid-operation (a deploy): the work is
	// not done, and must stay resumable rather than be stored as failed.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, ErrNoPrimary) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return true
	}
	// A connection that broke mid-statement: pgconn reports these without a
	// SQLSTATE, and they are not "safe to retry" in its sense (bytes were
	// sent), but the statement's transaction is gone either way.
	var netErr net.Error
	if errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.As(err, &netErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "40"), // transaction rollback (serialization, deadlock)
			strings.HasPrefix(pgErr.Code, "53"), // insufficient resources
			strings.HasPrefix(pgErr.Code, "57"), // operator intervention (shutdown, cancel)
			// read_only_sql_transaction: this service never asks for a
			// read-only transaction, so the server itself is read-only.
			pgErr.Code == "25006":
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr)
}

// ReadOnly reports whether the server last said that conn's session is
// read-only: a hot standby, or default_transaction_read_only on.
func ReadOnly(conn *pgconn.PgConn) bool {
	return conn.ParameterStatus("in_hot_standby") == "on" || conn.ParameterStatus("default_transaction_read_only") == "on"
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// Redact names the database that databaseURL points to, for logs and
// errors: its host, port, database and user as pgx's own parser reads them,
// and nothing else, so no password is printed, wherever it was given (the
// URL's user part, a password query parameter, or the key=value form).
func Redact(databaseURL string) string {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return "(an unparseable DATABASE_URL)"
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

// NotFound translates the error of a single-row query: a missing row
// becomes notFound() (the domain's own answer, such as a 404 problem); any
// other error, or nil, is returned as it is. With IsNotFound it is the one
// place that knows how the driver says "no row" (pgx.ErrNoRows).
func NotFound(err error, notFound func() error) error {
	if IsNotFound(err) {
		return notFound()
	}
	return err
}

// IsNotFound reports whether err says a single-row query found no row, for
// the places where a missing row is not an error but a branch.
func IsNotFound(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// Nullable is NULL for "" (an optional text column), and Text its inverse.
func Nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Text is "" for NULL (see Nullable).
func Text(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
