// Command processor runs the fake card processor as its own process, so its
// state (charges, refunds, stored idempotent answers) survives restarts and
// crashes of the payments server that calls it.
//
// Configuration comes from the environment, through processor.LoadConfig
// (PROCESSOR_ADDR, default :8081; WEBHOOK_URL, WEBHOOK_SECRET, CHAOS_*, ...).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "processor:", err)
		os.Exit(1)
	}
}

// shutdownTimeout bounds the graceful shutdown, which releases withheld
// answers at its start (processor.Server.Close).
const shutdownTimeout = 10 * time.Second

// run is the whole program, with its inputs passed in so tests can drive it.
// It returns when ctx is canceled (after a graceful shutdown) or on error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: configure with environment variables", args)
	}
	cfg, err := fakeprocessor.LoadConfig(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	cfg.Logger = log
	p, err := fakeprocessor.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		// As in cmd/server: a signal must not cancel in-flight requests;
		// graceful shutdown lets them finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	// Shutdown waits for active requests, which a withheld answer
	// (pm_card_timeout) holds up to TimeoutHold: release them at once.
	srv.RegisterOnShutdown(p.Close)

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	log.Info("listening", "addr", ln.Addr().String(), "webhooks", cfg.WebhookURL != "")

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
