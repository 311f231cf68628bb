package sweeper_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/sweeper"
	"github.com/retrysafe/payments/internal/testdb"
)

const window = 24 * time.Hour

func newPool(t *testing.T) *pgxpool.Pool { return newPoolTB(t) }

func newPoolTB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// newSweeper is sweeper.New for a configuration the test knows is valid.
func newSweeper(t testing.TB, cfg sweeper.Config, pool *pgxpool.Pool) *sweeper.Sweeper {
	t.Helper()
	s, err := sweeper.New(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A sweeper refuses a configuration that could not work.
func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]sweeper.Config{
		"Batch":        {KeyRetention: time.Hour, EventRetention: time.Hour, WebhookRetention: time.Hour, Batch: 0},
		"KeyRetention": {KeyRetention: 0, EventRetention: time.Hour, WebhookRetention: time.Hour, Batch: 10},
	} {
		if _, err := sweeper.New(cfg, nil); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("bad %s: %v; want an error naming it", name, err)
		}
	}
}

func config(batch int) sweeper.Config {
	return sweeper.Config{KeyRetention: window, EventRetention: window, WebhookRetention: window, Batch: batch}
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// insertKeys adds n idempotency records with the given status, created
// `age` ago on the database clock.
func insertKeys(t *testing.T, pool *pgxpool.Pool, prefix, status string, age time.Duration, n int) {
	t.Helper()
	exec(t, pool, `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, locked_until, operation, request_method, request_path,
		                              request_fingerprint, response_status, response_headers, response_body, created_at)
		SELECT 'acme', $1 || g, $2,
		       CASE WHEN $2 = 'completed' THEN 'finished' ELSE 'started' END,
		       CASE WHEN $2 = 'in_progress' THEN now() ELSE NULL END,
		       'createOrder', 'POST', '/v1/orders', '\x00',
		       CASE WHEN $2 = 'completed' THEN 201 END,
		       CASE WHEN $2 = 'completed' THEN '{}'::jsonb END,
		       CASE WHEN $2 = 'completed' THEN '\x7b7d'::bytea END,
		       now() - make_interval(secs => $3)
		FROM generate_series(1, $4) g`, prefix, status, age.Seconds(), n)
}

func keysLeft(t *testing.T, pool *pgxpool.Pool, prefix string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key LIKE $1 || '%'`, prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Exactly the completed records past the window go, judged on the
// database clock at the window's edge; in-progress, dead and recent ones
// stay. Delivered events and webhook ids past their windows go too.
func TestSweepDeletesExactlyWhatExpired(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	insertKeys(t, pool, "expired-", "completed", window+time.Second, 5)
	insertKeys(t, pool, "edge-", "completed", window-5*time.Second, 3) // just inside the window
	insertKeys(t, pool, "recent-", "completed", time.Hour, 2)
	insertKeys(t, pool, "stuck-", "in_progress", window+time.Hour, 2) // effect may be unresolved
	insertKeys(t, pool, "dead-", "dead", window+time.Hour, 1)
	exec(t, pool, `
		INSERT INTO events (caller_id, id, type, data, created_at, delivered_at) VALUES
		  ('acme', 'evt_old', 'order.paid', '{}', now() - interval '30 hours', now() - interval '25 hours'),
		  ('acme', 'evt_new', 'order.paid', '{}', now(), now()),
		  ('acme', 'evt_undelivered', 'order.paid', '{}', now() - interval '30 hours', NULL)`)
	// A pull-only caller's events (parked: nowhere to push them), old and new.
	exec(t, pool, `
		INSERT INTO events (caller_id, id, type, data, created_at, next_attempt_at) VALUES
		  ('globex', 'evt_parked_old', 'order.paid', '{}', now() - interval '25 hours', 'infinity'),
		  ('globex', 'evt_parked_new', 'order.paid', '{}', now(), 'infinity')`)
	exec(t, pool, `
		INSERT INTO demo_received_events (caller_id, event_id, type, received_at) VALUES
		  ('acme', 'evt_old', 'order.paid', now() - interval '25 hours'),
		  ('acme', 'evt_new', 'order.paid', now())`)
	exec(t, pool, `
		INSERT INTO processor_events (caller_id, event_id, type, received_at) VALUES
		  ('acme', 'pevt_old', 'charge.succeeded', now() - interval '25 hours'),
		  ('acme', 'pevt_new', 'charge.succeeded', now())`)

	dry, err := newSweeper(t, sweeper.Config{KeyRetention: window, EventRetention: window, WebhookRetention: window, Batch: 2, DryRun: true}, pool).Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if dry.Keys != 5 || dry.Events != 3 || dry.WebhookEvents != 1 || keysLeft(t, pool, "expired-") != 5 {
		t.Fatalf("dry run %+v; want counts 5/3/1 (a delivered event, a parked one, a demo receipt) and nothing deleted", dry)
	}

	r, err := newSweeper(t, config(2), pool).Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Keys != 5 || r.Events != 3 || r.WebhookEvents != 1 || r.StaleInProgress != 2 {
		t.Errorf("report %+v; want 5 keys, a delivered and a parked event and a demo receipt, 1 webhook id deleted and 2 stale in-progress found", r)
	}
	if r.Batches < 3+1+1+1+1 { // 5 keys in batches of 2: 2, 2, 1
		t.Errorf("%d batches; want the keys deleted in bounded batches", r.Batches)
	}
	for prefix, want := range map[string]int{"expired-": 0, "edge-": 3, "recent-": 2, "stuck-": 2, "dead-": 1} {
		if got := keysLeft(t, pool, prefix); got != want {
			t.Errorf("%s records left: %d, want %d", prefix, got, want)
		}
	}
	var events, hooks, receipts int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM processor_events), (SELECT count(*) FROM demo_received_events)`).Scan(&events, &hooks, &receipts); err != nil {
		t.Fatal(err)
	}
	if events != 3 || hooks != 1 || receipts != 1 {
		t.Errorf("%d events, %d webhook ids, %d demo receipts left; want 3 (the new, the undelivered, the new parked), 1 and 1", events, hooks, receipts)
	}
}

// Two sweepers at once delete each record once, and neither fails.
func TestTwoSweepersAtOnce(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	insertKeys(t, pool, "old-", "completed", window+time.Minute, 5000)
	var wg sync.WaitGroup
	reports := make([]sweeper.Report, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { reports[i], errs[i] = newSweeper(t, config(100), pool).Sweep(context.Background()) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if total := reports[0].Keys + reports[1].Keys; total != 5000 || keysLeft(t, pool, "old-") != 0 {
		t.Errorf("the sweepers deleted %d + %d records; want 5000 in all, each once", reports[0].Keys, reports[1].Keys)
	}
}

// A sweep running while new keys are claimed does not block the claims,
// and a row a request holds is skipped, not waited for: every claim (an
// INSERT into the same table) finishes within a short bound while the
// sweep deletes in the background, and the held row survives the sweep.
func TestSweepDoesNotBlockClaims(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "old-", "completed", window+time.Minute, 20000)
	// A request holding one expired row (a replay reading it, say).
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE key = 'old-1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := newSweeper(t, config(500), pool).Sweep(ctx)
		done <- err
	}()
	var wg sync.WaitGroup
	claimErrs := make(chan error, 400)
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				// A claim that waited on the sweep would miss this bound.
				claimCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := pool.Exec(claimCtx, `
					INSERT INTO idempotency_keys (caller_id, key, operation, request_method, request_path, request_fingerprint, locked_until)
					VALUES ('acme', $1, 'createOrder', 'POST', '/v1/orders', '\x00', now() + interval '30 seconds')
					ON CONFLICT (caller_id, key) DO NOTHING`, fmt.Sprintf("new-%d-%d", w, i))
				cancel()
				if err != nil {
					claimErrs <- err
				}
			}
		})
	}
	wg.Wait()
	close(claimErrs)
	for err := range claimErrs {
		t.Errorf("claim during the sweep: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if left, claimed := keysLeft(t, pool, "old-"), keysLeft(t, pool, "new-"); left != 1 || claimed != 400 {
		t.Errorf("%d old records left, %d new ones claimed; want 1 (the held row, skipped) and 400", left, claimed)
	}
}
