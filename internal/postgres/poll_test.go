package postgres

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// A loop whose every scan fills its batch still stops when canceled, and
// one whose scans keep failing does too.
func TestPollStopsWhenCanceled(t *testing.T) {
	t.Parallel()
	for name, scan := range map[string]Scan{
		"always a full batch": func(context.Context) (int, error) { return 10, nil },
		"always failing":      func(context.Context) (int, error) { return 0, errors.New("database down") },
		"never anything":      func(context.Context) (int, error) { return 0, nil },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			var scans atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				Poll(ctx, "test", time.Hour, 10, quiet, func(ctx context.Context) (int, error) {
					scans.Add(1)
					return scan(ctx)
				})
			}()
			for scans.Load() == 0 {
				time.Sleep(time.Millisecond) // until the loop is running
			}
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Poll did not return after its context was canceled")
			}
		})
	}
}

// Full batches run back to back; a short one is followed by a pause (here
// an hour), during which no scan starts.
func TestPollPausesOnlyAfterAShortBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := []int{5, 5, 2} // two full batches, then a short one
	var scans atomic.Int64
	third := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Poll(ctx, "test", time.Hour, 5, quiet, func(context.Context) (int, error) {
			i := scans.Add(1) - 1
			if i == 2 {
				close(third)
			}
			if i < int64(len(results)) {
				return results[i], nil
			}
			return 0, nil
		})
	}()
	select {
	case <-third: // the two full batches were followed at once by more
	case <-time.After(10 * time.Second):
		t.Fatal("a full batch was not followed by another scan")
	}
	cancel()
	<-done
	if n := scans.Load(); n != 3 {
		t.Errorf("%d scans; want 3: after the short batch the loop waits", n)
	}
}
