package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// dbWork is what PostgreSQL wrote for one request, on average, read from
// its write-ahead log with pg_walinspect between two positions of the log:
// exact counts, which the machine's load does not move, so they can be
// compared from run to run and commit to commit (the rates cannot).
//
//   - commits: commit records (a transaction that wrote nothing writes
//     none, so read-only work is not counted);
//   - tuples: row versions written (heap inserts, updates, deletes);
//   - records and bytes: the records that change the bench database's
//     relations (tables and indexes), commits aside, and their size without
//     full-page images (which depend on when the last checkpoint was).
//
// The server's background work (the reconciler's polls, River's leader
// election) writes a little too, within the window: a run of n requests
// makes it a rounding error.
type dbWork struct{ commits, tuples, records, bytes float64 }

func (w dbWork) String() string {
	return fmt.Sprintf("%4.2f commits  %4.2f tuples  %5.2f WAL records  %6.0f WAL bytes", w.commits, w.tuples, w.records, w.bytes)
}

// countWork runs do(i) for i in [0, n), one after another, and returns the
// database's work per call. The window ends at the log's flushed end: every
// request's commit is flushed before it is answered.
func countWork(ctx context.Context, pool *pgxpool.Pool, n int, do func(i int) error) (dbWork, error) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return dbWork{}, err
	}
	var start string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
		return dbWork{}, err
	}
	for i := range n {
		if err := do(i); err != nil {
			return dbWork{}, err
		}
	}
	var rel string // how pg_walinspect names a relation of this database
	if err := pool.QueryRow(ctx, `SELECT '% rel %/' || oid || '/%' FROM pg_database WHERE datname = current_database()`).Scan(&rel); err != nil {
		return dbWork{}, err
	}
	var end string
	var wrote bool // nothing written since start leaves the flushed end behind it
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_flush_lsn() > $1::pg_lsn`, start).Scan(&end, &wrote); err != nil || !wrote {
		return dbWork{}, err
	}
	var w dbWork
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'),
		       count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type ~ '^(INSERT|UPDATE|HOT_UPDATE|DELETE)'),
		       count(*) FILTER (WHERE block_ref LIKE $2),
		       coalesce(sum(record_length - fpi_length) FILTER (WHERE block_ref LIKE $2), 0)
		FROM pg_get_wal_records_info($1::pg_lsn, $3::pg_lsn)`, start, rel, end).Scan(&w.commits, &w.tuples, &w.records, &w.bytes)
	f := float64(n)
	return dbWork{w.commits / f, w.tuples / f, w.records / f, w.bytes / f}, err
}
