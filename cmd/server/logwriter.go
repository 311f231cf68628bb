package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// batchWriter gathers log lines and writes them out together: the first
// line of a batch starts a timer, and the batch is written when it fires
// (LOG_FLUSH_INTERVAL, 20 ms by default), when it reaches maxBatch bytes,
// or when a warning or an error is logged (flushOnWarn). It is an access
// log's buffer, as nginx's "access_log ... buffer= flush=" is: every
// request logs a line, and writing each one alone was a system call per
// request, the only one the service made that a bare server does not
// (docs/performance.md). Batched, a loaded server makes one write for many
// requests.
//
// What it costs: a line reaches the log up to the interval late (its time
// field still says when it was logged), and a process killed outright
// (SIGKILL, out of memory, a fatal runtime error) loses the lines still
// waiting: about its last interval's, more if its output was blocked. A warning or an error is written at once, with
// every line before it, so the lines that say what went wrong are not the
// ones that wait; a graceful shutdown writes everything (Close). Nothing
// the API promises is in the log: a lost line loses no money and no
// record.
//
// The lines stay whole and in order: a handler hands each line to Write
// in one call, Write appends it under mu, and batches are written one at
// a time under writing, each taken from the buffer only once the one
// before it is out.
type batchWriter struct {
	out      io.Writer
	interval time.Duration
	maxBatch int

	writing sync.Mutex // held while a batch is written: batches go out in order
	spare   []byte     // the buffer last written, for reuse; guarded by writing

	mu     sync.Mutex // guards buf and closed
	buf    []byte
	closed bool
	timer  *time.Timer
}

// defaultMaxBatch bounds the memory a batch holds: a burst of lines is
// written when it reaches this size, without waiting for the timer.
const defaultMaxBatch = 64 << 10

func newBatchWriter(out io.Writer, interval time.Duration) *batchWriter {
	w := &batchWriter{out: out, interval: interval, maxBatch: defaultMaxBatch}
	w.timer = time.AfterFunc(time.Hour, func() { _ = w.Flush() })
	w.timer.Stop()
	return w
}

// Write adds p, one whole line, to the batch. It never blocks on the
// output unless the batch is full, and then it writes the batch itself,
// as an unbatched writer would: a log that cannot keep up slows its
// writers down rather than growing without bound.
func (w *batchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		w.writing.Lock() // after the last batch
		defer w.writing.Unlock()
		return w.out.Write(p)
	}
	first := len(w.buf) == 0
	w.buf = append(w.buf, p...)
	full := len(w.buf) >= w.maxBatch
	if first && !full {
		// The timer is armed by the batch's first line, and under mu, so
		// that no line waits longer than the interval even if this
		// goroutine is paused right after. (A timer still armed for a
		// batch that filled up and went out early fires on this one a
		// little sooner, which is harmless.)
		w.timer.Reset(w.interval)
	}
	w.mu.Unlock()
	if full {
		if err := w.Flush(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes the lines gathered so far.
func (w *batchWriter) Flush() error { return w.flush(false) }

// Close writes what is left; after it, every line is written as it comes.
func (w *batchWriter) Close() error {
	w.timer.Stop()
	return w.flush(true)
}

// flush writes the batch; with closing, it also sends every later line
// straight out, in the same step, so that none can go out before the
// last batch.
func (w *batchWriter) flush(closing bool) error {
	w.writing.Lock()
	defer w.writing.Unlock()
	w.mu.Lock()
	batch := w.buf
	w.buf = w.spare[:0]
	w.closed = w.closed || closing
	w.mu.Unlock()
	if len(batch) == 0 {
		w.spare = batch
		return nil
	}
	_, err := w.out.Write(batch)
	w.spare = batch[:0]
	return err
}

// flushOnWarn writes the batch at once after every record at slog.LevelWarn
// or above.
type flushOnWarn struct {
	slog.Handler
	w *batchWriter
}

func (h flushOnWarn) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		if ferr := h.w.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h flushOnWarn) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushOnWarn{h.Handler.WithAttrs(attrs), h.w}
}

func (h flushOnWarn) WithGroup(name string) slog.Handler {
	return flushOnWarn{h.Handler.WithGroup(name), h.w}
}
