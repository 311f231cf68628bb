package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/retrysafe/payments/internal/config"
)

// listenFDVar names the environment variable through which the demo's
// supervisor hands the listening socket to the server (its file
// descriptor number in the child).
const listenFDVar = "LISTEN_FD"

// listen opens the server's socket: the one inherited as file descriptor
// fd when the supervisor passed one, or a new one on addr.
func listen(addr, fd string) (net.Listener, error) {
	if fd == "" {
		return net.Listen("tcp", addr)
	}
	n, err := strconv.Atoi(fd)
	if err != nil || n < 3 {
		return nil, fmt.Errorf("%s=%q: want an inherited file descriptor (3 or more)", listenFDVar, fd)
	}
	f := os.NewFile(uintptr(n), "listener")
	defer f.Close() // FileListener dups it
	return net.FileListener(f)
}

// runDemo is `server demo`, what `make run` starts. The browser demo's
// "Crash at" control kills the server with a real SIGKILL between two
// phases of a charge, and the demo must show it coming back and the
// charge being finished once. So this process is a small supervisor:
//
//   - it runs the fake card processor itself, so the processor (and its
//     ledger, which shows one effect per downstream key) outlives the
//     server's crashes;
//   - it opens the listening socket and hands it to each server it starts
//     (LISTEN_FD), so that a browser's requests during a restart wait in
//     the socket's queue instead of being refused;
//   - it runs the server (this same binary, `serve`) as a child process
//     with DEMO_MODE on, and starts it again whenever it dies.
//
// On SIGINT or SIGTERM it stops the server gracefully and returns.
func runDemo(ctx context.Context, cfg config.Server, log *slog.Logger, stdout io.Writer) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	processorURL := cfg.ProcessorURL
	if processorURL == "" {
		stopProcessor, url, err := startProcessor(log, fmt.Sprintf("http://127.0.0.1:%d/webhooks/processor", port), cfg.ProcessorWebhookSecret)
		if err != nil {
			return err
		}
		defer stopProcessor()
		processorURL = url
	}
	socket, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	defer socket.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// The child's environment is this one, with the demo's settings last
	// (the last value of a repeated variable wins).
	env := append(os.Environ(), "DEMO_MODE=true", "PROCESSOR_URL="+processorURL, listenFDVar+"=3")
	log.Info("demo: listening; the server runs as a child process and is restarted when it dies",
		"addr", ln.Addr().String(), "processor", processorURL)

	delay, failures := 100*time.Millisecond, 0
	for {
		started := time.Now()
		cmd := exec.Command(exe, "serve")
		cmd.Env = env
		cmd.ExtraFiles = []*os.File{socket} // file descriptor 3 in the child
		cmd.Stdout, cmd.Stderr = stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("demo: start the server: %w", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return nil
		case err := <-exited:
			// A server that ran for a while and died (the demo's crash) is
			// started again at once; one that keeps dying at start-up (a
			// bad setting, no database) is given up on.
			if time.Since(started) > 5*time.Second {
				delay, failures = 100*time.Millisecond, 0
			} else if failures++; failures >= 5 {
				return errors.Join(errors.New("demo: the server keeps failing at start-up"), err)
			}
			log.Warn("demo: the server exited; starting it again", "err", err, "in", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, 2*time.Second)
		}
	}
}
