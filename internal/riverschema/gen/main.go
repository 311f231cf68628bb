// Command gen writes River's migrations into db/migrations as golang-migrate
// files (see package riverschema). It is run by go generate in package db,
// from that directory.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/retrysafe/payments/internal/riverschema"
)

func main() {
	files, err := riverschema.Files()
	if err != nil {
		fmt.Fprintln(os.Stderr, "riverschema:", err)
		os.Exit(1)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join("migrations", f.Name), []byte(f.Contents), 0o644); err != nil { // #nosec G306 -- committed source files, read by everyone
			fmt.Fprintln(os.Stderr, "riverschema:", err)
			os.Exit(1)
		}
	}
}
