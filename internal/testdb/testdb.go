// Package testdb gives each test its own freshly migrated PostgreSQL
// database. The migrations run once into a template database; every test
// then gets a cheap CREATE DATABASE ... TEMPLATE clone of it (pgtestdb), so
// tests can run in parallel against real, isolated databases.
//
// The server is TEST_DATABASE_URL, else the README's local one (DefaultURL,
// trust auth). When it does not answer, the test fails: it never skips.
package testdb

import (
	"cmp"
	"context"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver pgtestdb uses
	"github.com/peterldowns/pgtestdb"
	"github.com/peterldowns/pgtestdb/migrators/golangmigrator"

	"github.com/retrysafe/payments/db"
)

// DefaultURL is the server the tests use unless TEST_DATABASE_URL says otherwise.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// New returns the URL of a new migrated database for t, dropped when t ends
// (kept for inspection if t failed).
func New(t testing.TB) string {
	t.Helper()
	raw := cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultURL)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	password, _ := u.User.Password()
	conf := pgtestdb.Config{
		DriverName:                "pgx",
		Host:                      u.Hostname(),
		Port:                      u.Port(),
		User:                      u.User.Username(),
		Password:                  password,
		Database:                  strings.TrimPrefix(u.Path, "/"),
		Options:                   u.RawQuery,
		ForceTerminateConnections: true, // servers killed by crash tests may leave connections behind
	}
	reachable.Do(func() { reachErr = ping(raw) })
	if reachErr != nil {
		t.Fatalf("PostgreSQL is not answering at %s: %v\n"+
			"The tests need a real PostgreSQL. Start the local one:\n"+
			"  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start   (Debian)\n"+
			"or run one in a container (docker compose up -d db), or point TEST_DATABASE_URL at one.",
			u.Redacted(), reachErr)
	}
	migrator := golangmigrator.New("migrations", golangmigrator.WithFS(db.Migrations))
	return pgtestdb.Custom(t, conf, migrator).URL()
}

var (
	reachable sync.Once
	reachErr  error
)

func ping(databaseURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// NewPool returns a pool on a new migrated database for t.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, New(t))
}

// Pool opens a pool on databaseURL, closed when t ends, of 20 connections
// (pgx's default is 4 on a small machine), so concurrency tests really run
// in parallel in the database. options adjust its configuration.
func Pool(t testing.TB, databaseURL string, options ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	cfg.MaxConns = 20
	for _, o := range options {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
