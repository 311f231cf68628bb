package app

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/config"
)

// An order create is a local operation: the order and its completed
// record commit in one transaction (idempotency.Store.Serve of a Local operation).

// One keyed create is one commit and two rows: the order and the record,
// written by the same transaction (the same xmin), and neither updated
// since (the table statistics count no update).
func TestLocalCreateCommitsOnceWithTwoRows(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	if res := ts.createOrder(t, "one-commit", teaOrder); res.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", res.Status, res.Body)
	}
	ctx := context.Background()
	var orderXmin, recordXmin string
	if err := ts.db.QueryRow(ctx, `SELECT (SELECT xmin::text FROM orders), (SELECT xmin::text FROM idempotency_keys WHERE key = 'one-commit')`).Scan(&orderXmin, &recordXmin); err != nil {
		t.Fatal(err)
	}
	if orderXmin != recordXmin {
		t.Errorf("the order was written by transaction %s and its record by %s; want one transaction", orderXmin, recordXmin)
	}
	// The server's session reports its counts once it is idle, within a
	// second or so of the commit.
	var inserted, updated int
	waitFor(t, 30*time.Second, "the server's statistics to reach the database's", func() bool {
		if err := ts.db.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables
			WHERE relname IN ('orders', 'idempotency_keys')`).Scan(&inserted, &updated); err != nil {
			t.Fatal(err)
		}
		return inserted >= 2
	})
	if inserted != 2 || updated != 0 {
		t.Errorf("a keyed create inserted %d rows and updated %d; want 2 inserted, none updated", inserted, updated)
	}
}

// A duplicate of an order create (a local operation) that arrives while
// the original's transaction is open waits on the key's unique index, and
// is answered with the original's answer, replayed, once it commits. Both
// requests are held at the order insert by a table lock, so both are
// inside their transaction, neither record written, when they go on.
func TestLocalDuplicateWaitsOnTheUniqueIndex(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	release := ts.blockInserts(t, "orders")
	answers := make(chan response, 2)
	for range 2 {
		go func() { answers <- ts.createOrder(t, "local-twins", teaOrder) }()
	}
	ts.waitForBlockedInserts(t, "orders", 2)
	release()
	a, b := <-answers, <-answers
	if a.Header.Get("Idempotent-Replayed") == "true" {
		a, b = b, a
	}
	if a.Status != http.StatusCreated || b.Status != http.StatusCreated || !bytes.Equal(a.Body, b.Body) ||
		a.Header.Get(outcomeHeader) != "new" || b.Header.Get(outcomeHeader) != "replayed" || b.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("two copies at once: %d %v %s and %d %v %s; want one new 201 and its replay", a.Status, a.Header, a.Body, b.Status, b.Header, b.Body)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Fatalf("%d orders; want 1", n)
	}
}

// Two hundred copies of one order create at once, on a server whose pool
// has ten connections: the copies queue for a connection, then on the
// key's unique index behind whichever inserted first, and each gets its
// answer. One order is made and every body is the same.
func TestTwoHundredLocalDuplicatesWithTenConnections(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t,
		withConfig(func(c *config.Server) { c.RateLimit = 0 }),
		func(o *serverOptions) { o.pool = func(c *pgxpool.Config) { c.MaxConns = 10 } })
	answers := fire(t, 200, ordersRequest("local-storm", teaOrder), ts)
	outcomes := map[string]int{}
	for _, a := range answers {
		if a.Status != http.StatusCreated || !bytes.Equal(a.Body, answers[0].Body) {
			t.Fatalf("a copy got %d %s; want 201 %s", a.Status, a.Body, answers[0].Body)
		}
		outcomes[a.Header.Get(outcomeHeader)]++
	}
	if outcomes["new"] != 1 || outcomes["replayed"] != 199 {
		t.Errorf("outcomes %v; want 1 new and 199 replayed", outcomes)
	}
	if c := ts.count(t, "orders"); c != 1 {
		t.Fatalf("%d orders; want 1", c)
	}
}
