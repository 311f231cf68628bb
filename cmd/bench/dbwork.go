package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbWork is what one request cost the database, on average, counted
// exactly, so that it can be compared from run to run and commit to commit
// (the rates cannot): round trips (proxy.go); commit records (read-only
// work writes none); tuples written (heap inserts, updates, deletes); and
// the log records that change the bench database's tables and indexes,
// commits aside, with their bytes without full-page images (which depend
// on when the last checkpoint was), read with pg_walinspect.
type dbWork struct{ trips, commits, tuples, records, bytes float64 }

func (w dbWork) String() string {
	return fmt.Sprintf("%5.2f round trips  %4.2f commits  %5.2f tuples  %5.2f WAL records  %5.0f WAL bytes",
		w.trips, w.commits, w.tuples, w.records, w.bytes)
}

// countWork runs do(i) for i in [0, n), one after another, and returns the
// database's work per call. admin must reach the database directly, not
// through the counting proxy. The window ends at the log's flushed end:
// every request's commit is flushed before it is answered.
func countWork(ctx context.Context, admin *pgxpool.Pool, n int, do func(i int) error) (dbWork, error) {
	var start string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
		return dbWork{}, err
	}
	trips0 := trips.Load()
	for i := range n {
		if err := do(i); err != nil {
			return dbWork{}, err
		}
	}
	f := float64(n)
	w := dbWork{trips: float64(trips.Load()-trips0) / f}
	var end string
	var wrote bool // a window that wrote nothing leaves the flushed end behind its start
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_flush_lsn() > $1::pg_lsn`, start).Scan(&end, &wrote); err != nil || !wrote {
		return w, err
	}
	err := admin.QueryRow(ctx, `
		WITH rel AS (SELECT '% rel %/' || oid || '/%' AS pattern FROM pg_database WHERE datname = current_database()),
		     wal AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn))
		SELECT count(*) FILTER (WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'),
		       count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type ~ '^(INSERT|UPDATE|HOT_UPDATE|DELETE)'),
		       count(*) FILTER (WHERE block_ref LIKE rel.pattern),
		       coalesce(sum(record_length - fpi_length) FILTER (WHERE block_ref LIKE rel.pattern), 0)
		FROM wal, rel`, start, end).Scan(&w.commits, &w.tuples, &w.records, &w.bytes)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Message, "could not find a valid record after") {
		// The only WAL past start is a record some background process has
		// not finished flushing: none of the window's, which are flushed
		// before their requests are answered. (The message is the English
		// one: the error's code, XX000, says only "internal".)
		return w, nil
	}
	w.commits, w.tuples, w.records, w.bytes = w.commits/f, w.tuples/f, w.records/f, w.bytes/f
	return w, err
}
