// Package worker is the run loop that the background workers share (the
// reconciler and the outbox relay), so that each of them is only its scan.
package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// A Scan handles up to one batch of due work and says how much it found.
type Scan func(ctx context.Context) (int, error)

// Run calls scan until ctx is done. After a scan that filled its batch it
// scans again at once, since more may be waiting; after a short scan, or a
// failed one (logged), it waits interval. It checks ctx before every scan,
// so it returns promptly once ctx is done, whatever the scans return.
func Run(ctx context.Context, name string, interval time.Duration, batch int, log *slog.Logger, scan Scan) {
	for ctx.Err() == nil {
		n, err := scan(ctx)
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, name+": scan failed", "err", err)
		}
		if err == nil && n >= batch {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// Problems collects what is wrong with a worker's configuration, so that
// its constructor reports every mistake at once and a bad configuration
// fails at start-up, never as a loop that misbehaves later.
type Problems []string

// Check notes the problem when ok is false.
func (p *Problems) Check(ok bool, format string, args ...any) {
	if !ok {
		*p = append(*p, fmt.Sprintf(format, args...))
	}
}

// Err is nil when nothing was noted.
func (p Problems) Err(worker string) error {
	if len(p) == 0 {
		return nil
	}
	return fmt.Errorf("%s: invalid configuration: %v", worker, []string(p))
}
