package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
)

// The most common retry is a duplicate of a request still running (a
// double click, a timeout): rather than a 409, it waits on the server, up
// to StoreConfig.Wait, for the original's response.
//
// Waiting holds no database connection. The waiter registers with the
// Listener, marks the record awaited (its completion then NOTIFYs,
// migration 0021) and reads it again: a completion committed before the
// mark is found by that read, a later one notified. It sleeps until woken,
// the lease could lapse (a dead owner notifies nobody), a slow timer (a
// lost notification) or its deadline, then looks again.

// recheckEvery is the slow timer, for a notification that got lost.
const recheckEvery = time.Second

// nextLook says when a waiter looks again at busy, with left to wait: at
// the lease's lapse, the slow timer or the deadline, whichever is first
// (unless woken).
func nextLook(busy *busyError, left time.Duration) (time.Duration, string) {
	lapse := secondsOf(busy.leaseRemaining) + 10*time.Millisecond
	after, cause := recheckEvery, metrics.WakeTimer
	if lapse < after {
		after, cause = lapse, metrics.WakeLease
	}
	if left < after {
		after, cause = left, metrics.WakeDeadline
	}
	return after, cause
}

// waitForOriginal waits for the live owner of req's record (busy) to
// finish, then answers as found does (taking over with h if the lease
// lapsed). At StoreConfig.Wait, or when the client goes away, it gives up
// with the last busyError.
func (s *Store) waitForOriginal(ctx context.Context, req Request, h Step, busy *busyError) (*Response, error) {
	deadline := time.Now().Add(s.wait)
	started := time.Now()
	defer func() { metrics.IdempotencyWaitSeconds.Observe(time.Since(started).Seconds()) }()
	for {
		wake, stop := s.waiters.watch(busy.rec.CallerID, busy.rec.ID)
		// Marked once (never cleared): a storm's waiters need not each mark it.
		if !busy.rec.Awaited {
			s.await(ctx, busy.rec)
		}
		observed, span := startClaim(ctx, req)
		lease, resp, err := s.found(observed, req)
		span.End()
		if errors.Is(err, errNoRecord) { // swept since: a retry starts anew
			err = resumable("in time")
		}
		if lease != nil {
			stop()
			return s.driveFor(ctx, req, lease, h)
		}
		var again *busyError
		if !errors.As(err, &again) {
			stop()
			return resp, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			stop()
			return nil, again
		}
		after, cause := nextLook(again, left)
		timer := time.NewTimer(after)
		select {
		case <-wake:
			cause = metrics.WakeNotified
		case <-timer.C:
		case <-ctx.Done():
			cause = metrics.WakeGone
		}
		timer.Stop()
		stop()
		metrics.IdempotencyWaitWakeups.WithLabelValues(cause).Inc()
		if ctx.Err() != nil {
			return nil, again // the client is gone: nobody to answer
		}
		// A waiter woken by an owner in this process finds its answer cached.
		if cached, ok := s.replays.get(req.CallerID, req.Key); ok {
			return replayCached(ctx, req, cached)
		}
		busy = again
	}
}

// await marks rec as waited for, so that its completion notifies. Best
// effort: if it fails, the waiter finds the answer on its slow timer.
func (s *Store) await(ctx context.Context, rec Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := queries.AwaitIdempotencyKey(ctx, s.pool, dbsqlc.AwaitIdempotencyKeyParams{CallerID: rec.CallerID, ID: rec.ID}); err != nil {
		s.log.WarnContext(ctx, "mark idempotency key awaited", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}
