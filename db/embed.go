// Package db holds the schema (golang-migrate files in migrations/) and the
// SQL queries (queries/) from which sqlc generates internal/dbsqlc. The
// migrations are embedded so the server and the tests apply exactly these
// files, and sqlc reads the same directory: there is one schema source.
package db

import "embed"

// River's migrations first: sqlc reads them with the others.
//go:generate go run ../internal/postgres/gen_river.go
//go:generate go tool -modfile=../tools/go.mod sqlc generate -f ../sqlc.yaml

// Migrations is the migrations/ directory, for golang-migrate's iofs source.
//
//go:embed migrations/*.sql
var Migrations embed.FS
