// Command paycli drives the payments API through the retry-safe client
// (package client), for demos and scripts. It prints the API's answer as
// indented JSON on stdout. `paycli help` lists the commands (the table
// below) and the flags they all take: --url, --api-key, --idempotency-key
// to retry a logical operation you started before, and -v to print every
// attempt with its key, status and wait; `paycli help refund`, refund's.
//
// Why the standard library's flag package and not cobra: six commands fit
// in one table (commands, below) with a flag.FlagSet each, readable top to
// bottom without learning a framework; flag accepts -amount as well as
// --amount (cobra's pflag would read -amount as the shorthands -a -m -o …);
// and there is no new dependency. The price is printHelp and printFlags.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

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

// A command is one subcommand of paycli.
type command struct {
	name     string
	summary  string // one line, for the list of commands
	synopsis string // the command's own flags, for its usage line
	// flags defines the command's own flags on fs and returns the action
	// that makes the API call once fs has been parsed.
	flags func(fs *flag.FlagSet) action
}

// An action makes a command's API call with the parsed flags.
type action func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error)

var commands = []command{
	{
		name:     "order",
		summary:  "create an order",
		synopsis: "--amount N [--currency usd] [--description TEXT]",
		flags: func(fs *flag.FlagSet) action {
			amount := fs.Int64("amount", 0, "amount `N` in minor units, e.g. 1999 for 19.99")
			currency := fs.String("currency", "usd", "currency: usd, eur, gbp, jpy, chf, cad or aud")
			description := fs.String("description", "", "order description")
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				body := apiclient.CreateOrderRequest{Amount: *amount, Currency: apiclient.Currency(*currency)}
				if *description != "" {
					body.Description = description
				}
				return c.CreateOrder(ctx, body, common.options()...)
			}
		},
	},
	{
		name:     "charge",
		summary:  "charge an order with a payment method",
		synopsis: "--order ID [--payment-method pm_card_visa]",
		flags: func(fs *flag.FlagSet) action {
			order := fs.String("order", "", "`ID` of the order to charge (ord_…)")
			pm := fs.String("payment-method", "pm_card_visa", "test payment `method`, e.g. pm_card_flaky to see retries")
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				return c.Charge(ctx, *order, apiclient.CreateChargeRequestPaymentMethod(*pm), common.options()...)
			}
		},
	},
	{
		name:     "refund",
		summary:  "refund a charge, in full or in part",
		synopsis: "--charge ID [--amount N]",
		flags: func(fs *flag.FlagSet) action {
			charge := fs.String("charge", "", "`ID` of the charge to refund (ch_…)")
			amount := fs.Int64("amount", 0, "amount `N` to refund, in minor units (default: the whole charge)")
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				var a *int64
				if *amount > 0 {
					a = amount
				}
				return c.Refund(ctx, *charge, a, common.options()...)
			}
		},
	},
	{
		name:     "payout",
		summary:  "pay out from the balance, and follow the payout to its end",
		synopsis: "--amount N [--currency usd] [--destination ba_test_ok] [--wait=false]",
		flags: func(fs *flag.FlagSet) action {
			amount := fs.Int64("amount", 0, "amount `N` in minor units")
			currency := fs.String("currency", "usd", "currency: usd, eur, gbp, jpy, chf, cad or aud")
			destination := fs.String("destination", "ba_test_ok", "test bank `account`: ba_test_ok, ba_test_closed, ba_test_flaky or ba_test_slow")
			wait := fs.Bool("wait", true, "poll the payout until it is paid or failed, as its Retry-After says (false: print the 202 and stop)")
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				dest := apiclient.CreatePayoutRequestDestination(*destination)
				po, res, err := c.Payout(ctx, apiclient.CreatePayoutRequest{Amount: *amount, Currency: apiclient.Currency(*currency), Destination: &dest}, common.options()...)
				if err != nil || !*wait {
					return po, res, err
				}
				// The 202 only says the payout was accepted: follow it.
				fmt.Fprintf(common.stderr, "payout %s accepted (%s); polling\n", po.Id, po.Status)
				last := po.Status
				po, err = c.WaitForPayout(ctx, po.Id, func(p apiclient.Payout) {
					if p.Status != last {
						fmt.Fprintf(common.stderr, "payout %s %s\n", p.Id, p.Status)
						last = p.Status
					}
				})
				return po, res, err
			}
		},
	},
	{
		name:    "balance",
		summary: "show the balance: available to pay out, and pending",
		flags: func(fs *flag.FlagSet) action {
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				b, err := c.Balance(ctx)
				return b, client.Result{}, err
			}
		},
	},
	{
		name:     "key",
		summary:  "show what the API recorded for an idempotency key",
		synopsis: "--key KEY",
		flags: func(fs *flag.FlagSet) action {
			key := fs.String("key", "", "the idempotency `KEY` to look up (--idempotency-key works too)")
			return func(ctx context.Context, c *client.Client, common *commonFlags) (any, client.Result, error) {
				k := cmp.Or(*key, common.key)
				if k == "" {
					return nil, client.Result{}, errors.New("key needs --key (run 'paycli key --help')")
				}
				return c.IdempotencyKey(ctx, k)
			}
		},
	},
}

// commonFlags are the flags every command accepts.
type commonFlags struct {
	url, apiKey, key string
	verbose          bool
	// stderr is where a command reports progress (not a flag).
	stderr io.Writer
}

// define defines the common flags on fs, their defaults read through getenv.
func (f *commonFlags) define(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&f.url, "url", cmp.Or(getenv("PAYMENTS_URL"), "http://localhost:8080"), "API base `URL`, or $PAYMENTS_URL")
	fs.StringVar(&f.apiKey, "api-key", cmp.Or(getenv("PAYMENTS_API_KEY"), "sk_test_acme"), "API `key`, or $PAYMENTS_API_KEY")
	fs.StringVar(&f.key, "idempotency-key", "", "idempotency `key`, to retry an operation started before (default: a new one per operation)")
	fs.BoolVar(&f.verbose, "v", false, "print every attempt: its key, status and wait")
}

func (f *commonFlags) options() []client.Option {
	if f.key == "" {
		return nil
	}
	return []client.Option{client.WithIdempotencyKey(f.key)}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printUsage(stderr)
		return errors.New("no command given")
	}
	name, args := args[0], args[1:]
	switch {
	case name == "help" && len(args) > 1:
		return errors.New("help takes one command (run 'paycli --help')")
	case name == "help" && len(args) == 1 && args[0] != "help":
		cmd, err := lookup(args[0])
		if err != nil {
			return err
		}
		printHelp(stdout, cmd)
		return nil
	case name == "help", name == "-h", name == "-help", name == "--help":
		printUsage(stdout)
		return nil
	}
	cmd, err := lookup(name)
	if err != nil {
		return err
	}

	fs := flag.NewFlagSet("paycli "+cmd.name, flag.ContinueOnError)
	// Parse only reports; run decides what to print, and where: help to
	// stdout, errors (with a hint) to main, which prints them on stderr.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	act := cmd.flags(fs)
	common := commonFlags{stderr: stderr}
	common.define(fs, getenv)
	hint := fmt.Sprintf("run 'paycli %s --help'", cmd.name)
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		printHelp(stdout, cmd)
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w (%s)", cmd.name, err, hint)
	case fs.NArg() > 0:
		return fmt.Errorf("%s: unexpected argument %q (%s)", cmd.name, fs.Arg(0), hint)
	}

	c, err := client.New(common.url, common.apiKey, client.DefaultPolicy(), nil)
	if err != nil {
		return err
	}
	if common.verbose {
		c.OnAttempt = func(a client.Attempt) {
			outcome := fmt.Sprintf("status=%d", a.Status)
			if a.Err != nil {
				outcome = fmt.Sprintf("error=%v", a.Err)
			}
			fmt.Fprintf(stderr, "attempt %d key=%s %s", a.Number, a.IdempotencyKey, outcome)
			if a.Wait > 0 {
				fmt.Fprintf(stderr, " retrying in %s", a.Wait)
			}
			fmt.Fprintln(stderr)
		}
	}

	out, res, err := act(ctx, c, &common)
	if common.verbose && res.Attempts > 0 { // 0: no call was made (key without --key)
		fmt.Fprintf(stderr, "done: %d attempt(s), key=%s, replayed=%v\n", res.Attempts, res.IdempotencyKey, res.Replayed)
	}
	if apiErr, ok := errors.AsType[*client.Error](err); ok {
		out, err = apiErr.Problem, fmt.Errorf("the API answered %d %s", apiErr.Status, apiErr.Problem.Code)
	} else if err != nil {
		out = nil
	}
	if out != nil {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if encErr := enc.Encode(out); encErr != nil {
			return encErr
		}
	}
	return err
}

// lookup finds the command called name.
func lookup(name string) (command, error) {
	if i := slices.IndexFunc(commands, func(c command) bool { return c.name == name }); i >= 0 {
		return commands[i], nil
	}
	if strings.HasPrefix(name, "-") {
		return command{}, fmt.Errorf("unknown flag %q: flags go after the command (run 'paycli --help')", name)
	}
	return command{}, fmt.Errorf("unknown command %q: want order, charge, refund, payout, balance or key (run 'paycli --help')", name)
}

// printUsage prints the commands and the common flags.
func printUsage(w io.Writer) {
	fmt.Fprint(w, "paycli drives the payments API through the retry-safe client.\n\nUsage:\n  paycli <command> [flags]\n\nCommands:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(w, "\nCommon flags, accepted by every command:\n")
	printFlags(w, commonFlagSet())
	fmt.Fprint(w, "\nRun 'paycli help <command>' or 'paycli <command> --help' for a command's own flags.\n")
}

// printHelp prints one command's usage, its own flags and the common ones.
func printHelp(w io.Writer, cmd command) {
	fmt.Fprintf(w, "Usage:\n  %s [common flags]\n\n", strings.Join(strings.Fields("paycli "+cmd.name+" "+cmd.synopsis), " "))
	fmt.Fprintf(w, "%s%s.\n\nFlags:\n", strings.ToUpper(cmd.summary[:1]), cmd.summary[1:])
	own := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.flags(own)
	printFlags(w, own)
	fmt.Fprint(w, "\nCommon flags:\n")
	printFlags(w, commonFlagSet())
}

// commonFlagSet holds the common flags with their built-in defaults, for
// help: help does not depend on the environment (nor print an API key
// taken from it).
func commonFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("common", flag.ContinueOnError)
	new(commonFlags).define(fs, func(string) string { return "" })
	return fs
}

// printFlags lists fs's flags, one a line, as --name, or -n for a
// one-letter name: flag.PrintDefaults writes -name, and the docs use --name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if arg != "" {
			name += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
	})
	_ = tw.Flush()
}
