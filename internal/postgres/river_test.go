package postgres_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/retrysafe/payments/db"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// TestCommittedMigrationsMatchPinnedRiver fails when db/migrations holds
// River files other than those the River module in go.mod generates: an
// upgrade of River without `make generate`, or a hand edit.
func TestCommittedMigrationsMatchPinnedRiver(t *testing.T) {
	want, err := postgres.RiverFiles()
	if err != nil {
		t.Fatal(err)
	}
	wanted := map[string]bool{}
	for _, f := range want {
		wanted[f.Name] = true
		got, err := fs.ReadFile(db.Migrations, "migrations/"+f.Name)
		if err != nil {
			t.Errorf("%s: %v (run make generate)", f.Name, err)
			continue
		}
		if string(got) != f.Contents {
			t.Errorf("%s differs from what the pinned River generates: run make generate", f.Name)
		}
	}
	committed, err := fs.Glob(db.Migrations, "migrations/*_river_*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range committed {
		if name := strings.TrimPrefix(name, "migrations/"); !wanted[name] {
			t.Errorf("%s is not a migration of the pinned River: remove it, or run make generate", name)
		}
	}
	if len(want) == 0 {
		t.Fatal("the pinned River has no migrations: is the driver's migration line right?")
	}
}

// TestRiverSeesTheSchemaAsCurrent migrates a database with golang-migrate,
// as the server does, and asks River's own migrator whether anything is
// missing: the golang-migrate files create River's schema exactly, and
// record its versions as River would.
func TestRiverSeesTheSchemaAsCurrent(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: postgres.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Validate(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("River says the schema is not current: %v", res.Messages)
	}
	// And a migration River would run finds nothing to do.
	dry, err := m.Migrate(context.Background(), rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Versions) != 0 {
		t.Fatalf("River would still apply %d versions", len(dry.Versions))
	}
}
