// Command paycli drives the payments API through the retry-safe client,
// for demos and scripts.
//
//	paycli order  --amount 1999 --currency usd [--description "…"]
//	paycli charge --order ord_… --payment-method pm_card_flaky
//	paycli refund --charge ch_… [--amount 500]
//	paycli key    --key <idempotency key>
//
// Common flags: --url (PAYMENTS_URL, default http://localhost:8080),
// --api-key (PAYMENTS_API_KEY, default sk_test_acme), --idempotency-key to
// retry a logical operation you started before, and -v to print every
// attempt with its key, status and wait.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paycli:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: paycli order|charge|refund|key [flags]")
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("paycli "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", or(getenv("PAYMENTS_URL"), "http://localhost:8080"), "API base URL")
	apiKey := fs.String("api-key", or(getenv("PAYMENTS_API_KEY"), "sk_test_acme"), "API key")
	key := fs.String("idempotency-key", "", "idempotency key (default: a new one per operation)")
	verbose := fs.Bool("v", false, "print every attempt")
	amount := fs.Int64("amount", 0, "amount in minor units")
	currency := fs.String("currency", "usd", "currency")
	description := fs.String("description", "", "order description")
	order := fs.String("order", "", "order id")
	pm := fs.String("payment-method", "pm_card_visa", "payment method")
	charge := fs.String("charge", "", "charge id")
	if err := fs.Parse(args); err != nil {
		return err
	}

	c, err := client.New(*url, *apiKey, client.DefaultPolicy(), nil)
	if err != nil {
		return err
	}
	if *verbose {
		c.OnAttempt = func(a client.Attempt) {
			switch {
			case a.Err != nil:
				fmt.Fprintf(stderr, "attempt %d key=%s error=%v", a.Number, a.IdempotencyKey, a.Err)
			default:
				fmt.Fprintf(stderr, "attempt %d key=%s status=%d", a.Number, a.IdempotencyKey, a.Status)
			}
			if a.Wait > 0 {
				fmt.Fprintf(stderr, " retrying in %s", a.Wait)
			}
			fmt.Fprintln(stderr)
		}
	}
	var opts []client.Option
	if *key != "" {
		opts = append(opts, client.WithIdempotencyKey(*key))
	}

	var out any
	var res client.Result
	switch cmd {
	case "order":
		body := apiclient.CreateOrderRequest{Amount: *amount, Currency: apiclient.Currency(*currency)}
		if *description != "" {
			body.Description = description
		}
		out, res, err = c.CreateOrder(ctx, body, opts...)
	case "charge":
		out, res, err = c.Charge(ctx, *order, apiclient.CreateChargeRequestPaymentMethod(*pm), opts...)
	case "refund":
		var a *int64
		if *amount > 0 {
			a = amount
		}
		out, res, err = c.Refund(ctx, *charge, a, opts...)
	case "key":
		if *key == "" {
			return errors.New("key needs --key")
		}
		out, res, err = c.IdempotencyKey(ctx, *key)
	default:
		return fmt.Errorf("unknown command %q (want order, charge, refund or key)", cmd)
	}
	if *verbose {
		fmt.Fprintf(stderr, "done: %d attempt(s), key=%s, replayed=%v\n", res.Attempts, res.IdempotencyKey, res.Replayed)
	}
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr):
		out, err = apiErr.Problem, fmt.Errorf("the API answered %d %s", apiErr.Status, apiErr.Problem.Code)
	case err != nil:
		out = nil
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if out != nil {
		if encErr := enc.Encode(out); encErr != nil {
			return encErr
		}
	}
	return err
}

func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
