package soak

import (
	"context"
	"os"
	"testing"

	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// soakDatabase returns the soak's database and how to restart it. That is
// a PostgreSQL of the soak's own (testdb.Cluster) when PostgreSQL's server
// binaries are here, so that the soak can restart it in the middle of the
// run (the clients' connections break, new ones are refused until it is
// back, and it replays its WAL on the way up) without touching the
// machine's PostgreSQL, which the rest of the suite uses at the same time.
// Where they are not (PostgreSQL runs in a container, say), the soak falls
// back to the machine's server and to dropping every connection to its
// database, which is what a restart does to the clients but not to the
// server; in CI that fallback is a failure.
func soakDatabase(t *testing.T) (url string, restart func() error, fault string) {
	t.Helper()
	if bin := testdb.PGBin(); bin != "" {
		c := testdb.NewCluster(t, bin)
		migrate(t, c.URL())
		return c.URL(), c.Restart, "database restarts (immediate: a crash)"
	}
	msg := "the soak restarts a PostgreSQL of its own and needs the server's binaries (initdb, pg_ctl, postgres): " +
		"put them on PATH or set SOAK_PG_BIN to their directory"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Logf("%s; without them it only drops every connection to its database", msg)
	url = testdb.New(t)
	db := testdb.Pool(t, url)
	return url, func() error {
		_, err := db.Exec(context.Background(),
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		return err
	}, "drops of every database connection"
}

// migrate applies the migrations to the database at url.
func migrate(t *testing.T, url string) {
	t.Helper()
	pool, err := postgres.Open(context.Background(), url, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(pool); err != nil {
		t.Fatal(err)
	}
}
