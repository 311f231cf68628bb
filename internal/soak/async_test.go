package soak

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

// TestAsyncFailoverLosesAcknowledgedWritesButChargesOnce shows what
// asynchronous replication costs, and what it must not cost. Two nodes
// under Patroni, without synchronous replication. The standby is cut off
// from the leader's WAL (its WAL sender is stopped with SIGSTOP), the
// server acknowledges an order (201), a charge (201: the card charged at
// the processor) and a payout (202: the transfer started), all committed
// on the leader alone; then the leader is killed and the standby promoted.
// Those acknowledged transactions are gone: the order answers 404, the
// charge's and payout's keys are unknown. The client retries the charge
// and the payout with their keys and bodies, as it must after any doubt,
// and the server runs them again from the start, on new rows. Because the
// downstream key is derived from the caller, the key and the request
// (cardprocessor.DownstreamKey), not from the lost rows, the processor replays its
// first answers: one charge and one transfer, and the money adds up. With
// a key made from a row's random id (as before), the processor would have
// charged the card and paid out twice.
func TestAsyncFailoverLosesAcknowledgedWritesButChargesOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ha := startHA(t, 2, false)
	// One replica, without the replay cache: the retries must reach the
	// database, as they would on another replica.
	sv := startServers(t, ha.url, serversConfig{replicas: 1})
	c, err := client.New(sv.urls[0], "sk_test_acme", client.Policy{MaxAttempts: 30, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	order := func(key string, amount int64) apiclient.Order {
		t.Helper()
		o, _, err := c.CreateOrder(ctx, apiclient.CreateOrderRequest{Amount: amount, Currency: apiclient.Usd}, client.WithIdempotencyKey(key))
		if err != nil {
			t.Fatalf("order %s: %v", key, err)
		}
		return o
	}
	charge := func(key, orderID string) apiclient.Charge {
		t.Helper()
		ch, _, err := c.Charge(ctx, orderID, apiclient.PmCardVisa, client.WithIdempotencyKey(key))
		if err != nil || ch.Status != apiclient.ChargeStatusSucceeded {
			t.Fatalf("charge %s: %+v, %v", key, ch, err)
		}
		return ch
	}
	payoutBody := apiclient.CreatePayoutRequest{Amount: 1500, Currency: apiclient.Usd}
	payout := func() apiclient.Payout {
		t.Helper()
		po, _, err := c.Payout(ctx, payoutBody, client.WithIdempotencyKey("payout"))
		if err != nil {
			t.Fatalf("payout: %v", err)
		}
		return po
	}

	// Before the cut: money in the balance, an order to charge later, both
	// on the standby too.
	charge("charge-1", order("order-1", 4000).Id)
	second := order("order-2", 2500)
	leaderNode := ha.leader()
	standbyNode := "node1"
	if leaderNode == "node1" {
		standbyNode = "node2"
	}
	leader, standby := connect(t, ctx, ha.nodeURL(leaderNode)), connect(t, ctx, ha.nodeURL(standbyNode))
	var lsn string
	if err := leader.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the standby has replayed the leader's WAL", func() bool {
		var caughtUp bool
		_ = standby.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&caughtUp)
		return caughtUp
	})

	// The cut: the leader's WAL senders stop where they are. Nothing the
	// leader writes from now on reaches the standby.
	rows, err := leader.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		t.Fatal(err)
	}
	senders, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(senders) != 1 {
		t.Fatalf("WAL senders %v (%v); want the standby's one", senders, err)
	}
	for _, pid := range senders {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Fatalf("stop the WAL sender: %v", err)
		}
		// Killed with its leader below; here in case the test ends first.
		t.Cleanup(func() { _ = syscall.Kill(int(pid), syscall.SIGKILL) })
	}
	// Whatever the standby has or will have received, the leader had
	// written by now.
	var cut string
	if err := leader.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&cut); err != nil {
		t.Fatal(err)
	}

	// Acknowledged, on the leader alone.
	lost := order("order-3", 999)
	first := charge("charge-2", second.Id)
	accepted := payout()
	var chargeKey, payoutKey string
	if err := leader.QueryRow(ctx, `SELECT downstream_key FROM charges WHERE id = $1`, first.Id).Scan(&chargeKey); err != nil {
		t.Fatal(err)
	}
	if err := leader.QueryRow(ctx, `SELECT downstream_key FROM payouts WHERE id = $1`, accepted.Id).Scan(&payoutKey); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the payout's transfer has started at the processor", func() bool {
		return len(effectsUnder(t, ctx, sv.processorURL, payoutKey)) == 1
	})
	var cutOff bool
	if err := standby.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn() <= $1::pg_lsn`, cut).Scan(&cutOff); err != nil || !cutOff {
		t.Fatalf("the standby received WAL written after the cut (%v): the test did not cut it off", err)
	}

	// The failover: the leader dies, its stopped WAL senders with it, and
	// Patroni promotes the standby, which never saw the last transactions.
	if node, _ := ha.killLeader(); node != leaderNode {
		t.Fatalf("killed %s; the leader was %s", node, leaderNode)
	}
	for _, pid := range senders {
		_ = syscall.Kill(int(pid), syscall.SIGKILL)
	}
	waitUntil(t, ctx, "the standby is the leader", func() bool {
		node, ok := ha.tryLeader()
		return ok && node == standbyNode
	})

	// The acknowledged order is gone, and so are the records of the
	// charge's and the payout's keys.
	res, _, err := c.IdempotencyKey(ctx, "order-3")
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("the key of the acknowledged order %s: %+v, %v; want a 404, the record lost in the failover", lost.Id, res, err)
	}
	var n int
	if err := standby.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, lost.Id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("order %s: %d rows (%v) on the new leader; want it lost", lost.Id, n, err)
	}
	for _, key := range []string{"charge-2", "payout"} {
		if _, _, err := c.IdempotencyKey(ctx, key); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
			t.Fatalf("the key %s after the failover: %v; want a 404, the record lost", key, err)
		}
	}
	t.Logf("acknowledged and lost in the failover: order %s, charge %s, payout %s", lost.Id, first.Id, accepted.Id)

	// The client's retries: the same keys, the same requests.
	again := charge("charge-2", second.Id)
	retried := payout()
	if again.Id == first.Id || retried.Id == accepted.Id {
		t.Fatalf("the retries found the lost rows (charge %s, payout %s): nothing was lost", again.Id, retried.Id)
	}
	if final, err := c.WaitForPayout(ctx, retried.Id, nil); err != nil || final.Status != apiclient.PayoutStatusPaid {
		t.Fatalf("retried payout: %+v, %v; want paid", final, err)
	}

	// One effect each at the processor, under the first keys, and the
	// money adds up: the soak's ledger check finds every effect a row of
	// ours names, at most one per row, and the balance what they say.
	if got := effectsUnder(t, ctx, sv.processorURL, chargeKey); len(got) != 1 {
		t.Errorf("charges under %s: %+v; want the one", chargeKey, got)
	}
	if got := effectsUnder(t, ctx, sv.processorURL, payoutKey); len(got) != 1 || got[0].Status != fakeprocessor.PayoutPaid {
		t.Errorf("payouts under %s: %+v; want the one, paid", payoutKey, got)
	}
	ledger, err := fakeprocessor.FetchLedger(ctx, sv.processorURL)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, e := range ledger {
		counts[e.Object]++
	}
	if counts[fakeprocessor.ObjectCharge] != 2 || counts[fakeprocessor.ObjectPayout] != 1 {
		t.Errorf("the processor made %d charges and %d payouts; want 2 charges (charge-1, charge-2) and 1 payout", counts[fakeprocessor.ObjectCharge], counts[fakeprocessor.ObjectPayout])
	}
	s := newSoak(t, sv.urls)
	s.checkMoney(ctx, testdb.Pool(t, ha.url), sv.processorURL)
}

// effectsUnder is the processor's ledger for one downstream key.
func effectsUnder(t *testing.T, ctx context.Context, processorURL, key string) []fakeprocessor.LedgerEntry {
	ledger, err := fakeprocessor.FetchLedger(ctx, processorURL)
	if err != nil {
		t.Fatal(err)
	}
	var out []fakeprocessor.LedgerEntry
	for _, e := range ledger {
		if e.IdempotencyKey == key {
			out = append(out, e)
		}
	}
	return out
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
