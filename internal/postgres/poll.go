package postgres

import (
	"context"
	"log/slog"
	"time"
)

// A Scan handles up to one batch of due rows (claimed with FOR UPDATE SKIP
// LOCKED, so several processes share the work) and says how many it found.
type Scan func(ctx context.Context) (int, error)

// Poll is the loop of the background workers that poll a table for due
// rows (the reconciler, the outbox relay): it calls scan until ctx is done.
// After a scan that filled its batch it scans again at once, since more
// may be waiting; after a short scan, or a failed one (logged), it waits
// interval. It checks ctx before every scan, so it returns promptly.
func Poll(ctx context.Context, name string, interval time.Duration, batch int, log *slog.Logger, scan Scan) {
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
