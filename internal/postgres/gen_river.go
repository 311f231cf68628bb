//go:build ignore

// gen_river writes River's migrations into db/migrations as golang-migrate
// files (see river.go). It is run by go generate in package db, from that
// directory: go run ../internal/postgres/gen_river.go.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/retrysafe/payments/internal/postgres"
)

func main() {
	files, err := postgres.RiverFiles()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen_river:", err)
		os.Exit(1)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join("migrations", f.Name), []byte(f.Contents), 0o644); err != nil { // #nosec G306 -- committed source files, read by everyone
			fmt.Fprintln(os.Stderr, "gen_river:", err)
			os.Exit(1)
		}
	}
}
