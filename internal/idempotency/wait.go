package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
)

// The most common retry is a duplicate that arrives while the original is
// still running: a double click, a client that timed out and sent again, a
// load balancer that retried. Sent away with a 409, it would come back
// after its Retry-After and maybe again; instead it waits on the server,
// up to StoreConfig.Wait, and is answered with the original's stored
// response the moment it is stored.
//
// Waiting holds no database connection. The waiter registers with the
// process's Listener, marks the record awaited unless the claim found it
// marked already (from then on the record's completion NOTIFYs, migration
// 0021), and reads the record again: a
// completion that committed before the mark is found by that read, one
// that commits after it is notified. Then it sleeps until it is woken, or
// until the lease could lapse (an owner that died notifies nobody), or a
// slow timer (a lost notification), or its deadline; and on each wake it
// runs the claim again, which answers in every case the claim answers:
// the stored response, a takeover, a 422, or still busy; or, when the
// answer is already in this process's replay cache, answers from there.

// recheckEvery is the slow timer: how long a waiter trusts that a
// notification will come before it looks for itself.
const recheckEvery = time.Second

// waitForOriginal waits for the live owner of req's record (busy) to
// finish, and answers as the claim then does; if the owner's lease lapses
// meanwhile, this request takes the record over and drives it with h. It
// gives up after StoreConfig.Wait, or when the client goes away, and
// returns the last busyError.
func (s *Store) waitForOriginal(ctx context.Context, req Request, h Handler, busy *busyError) (*Response, error) {
	deadline := time.Now().Add(s.wait)
	started := time.Now()
	defer func() { metrics.IdempotencyWaitSeconds.Observe(time.Since(started).Seconds()) }()
	for {
		wake, stop := s.waiters.watch(busy.rec.CallerID, busy.rec.ID)
		// A record that was already marked when the claim read it
		// notifies from then on (the flag is never cleared): marking it
		// again would change nothing and cost each waiter of a storm a
		// round trip and a connection from the pool.
		if !busy.rec.Awaited {
			s.await(ctx, busy.rec)
		}
		lease, resp, err := s.claim(ctx, req)
		if lease != nil {
			stop()
			return s.run(ctx, req, lease, h)
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
		// Look again when the lease could lapse (its owner may have
		// died), on the slow timer, or at the deadline, whichever comes
		// first; or when woken.
		lapse := time.Duration(again.leaseRemaining*float64(time.Second)) + 10*time.Millisecond
		after, cause := recheckEvery, metrics.WakeTimer
		if lapse < after {
			after, cause = lapse, metrics.WakeLease
		}
		if left < after {
			after, cause = left, metrics.WakeDeadline
		}
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
		// An owner in this process puts its answer in the replay cache as
		// soon as it has committed it: a waiter woken then needs no claim.
		// (Woken before the owner got there, or by an owner on another
		// replica, it claims, as below.)
		if cached, ok := s.replays.get(req.CallerID, req.Key); ok {
			return replayCached(ctx, req, cached)
		}
		busy = again
	}
}

// await marks rec as waited for, so that its completion notifies. It is
// best effort: if it fails, the waiter still finds the answer on its slow
// timer.
func (s *Store) await(ctx context.Context, rec Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := queries.AwaitIdempotencyKey(ctx, s.pool, dbsqlc.AwaitIdempotencyKeyParams{CallerID: rec.CallerID, ID: rec.ID}); err != nil {
		s.log.WarnContext(ctx, "mark idempotency key awaited", "err", err, "caller", rec.CallerID, "key_id", rec.ID)
	}
}
