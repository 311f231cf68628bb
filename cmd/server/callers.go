package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/postgres"
)

const callersUsage = `usage:
  server callers add ID [--name NAME] [--webhook-url URL]   prints its API key (once) and webhook secret
  server callers set-webhook ID URL|none                     where its events are pushed; none: it pulls them
  server callers rotate-webhook-secret ID                    a new secret; the old one signs too for 24h
  server callers list`

// runCallers is `server callers`: how an operator creates and manages the
// callers of a real deployment, which has none (the demo callers' keys are
// published, and refused outside the demo). A caller without a webhook URL
// gets no events pushed: it pulls them (GET /v1/events).
func runCallers(ctx context.Context, pool *pgxpool.Pool, args []string, allowPrivate bool, stdout io.Writer) error {
	if len(args) < 2 && (len(args) == 0 || args[0] != "list") {
		return errors.New(callersUsage)
	}
	checkURL := func(raw string) (*string, error) {
		if raw == "" || raw == "none" {
			return nil, nil
		}
		return &raw, events.CheckWebhookURL(ctx, raw, allowPrivate)
	}
	switch args[0] {
	case "add":
		fs := flag.NewFlagSet("callers add", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("name", "", "the caller's display name (default: its id)")
		webhookURL := fs.String("webhook-url", "", "where its events are pushed")
		if err := fs.Parse(args[2:]); err != nil || fs.NArg() > 0 {
			return errors.New(callersUsage)
		}
		url, err := checkURL(*webhookURL)
		if err != nil {
			return err
		}
		key, secret, err := auth.CreateCaller(ctx, pool, args[1], *name, url)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "caller %s created. Its API key, shown this once (only its hash is stored):\n%s\n", args[1], key)
		fmt.Fprintf(stdout, "Its events are signed (%s header) with:\n%s\n", events.SignatureHeader, secret)
		return nil
	case "set-webhook":
		if len(args) != 3 {
			return errors.New(callersUsage)
		}
		url, err := checkURL(args[2])
		if err != nil {
			return err
		}
		secret, err := events.SetWebhookURL(ctx, pool, args[1], url)
		if err != nil {
			return postgres.NotFound(err, func() error { return fmt.Errorf("no caller %s", args[1]) })
		}
		if url == nil {
			fmt.Fprintf(stdout, "caller %s: no webhook; its events wait to be pulled (GET /v1/events)\n", args[1])
			return nil
		}
		fmt.Fprintf(stdout, "caller %s: events go to %s, signed with:\n%s\n", args[1], events.Redact(*url), secret)
		return nil
	case "rotate-webhook-secret":
		secret, until, err := events.RotateWebhookSecret(ctx, pool, args[1])
		if err != nil {
			return postgres.NotFound(err, func() error { return fmt.Errorf("no caller %s", args[1]) })
		}
		fmt.Fprintf(stdout, "caller %s: events are signed with the new secret below, and with the old one too until %s:\n%s\n",
			args[1], until.UTC().Format(time.RFC3339), secret)
		return nil
	case "list":
		callers, err := auth.ListCallers(ctx, pool)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tCREATED\tWEBHOOK")
		for _, c := range callers {
			webhook := cmp.Or(events.Redact(c.WebhookURL), "(none: pulls)")
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", c.ID, c.Name, c.CreatedAt.UTC().Format(time.RFC3339), webhook)
		}
		return w.Flush()
	}
	return errors.New(callersUsage)
}
