package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every transaction that touches an order's charges or refunds locks the
// order row first, and the caller's balance after it: one order of locks,
// so concurrent money moves on one order queue instead of deadlocking.
//
// Here charges, cancels, refunds, processor webhooks and payouts hit the
// same orders (and the same balance) at once, three times over. Every
// answer is one the contract gives for that race; none is a 5xx, which is
// what a deadlock error (40P01) would become. And PostgreSQL's own count
// of deadlocks in the test's database (pg_stat_database.deadlocks, which
// starts at zero with the database) is exactly one at the end: the one
// the test then makes on purpose, two transactions locking two orders in
// opposite orders, to show that the count sees a deadlock.
func TestLockOrderQueuesInsteadOfDeadlocking(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ctx := context.Background()
	for round := range 3 {
		lockOrderRound(t, ts, round)
	}
	waitFor(t, 30*time.Second, "every payout to be final", func() bool {
		var open int
		if err := ts.db.QueryRow(ctx, `SELECT count(*) FROM payouts WHERE status NOT IN ('paid', 'failed')`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		return open == 0
	})
	assertMoneyConserved(t, ts)

	a, b := ts.newOrder(t, "sk_test_acme", 100), ts.newOrder(t, "sk_test_acme", 101)
	if err := deadlockOnPurpose(ctx, ts, a.ID, b.ID); err != nil {
		t.Fatal(err)
	}

	// A backend reports what it counted when it exits, if it has not
	// before: end every other connection to the database, then read.
	stats, err := pgx.Connect(ctx, ts.db.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close(ctx)
	if _, err := stats.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the other connections to end", func() bool {
		var others int
		if err := stats.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others); err != nil {
			t.Fatal(err)
		}
		return others == 0
	})
	var deadlocks int64
	if err := stats.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks); err != nil {
		t.Fatal(err)
	}
	if deadlocks != 1 {
		t.Errorf("pg_stat_database counted %d deadlocks; want 1, the one made on purpose (0: the count missed it; more: the races deadlocked)", deadlocks)
	}
}

// deadlockOnPurpose locks order a then b in one transaction, and b then a
// in another, each waiting for the other: PostgreSQL ends one with 40P01.
func deadlockOnPurpose(ctx context.Context, ts *testServer, a, b string) error {
	first, second := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	lock := func(x, y string, locked, other chan struct{}) {
		errs <- func() error {
			tx, err := ts.db.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }() // a test transaction, never committed
			if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, x); err != nil {
				return err
			}
			close(locked)
			<-other
			_, err = tx.Exec(ctx, `SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, y)
			return err
		}()
	}
	go lock(a, b, first, second)
	go lock(b, a, second, first)
	var deadlocked int
	for range 2 {
		var pgErr *pgconn.PgError
		switch err := <-errs; {
		case err == nil:
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			deadlocked++
		default:
			return err
		}
	}
	if deadlocked != 1 {
		return fmt.Errorf("%d of the two transactions ended in a deadlock; want 1", deadlocked)
	}
	return nil
}

// lockOrderRound makes four paid orders and three pending ones, then sends
// everything that locks them at once: on each paid order three refunds,
// two cancels, a charge under a new key and two redelivered processor
// webhooks; on each pending order a charge racing a cancel; and three
// payouts from the balance all of it moves.
func lockOrderRound(t *testing.T, ts *testServer, round int) {
	t.Helper()
	type paid struct{ order, charge, downstream, processorID string }
	var paidOrders []paid
	for i := range 4 {
		ch := ts.paidCharge(t, 1000+10*round+i)
		p := paid{order: ch.OrderID, charge: ch.ID}
		if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key, processor_charge_id FROM charges WHERE id = $1`, ch.ID).
			Scan(&p.downstream, &p.processorID); err != nil {
			t.Fatal(err)
		}
		paidOrders = append(paidOrders, p)
	}
	var pending []order
	for i := range 3 {
		pending = append(pending, ts.newOrder(t, "sk_test_acme", 500+10*round+i))
	}

	type sent struct {
		what string
		req  request
		ok   []int // the answers the contract gives for this race
	}
	var reqs []sent
	key := func(what string, i, j int) string { return fmt.Sprintf("lock-%d-%s-%d-%d", round, what, i, j) }
	for i, p := range paidOrders {
		for j := range 3 {
			reqs = append(reqs, sent{"refund", refundRequest(p.charge, key("refund", i, j), `{"amount":100}`), []int{http.StatusCreated}})
		}
		for range 2 {
			reqs = append(reqs, sent{"cancel of a paid order", request{method: "POST", path: "/v1/orders/" + p.order + "/cancel", apiKey: "sk_test_acme"}, []int{http.StatusConflict}})
		}
		reqs = append(reqs, sent{"charge of a paid order", chargeRequest(p.order, key("charge", i, 0), "pm_card_visa"), []int{http.StatusConflict}})
		for j := range 2 {
			body := fmt.Sprintf(`{"id":%q,"type":"charge.succeeded","created":1,"data":{"id":%q,"downstream_key":%q,"amount":%d,"currency":"usd","status":"succeeded","decline_code":null}}`,
				key("pevt", i, j), p.processorID, p.downstream, 1000+10*round+i)
			reqs = append(reqs, sent{"webhook", signedWebhook(t, body, time.Now(), ts.webhookSecret), []int{http.StatusOK}})
		}
	}
	for i, o := range pending {
		reqs = append(reqs,
			sent{"charge racing a cancel", chargeRequest(o.ID, key("race", i, 0), "pm_card_visa"), []int{http.StatusCreated, http.StatusConflict}},
			sent{"cancel racing a charge", request{method: "POST", path: "/v1/orders/" + o.ID + "/cancel", apiKey: "sk_test_acme"}, []int{http.StatusOK, http.StatusConflict}})
	}
	for j := range 3 {
		reqs = append(reqs, sent{"payout", payoutRequest("sk_test_acme", key("payout", 0, j), `{"amount":100,"currency":"usd"}`), []int{http.StatusAccepted}})
	}

	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() {
			<-start
			res, err := ts.send(t, context.Background(), r.req)
			if err != nil {
				t.Errorf("round %d, %s: %v", round, r.what, err)
				return
			}
			for _, ok := range r.ok {
				if res.Status == ok {
					return
				}
			}
			t.Errorf("round %d, %s: %d %s; want one of %v", round, r.what, res.Status, res.Body, r.ok)
		})
	}
	close(start)
	wg.Wait()
}
