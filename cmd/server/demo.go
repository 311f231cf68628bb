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

// The variables through which the demo's supervisor hands the server its
// listening socket, and a pipe it writes a byte to once it serves (their
// file descriptor numbers in the child).
const (
	listenFDVar = "LISTEN_FD"
	readyFDVar  = "READY_FD"
)

// signalReady tells the supervisor, through the pipe inherited as file
// descriptor fd, that this server is serving.
func signalReady(fd string) error {
	n, err := strconv.Atoi(fd)
	if err != nil || n < 3 {
		return fmt.Errorf("%s=%q: want an inherited file descriptor (3 or more)", readyFDVar, fd)
	}
	f := os.NewFile(uintptr(n), "ready")
	defer f.Close()
	_, err = f.Write([]byte{1})
	return err
}

// stopWhenOrphaned calls stop once this process's parent is gone (its
// parent's pid changes), so that neither the supervisor nor its server
// outlives what started it, however that ended.
func stopWhenOrphaned(ctx context.Context, stop func()) {
	parent := os.Getppid()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if os.Getppid() != parent {
				stop()
				return
			}
		}
	}
}

// listen opens the server's socket: the one inherited as file descriptor
// fd when the supervisor passed one, or a new one on addr.
func listen(addr, fd string) (net.Listener, error) {
	if fd == "" {
		return listenTCP(addr)
	}
	n, err := strconv.Atoi(fd)
	if err != nil || n < 3 {
		return nil, fmt.Errorf("%s=%q: want an inherited file descriptor (3 or more)", listenFDVar, fd)
	}
	f := os.NewFile(uintptr(n), "listener")
	defer f.Close() // FileListener dups it
	return net.FileListener(f)
}

// listenTCP listens on addr, and says how to pick another if it is taken.
func listenTCP(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%w\n\n%s is taken: pick another with HTTP_ADDR (HTTP_ADDR=127.0.0.1:8081), or `make run PORT=8081`", err, addr)
	}
	return ln, err
}

// openURL is where a person opens the server at addr in a browser.
func openURL(addr net.Addr) string {
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// runDemo is `server demo`, what `make run` starts. The demo's "Crash at"
// control kills the server with a real SIGKILL between two phases of a
// charge, and the demo must show it coming back and the charge finished
// once. So this process is a small supervisor that:
//
//   - runs the fake card processor, so that it (and its ledger: one effect
//     per downstream key) outlives the server's crashes;
//   - hands its listening socket to each server it starts (LISTEN_FD), so
//     requests during a restart wait in the socket's queue, not refused;
//   - runs the server (this binary, `serve`) as a child with DEMO_MODE on,
//     and starts it again whenever it dies.
//
// On SIGINT or SIGTERM it stops the server gracefully and returns.
func runDemo(ctx context.Context, cfg config.Server, log *slog.Logger, stdout io.Writer) error {
	ln, err := listenTCP(cfg.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	processorURL := cfg.ProcessorURL
	// The environment the server starts with: this one, with the demo's
	// settings last (the last value of a repeated variable wins).
	env := append(os.Environ(), "DEMO_MODE=true", listenFDVar+"=3", readyFDVar+"=4")
	if processorURL == "" {
		stopProcessor, url, secret, err := startProcessor(log, ln.Addr().(*net.TCPAddr).Port, cfg.ProcessorWebhookSecret, true)
		if err != nil {
			return err
		}
		defer stopProcessor()
		processorURL = url
		env = append(env, "PROCESSOR_WEBHOOK_SECRET="+string(secret))
	}
	env = append(env, "PROCESSOR_URL="+processorURL)
	socket, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	defer socket.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	log.Info("demo: listening; open "+openURL(ln.Addr())+" in a browser (the server runs as a child process, restarted when it dies)",
		"addr", ln.Addr().String(), "processor", processorURL)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go stopWhenOrphaned(ctx, stop)
	// A server that dies after it began to serve (the demo's crash) is
	// started again at once. One that dies before it serves failed to
	// start (a bad setting, no database): it is started again after a
	// growing pause, and given up on after a few tries in a row.
	const maxStartFailures, startBackoff = 5, 500 * time.Millisecond
	delay, failures := startBackoff, 0
	for {
		server, err := startChild(exe, env, socket, stdout)
		if err != nil {
			return fmt.Errorf("demo: start the server: %w", err)
		}
		select {
		case <-ctx.Done():
			_ = server.process.Signal(syscall.SIGTERM)
			<-server.exited
			return nil
		case err := <-server.exited:
			if server.ready {
				delay, failures = startBackoff, 0
				log.Warn("demo: the server exited; starting it again", "err", err)
				continue
			}
			if failures++; failures >= maxStartFailures {
				return errors.Join(fmt.Errorf("demo: the server failed to start %d times in a row", failures), err)
			}
			log.Warn("demo: the server failed to start; trying again", "err", err, "in", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, 10*time.Second)
		}
	}
}

// child is a server the supervisor started.
type child struct {
	process *os.Process
	ready   bool // it wrote to its ready pipe; set before exited receives
	exited  chan error
}

// startChild starts this binary's server as a child, serving on socket.
func startChild(exe string, env []string, socket *os.File, stdout io.Writer) (*child, error) {
	readR, readW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "serve")
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{socket, readW} // file descriptors 3 and 4 in the child
	cmd.Stdout, cmd.Stderr = stdout, os.Stderr
	err = cmd.Start()
	_ = readW.Close() // the child has its own copy
	if err != nil {
		_ = readR.Close()
		return nil, err
	}
	c := &child{process: cmd.Process, exited: make(chan error, 1)}
	go func() {
		// The read returns at the ready byte, or at the child's exit (its end
		// of the pipe closes): either way before the wait does.
		var b [1]byte
		n, _ := readR.Read(b[:])
		_ = readR.Close()
		c.ready = n == 1
		c.exited <- cmd.Wait()
	}()
	return c, nil
}
