package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/retrysafe/payments/internal/metrics"
)

// These tests pin down the heartbeat (a live owner keeps its short lease;
// a renewal after a takeover is refused, and stops its owner) and the
// waiting duplicates (woken by the record's notification; the wait holds
// no connection).

// listeningStore is a store whose duplicates wait up to wait, with a
// listener of its own.
func listeningStore(t *testing.T, lease, wait time.Duration) (*Store, *pgxpool.Pool) {
	t.Helper()
	s, pool := newStore(t, lease)
	l := NewListener(func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	running.Go(func() { l.Run(ctx) })
	t.Cleanup(func() { stop(); running.Wait() })
	// Listening before the test begins: the wake-up every waiter gets when
	// the listener's LISTEN takes effect (it may have missed a
	// notification while connecting) must not land in the test.
	select {
	case <-l.listening:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener is not listening after 10s")
	}
	s.waiters, s.wait = l, wait
	return s, pool
}

// A renewal is fenced like every other write: once a newer attempt has
// taken the record over, the old owner's renewal matches no row, the old
// owner learns it lost the lease, and its next phase is refused before it
// writes anything. The new owner's renewals go on.
func TestRenewalAfterTakeoverIsRefused(t *testing.T) {
	t.Parallel()
	// A lease long enough that a loaded machine does not lapse the new
	// owner's before its first renewal (a third of it); the old owner's is
	// lapsed by hand.
	s, pool := newStore(t, 3*time.Second)
	ctx := context.Background()
	req := testRequest(t, "renewed")
	old, _, err := s.claim(ctx, req)
	if err != nil || old == nil {
		t.Fatalf("claim: %v", err)
	}
	expireLease(t, pool, "renewed") // the old owner stalled past its lease
	newer, _, err := s.claim(ctx, req)
	if err != nil || newer == nil || newer.record.Attempt != 2 {
		t.Fatalf("takeover: %+v, %v; want attempt 2", newer, err)
	}
	var before time.Time
	if err := pool.QueryRow(ctx, `SELECT locked_until FROM idempotency_keys WHERE key = 'renewed'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	// The new owner's heartbeat starts with its claim, as serveExternal's does.
	stopNewer := newer.heartbeat(ctx, func() { t.Error("the new owner lost its lease") })
	defer stopNewer()

	lost := make(chan struct{})
	stop := old.heartbeat(ctx, func() { close(lost) })
	defer stop()
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the old owner's renewal after the takeover was not refused")
	}
	if err := old.Phase(ctx, createOrderPhase); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the old owner's phase after losing its lease: %v; want ErrLeaseLost", err)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Fatalf("%d orders written by a fenced-out owner", n)
	}

	// The new owner renews: its lease ends later after a heartbeat.
	waitForCondition(t, 10*time.Second, "the new owner's lease to be renewed", func() bool {
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT locked_until FROM idempotency_keys WHERE key = 'renewed'`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now.After(before)
	})
}

// Once stop returns, the heartbeat sends nothing: an owner that has
// finished is never told afterwards that its lease was lost (which would
// make Drive answer with the record instead of its own response), and the
// lease it let go is not extended. Here the record's lease is lapsed after
// the stop, so any renewal would find it lost.
func TestStoppedHeartbeatSendsNothing(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, 600*time.Millisecond) // a renewal every 200 ms
	ctx := context.Background()
	l, _, err := s.claim(ctx, testRequest(t, "stopped"))
	if err != nil || l == nil {
		t.Fatalf("claim: %v", err)
	}
	stop := l.heartbeat(ctx, func() { t.Error("a stopped heartbeat said the lease was lost") })
	stop()
	expireLease(t, pool, "stopped")
	// Three renewals' worth of time: long enough for a heartbeat that did
	// not stop to send one, and to hear back.
	time.Sleep(3 * s.lease / 3)
	if l.lost.Load() {
		t.Fatal("the lease was marked lost after the heartbeat stopped")
	}
}

// A live owner keeps its lease however long it works (up to MaxRun, three
// leases here): with a 1.5s lease, an operation that takes two leases is
// never taken over by the duplicates that ask meanwhile, and completes
// under its first attempt.
func TestHeartbeatKeepsALiveOwnersLease(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, 1500*time.Millisecond)
	ctx := context.Background()
	req := testRequest(t, "slow")
	release := make(chan struct{})
	done := make(chan *Response, 1)
	go func() {
		resp, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
			<-release // a slow operation: a processor call that takes its time
			return l.Phase(ctx, createOrderPhase)
		})
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	waitForCondition(t, 10*time.Second, "the original to own the key", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'slow'`).Scan(&n)
		return n == 1
	})
	for start := time.Now(); time.Since(start) < 2*s.lease; {
		if _, _, err := s.claim(ctx, req); !errors.As(err, new(*busyError)) {
			t.Fatalf("a duplicate, %s into the operation: %v; want the key still held", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond) // asking again, as clients do, for two leases
	}
	close(release)
	resp := <-done
	rec, err := s.Get(ctx, "acme", "slow")
	if err != nil || rec.Status != StatusCompleted || rec.Attempt != 1 || resp == nil || resp.Status != http.StatusCreated {
		t.Fatalf("record %+v (%v), response %+v; want completed under attempt 1", rec, err, resp)
	}
}

// A duplicate that finds the original in progress waits, and is answered
// with the original's stored response, replayed, once it is stored. If it
// slept, it was woken by its record's notification, and counted so (not
// t.Parallel: the wake-up counters are the process's, and no other test
// runs meanwhile). It may not sleep at all: the original can commit
// between the duplicate's mark and its read after it, which finds the
// answer.
func TestDuplicateWaitsForTheOriginal(t *testing.T) {
	wakeups := func(cause string) float64 {
		return testutil.ToFloat64(metrics.IdempotencyWaitWakeups.WithLabelValues(cause))
	}
	causes := []string{metrics.WakeNotified, metrics.WakeTimer, metrics.WakeLease, metrics.WakeDeadline, metrics.WakeGone}
	before := map[string]float64{}
	for _, c := range causes {
		before[c] = wakeups(c)
	}
	s, pool := listeningStore(t, 10*time.Second, 30*time.Second)
	ctx := context.Background()
	req := testRequest(t, "waited")
	release := make(chan struct{})
	original := make(chan *Response, 1)
	go func() {
		resp, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
			<-release
			return l.Phase(ctx, createOrderPhase)
		})
		if err != nil {
			t.Error(err)
		}
		original <- resp
	}()
	waitForCondition(t, 10*time.Second, "the original to own the key", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'waited'`).Scan(&n)
		return n == 1
	})
	duplicate := make(chan *Response, 1)
	go func() {
		resp, err := s.serveExternal(ctx, req, claimOnly, func(context.Context, *Lease) error {
			t.Error("the duplicate ran the operation")
			return nil
		})
		if err != nil {
			t.Errorf("the duplicate: %v; want the original's answer", err)
		}
		duplicate <- resp
	}()
	waitForCondition(t, 10*time.Second, "the duplicate to mark the record awaited", func() bool {
		var awaited bool
		_ = pool.QueryRow(ctx, `SELECT awaited FROM idempotency_keys WHERE key = 'waited'`).Scan(&awaited)
		return awaited
	})
	close(release)
	first, second := <-original, <-duplicate
	if first == nil || second == nil || !second.Replayed || second.Status != first.Status || !bytes.Equal(second.Body, first.Body) {
		t.Fatalf("original %+v, duplicate %+v; want the same stored response, the duplicate's replayed", first, second)
	}
	woken := map[string]float64{}
	for _, c := range causes {
		if n := wakeups(c) - before[c]; n != 0 {
			woken[c] = n
		}
	}
	if len(woken) > 0 && (len(woken) != 1 || woken[metrics.WakeNotified] != 1) {
		t.Errorf("wake-ups %v; want none, or the duplicate's one, by notification", woken)
	}
}

// A waiter gives up at its deadline with a 409, when the original is still
// working; and with no time to wait, a duplicate is answered at once.
func TestWaitEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	s, _ := listeningStore(t, 10*time.Second, 300*time.Millisecond)
	ctx := context.Background()
	req := testRequest(t, "deadline")
	if _, _, err := s.claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, err := s.serveExternal(ctx, req, claimOnly, func(context.Context, *Lease) error { return errors.New("must not run") })
	wantInProgress(t, err)
}

// The listener wakes the waiters of a record when it is notified, and
// every waiter when it loses its connection (whatever was notified
// meanwhile is lost); it then listens again.
func TestListenerWakesWaiters(t *testing.T) {
	t.Parallel()
	s, pool := listeningStore(t, 10*time.Second, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "notified")
	owner, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := owner.record.ID

	wake, stop := s.waiters.watch("acme", id)
	defer stop()
	s.await(ctx, owner.record)
	if err := owner.Phase(ctx, createOrderPhase); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by its record's completion")
	}

	// Drop the listener's connection: every waiter is woken, and the
	// listener connects again.
	other, stopOther := s.waiters.watch("acme", id+1000)
	defer stopOther()
	waitForCondition(t, 10*time.Second, "the listener's connection to be dropped", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+listenChannel+`'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	select {
	case <-other:
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter was not woken when the listener lost its connection")
	}
	waitForCondition(t, 30*time.Second, "the listener to listen again", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+listenChannel+`'`).Scan(&n)
		return n > 0
	})
}

// waitForCondition polls cond until it holds, failing the test after
// timeout: it waits for a state another goroutine or the database
// reaches, never for time itself.
func waitForCondition(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %s: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An owner fenced out after the newer owner finished answers with the
// newer owner's stored response, and its Idempotency-Outcome says
// replayed: the request's own claim was new, but the answer it gives is
// not its own work.
func TestFencedOutOwnerAnswersWithAReplay(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, 10*time.Second)
	req := testRequest(t, "fenced-out")
	ctx, outcome := WithOutcome(context.Background())
	old, _, err := s.claim(ctx, req)
	if err != nil || old == nil || outcome() != "new" {
		t.Fatalf("claim: %v, outcome %q; want new", err, outcome())
	}
	expireLease(t, pool, "fenced-out") // the old owner stalled past its lease
	newer, _, err := s.claim(context.Background(), req)
	if err != nil || newer == nil {
		t.Fatalf("takeover: %v", err)
	}
	handler := func(ctx context.Context, l *Lease) error { return l.Phase(ctx, createOrderPhase) }
	if _, err := s.Drive(context.Background(), newer, handler, time.Second); err != nil {
		t.Fatal(err)
	}

	resp, err := s.Drive(ctx, old, handler, time.Second)
	if err != nil || resp == nil || resp.Status != http.StatusCreated || !resp.Replayed {
		t.Fatalf("the fenced-out owner answered %+v, %v; want the stored 201, replayed", resp, err)
	}
	if outcome() != "replayed" {
		t.Errorf("its outcome says %q; want replayed", outcome())
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}
