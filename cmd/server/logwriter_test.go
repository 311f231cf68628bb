package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log's output that tests read while the batch writer's
// timer may be writing to it.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSuffix(l.b.String(), "\n"), "\n")
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines wait for their batch: none is written before the interval, a
// warning or Close, and Close writes them all, in one write, in order.
func TestLogLinesWaitForTheirBatch(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	log, closeLog := newLogger(&out, "json", time.Hour)
	log.Info("one")
	log.Info("two")
	if s := out.String(); s != "" {
		t.Fatalf("written before the interval, a warning or Close:\n%s", s)
	}
	if err := closeLog(); err != nil {
		t.Fatal(err)
	}
	if got := messages(t, out.lines()); got != "one two" || out.writes != 1 {
		t.Errorf("after Close: %q in %d writes; want \"one two\" in 1", got, out.writes)
	}
	// After Close, a line is written as it is logged.
	log.Info("three")
	if got := messages(t, out.lines()); got != "one two three" {
		t.Errorf("a line after Close: %q", got)
	}
}

// The interval's timer writes a batch without anyone flushing it.
func TestLogLinesAreWrittenWhenTheIntervalEnds(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	log, closeLog := newLogger(&out, "json", 10*time.Millisecond)
	defer closeLog()
	log.Info("one")
	for deadline := time.Now().Add(10 * time.Second); out.String() == ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the line was not written 10s after it was logged, with a 10ms interval")
		}
	}
	if got := messages(t, out.lines()); got != "one" {
		t.Errorf("%q", got)
	}
}

// A warning, and so a 5xx's request line, is written at once, after every
// line logged before it.
func TestLogWarningsAreWrittenAtOnce(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	log, closeLog := newLogger(&out, "json", time.Hour)
	defer closeLog()
	log.Info("before")
	log.Warn("the database is unreachable")
	if got := messages(t, out.lines()); got != "before the database is unreachable" {
		t.Errorf("after a warning: %q", got)
	}
	log.Info("after")
	log.Error("failed")
	if got := messages(t, out.lines()); got != "before the database is unreachable after failed" {
		t.Errorf("after an error: %q", got)
	}
}

// A batch that reaches its size is written by the line that filled it, so
// a burst of lines costs a bounded amount of memory.
func TestLogBatchIsWrittenWhenFull(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	w := newBatchWriter(&out, time.Hour)
	w.maxBatch = 100
	line := strings.Repeat("x", 39) + "\n" // 40 bytes
	for i := range 3 {
		if _, err := w.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if want := []int{0, 0, 120}[i]; len(out.String()) != want {
			t.Errorf("after line %d: %d bytes written; want %d", i+1, len(out.String()), want)
		}
	}
}

// Many goroutines logging at once, with batches going out by the timer and
// by size at the same time: every line arrives whole, once, and each
// goroutine's lines in the order it logged them.
func TestLogBatchesKeepLinesWholeAndInOrder(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	w := newBatchWriter(&out, time.Millisecond)
	w.maxBatch = 4 << 10
	log, _ := newLogger(w, "json", 0) // w is the output; no second batch writer
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				log.Info("line", "writer", g, "seq", i)
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	next := make([]int, writers)
	lines := out.lines()
	for _, l := range lines {
		var rec struct{ Writer, Seq int }
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("a line that is not whole: %q: %v", l, err)
		}
		if rec.Seq != next[rec.Writer] {
			t.Fatalf("writer %d: line %d where %d was next", rec.Writer, rec.Seq, next[rec.Writer])
		}
		next[rec.Writer]++
	}
	if len(lines) != writers*each {
		t.Errorf("%d lines; want %d", len(lines), writers*each)
	}
	if out.writes >= len(lines) {
		t.Errorf("%d writes for %d lines: not batched", out.writes, len(lines))
	}
	t.Logf("%d lines in %d writes", len(lines), out.writes)
}

// messages is the msg of each JSON line, space-separated.
func messages(t *testing.T, lines []string) string {
	t.Helper()
	var msgs []string
	for _, l := range lines {
		if l == "" {
			continue
		}
		var rec struct{ Msg string }
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		msgs = append(msgs, rec.Msg)
	}
	return strings.Join(msgs, " ")
}
