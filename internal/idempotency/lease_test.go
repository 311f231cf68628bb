package idempotency

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/problem"
)

// These tests pin down what the lease means: only that a live owner is
// working on the record. The 409 a duplicate gets says how long that owner
// may still hold it, and a record its owner let go of is a client's to
// resume at once, whatever the reconciler's schedule.

func retryAfterOf(t *testing.T, err error) int {
	t.Helper()
	var p *problem.Error
	if !errors.As(asAnswered(err), &p) || p.Code != problem.IdempotencyKeyInUse {
		t.Fatalf("got %v; want 409 idempotency_key_in_use", err)
	}
	return p.RetryAfter
}

func setLease(t *testing.T, pool *pgxpool.Pool, key, interval string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET locked_until = now() + $2::interval WHERE caller_id = 'acme' AND key = $1`, key, interval)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("set lease of %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// The Retry-After of a 409 says when asking again is useful: a second or
// two while the owner works (it renews its lease, and a retry waits on the
// server again), never later than the lease could lapse (then the retry
// takes over), and never less than a second.
func TestInProgressRetryAfterIsShortAndNeverPastTheLease(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, 20*time.Second)
	ctx := context.Background()
	req := testRequest(t, "held")
	if _, _, err := s.claim(ctx, req); err != nil {
		t.Fatal(err)
	}

	_, _, err := s.claim(ctx, req)
	if got := retryAfterOf(t, err); got != 2 {
		t.Errorf("Retry-After %d with about 20s of lease left; want 2", got)
	}

	setLease(t, pool, "held", "1.5 seconds")
	_, _, err = s.claim(ctx, req)
	if got := retryAfterOf(t, err); got != 2 && got != 1 {
		t.Errorf("Retry-After %d with 1.5s of lease left; want it rounded up (2, or 1 if a moment passed)", got)
	}

	setLease(t, pool, "held", "300 milliseconds")
	_, _, err = s.claim(ctx, req)
	if got := retryAfterOf(t, err); got != 1 {
		t.Errorf("Retry-After %d with 0.3s of lease left; want 1 (never less than a second)", got)
	}
}

// A transient failure releases the lease at once and puts the reconciler's
// next try a lease away: the client that was told to retry resumes the
// record immediately, and the reconciler does not race it.
func TestTransientFailureFreesTheRecordForTheClient(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "outage")
	unavailable := problem.New(problem.ServiceUnavailable, "downstream is down")
	_, err := s.serveExternal(ctx, req, claimOnly, func(context.Context, *Lease) error { return unavailable })
	if !errors.Is(err, unavailable) {
		t.Fatalf("first attempt: %v; want the transient failure", err)
	}

	var leaseLive bool
	var reconcilerWaits time.Duration
	if err := pool.QueryRow(ctx, `
		SELECT locked_until > now(), next_attempt_at - now()
		FROM idempotency_keys WHERE key = 'outage'`).Scan(&leaseLive, &reconcilerWaits); err != nil {
		t.Fatal(err)
	}
	if leaseLive {
		t.Error("the lease is still live after its owner gave up; a retry would be refused")
	}
	if reconcilerWaits < 50*time.Second {
		t.Errorf("the reconciler may try again in %s; want about a lease (1m), leaving the record to the client", reconcilerWaits)
	}
	if stale, err := s.ClaimStale(ctx, 10, []string{"createOrder"}); err != nil || len(stale) != 0 {
		t.Fatalf("the reconciler claimed %d records (err %v); want none before its time", len(stale), err)
	}

	// The client's retry takes over at once and finishes the operation.
	resp, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error { return l.Phase(ctx, createOrderPhase) })
	if err != nil || resp.Status != 201 {
		t.Fatalf("retry: %v, %v; want 201 at once", resp, err)
	}
}

// An owner whose lease ran out with nobody taking over is told its
// operation is resumable (503, retry at once), not that someone else holds
// it (409): nobody does.
func TestLapsedOwnerIsToldToRetry(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "lapsed-answer")
	_, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
		expireLease(t, pool, "lapsed-answer")
		return l.Phase(ctx, createOrderPhase)
	})
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != problem.ServiceUnavailable || p.RetryAfter != 1 {
		t.Fatalf("lapsed owner answered %v; want 503 service_unavailable with Retry-After 1", err)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Fatalf("%d orders; the lapsed owner's phase should have rolled back", n)
	}
}

// An unexpected failure (here a panic) after the first phase committed is
// not a final answer: an outside effect may be pending, so the record stays
// resumable at its recovery point, the lease is released, and the client
// is told to retry (503). Before the first phase the same failure is a
// stored 500 (TestPanicIsAFinalInternalError).
func TestFailureAfterTheFirstPhaseIsNeverFinal(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "half-done")
	_, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
		if err := l.Phase(ctx, func(context.Context, pgx.Tx) (Result, error) { return RecoveryPoint("charge_created"), nil }); err != nil {
			return err
		}
		panic("a bug after the processor was called")
	})
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != problem.ServiceUnavailable || p.RetryAfter < 1 {
		t.Fatalf("got %v; want a 503 service_unavailable with Retry-After", err)
	}
	var status, point string
	var leaseLive bool
	if err := pool.QueryRow(ctx, `SELECT status, recovery_point, locked_until > now() FROM idempotency_keys WHERE key = 'half-done'`).
		Scan(&status, &point, &leaseLive); err != nil {
		t.Fatal(err)
	}
	if Status(status) != StatusInProgress || point != "charge_created" || leaseLive {
		t.Errorf("record %s at %s, lease live %v; want in_progress at charge_created with the lease released", status, point, leaseLive)
	}
}
