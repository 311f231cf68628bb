package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
)

// runCallers is `server callers`: how an operator creates the callers of a
// real deployment, which has none (the demo callers' keys are published,
// and refused outside the demo).
//
//	server callers add ID [--name NAME]   prints the new caller's API key, once
//	server callers list                   id, name and creation time of each
func runCallers(ctx context.Context, pool *pgxpool.Pool, args []string, stdout io.Writer) error {
	const usage = "usage: server callers add ID [--name NAME] | server callers list"
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "add":
		fs := flag.NewFlagSet("callers add", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("name", "", "the caller's display name (default: its id)")
		if len(args) < 2 {
			return errors.New(usage)
		}
		if err := fs.Parse(args[2:]); err != nil || fs.NArg() > 0 {
			return errors.New(usage)
		}
		key, err := auth.CreateCaller(ctx, pool, args[1], *name)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "caller %s created. Its API key, shown this once (only its hash is stored):\n%s\n", args[1], key)
		return nil
	case "list":
		callers, err := auth.ListCallers(ctx, pool)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tCREATED")
		for _, c := range callers {
			fmt.Fprintf(w, "%s\t%s\t%s\n", c.ID, c.Name, c.CreatedAt.UTC().Format(time.RFC3339))
		}
		return w.Flush()
	}
	return errors.New(usage)
}
