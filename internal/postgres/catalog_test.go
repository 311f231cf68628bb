package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/testdb"
)

// referenceTables are the tables that are not tenant-owned: callers (the
// tenants themselves; a replicated reference table under Citus) and
// golang-migrate's bookkeeping. Every other table is a tenant table.
var referenceTables = []string{"callers", "schema_migrations"}

// TestSchemaIsShardReady reads the catalog and fails if a tenant table
// breaks the shard-ready rules of docs/design.md: it must carry caller_id,
// every primary key and unique constraint must include caller_id, and every
// foreign key to another tenant table must be composite with caller_id on
// both sides. Those rules keep one caller's rows co-located on one shard
// when the tables are distributed by caller_id.
func TestSchemaIsShardReady(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	tables, violations := shardReadiness(t, pool)
	for _, want := range []string{"idempotency_keys", "orders"} {
		if !tables[want] {
			t.Errorf("tenant table %s not found: is the catalog query reading the right schema?", want)
		}
	}
	for _, v := range violations {
		t.Error(v)
	}
}

// TestShardReadinessCatchesViolations shows the check above can fail: each
// kind of violation, added to a fresh database, is reported.
func TestShardReadinessCatchesViolations(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE no_caller (id text PRIMARY KEY);
		CREATE TABLE global_unique (caller_id text NOT NULL, id text, code text UNIQUE, PRIMARY KEY (caller_id, id));
		CREATE TABLE loose_fk (caller_id text NOT NULL, id text, order_id text, PRIMARY KEY (caller_id, id));
		ALTER TABLE orders ADD CONSTRAINT orders_id_unique UNIQUE (id);
		ALTER TABLE loose_fk ADD FOREIGN KEY (order_id) REFERENCES orders (id);
		CREATE UNIQUE INDEX global_unique_idx ON loose_fk (order_id);`)
	if err != nil {
		t.Fatal(err)
	}
	_, violations := shardReadiness(t, pool)
	for _, want := range []string{
		"tenant table no_caller has no NOT NULL caller_id column",
		"no_caller: key no_caller_pkey",
		"global_unique: key global_unique_code_key",
		"loose_fk: foreign key loose_fk_order_id_fkey",
		"loose_fk: key global_unique_idx",
	} {
		if !slices.ContainsFunc(violations, func(v string) bool { return strings.HasPrefix(v, want) }) {
			t.Errorf("violation %q not reported; got %q", want, violations)
		}
	}
}

// shardReadiness returns the tenant tables and every rule they break.
func shardReadiness(t *testing.T, pool *pgxpool.Pool) (map[string]bool, []string) {
	t.Helper()
	ctx := context.Background()
	var violations []string

	rows, err := pool.Query(ctx, `
		SELECT c.relname,
		       EXISTS (SELECT 1 FROM pg_attribute a
		               WHERE a.attrelid = c.oid AND a.attname = 'caller_id' AND NOT a.attisdropped AND a.attnotnull)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	tenantTables := map[string]bool{}
	for rows.Next() {
		var name string
		var hasCallerID bool
		if err := rows.Scan(&name, &hasCallerID); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(referenceTables, name) {
			continue
		}
		tenantTables[name] = true
		if !hasCallerID {
			violations = append(violations, fmt.Sprintf("tenant table %s has no NOT NULL caller_id column", name))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// Every primary key, unique constraint, unique index and foreign key of
	// a tenant table, with its columns (and, for foreign keys, the
	// referenced table and columns).
	rows, err = pool.Query(ctx, `
		SELECT c.relname, con.conname, con.contype::text,
		       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) k JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k),
		       coalesce(rc.relname, ''),
		       ARRAY(SELECT a.attname::text FROM unnest(coalesce(con.confkey, '{}')) k JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k)
		FROM pg_constraint con
		JOIN pg_class c ON c.oid = con.conrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_class rc ON rc.oid = con.confrelid
		WHERE n.nspname = 'public' AND con.contype IN ('p', 'u', 'f')
		UNION ALL
		SELECT c.relname, i.relname, 'i',
		       ARRAY(SELECT a.attname::text FROM unnest(ix.indkey::int2[]) k JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k),
		       '', '{}'
		FROM pg_index ix
		JOIN pg_class c ON c.oid = ix.indrelid
		JOIN pg_class i ON i.oid = ix.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND ix.indisunique
		  AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = ix.indexrelid)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	hasPK := map[string]bool{}
	for rows.Next() {
		var table, name, kind, refTable string
		var cols, refCols []string
		if err := rows.Scan(&table, &name, &kind, &cols, &refTable, &refCols); err != nil {
			t.Fatal(err)
		}
		if !tenantTables[table] {
			continue
		}
		switch kind {
		case "p":
			hasPK[table] = true
			fallthrough
		case "u", "i":
			if !slices.Contains(cols, "caller_id") {
				violations = append(violations, fmt.Sprintf("%s: key %s on %v does not include caller_id", table, name, cols))
			}
		case "f":
			if !tenantTables[refTable] {
				continue // a reference to callers (or another reference table) is fine
			}
			i := slices.Index(cols, "caller_id")
			if i < 0 || i >= len(refCols) || refCols[i] != "caller_id" {
				violations = append(violations, fmt.Sprintf("%s: foreign key %s %v -> %s%v is not composite with caller_id on both sides", table, name, cols, refTable, refCols))
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for table := range tenantTables {
		if !hasPK[table] {
			violations = append(violations, fmt.Sprintf("tenant table %s has no primary key", table))
		}
	}
	return tenantTables, violations
}
