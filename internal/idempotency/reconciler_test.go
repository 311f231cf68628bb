package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type fixture struct {
	pool         *pgxpool.Pool
	store        *idempotency.Store
	charges      *charges.Service
	operations   *idempotency.Registry
	processorURL string
}

func newFixture(t *testing.T, flakyFailures int) *fixture {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	proc, err := fakeprocessor.New(fakeprocessor.Config{FlakyFailures: flakyFailures, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proc)
	t.Cleanup(func() { proc.Close(); srv.Close() })
	chargeService := charges.NewService(pool, cardprocessor.NewClient(srv.URL, 5*time.Second))
	operations, err := idempotency.NewRegistry(chargeService.ChargeOperation())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		pool:         pool,
		store:        idempotency.NewStore(pool, idempotency.StoreConfig{Lease: time.Minute}, quiet),
		charges:      chargeService,
		operations:   operations,
		processorURL: srv.URL,
	}
}

func (f *fixture) reconciler(t *testing.T, maxAttempts int) *idempotency.Reconciler {
	t.Helper()
	r, err := idempotency.NewReconciler(idempotency.ReconcilerConfig{
		Interval: time.Millisecond, Batch: 4, MaxRun: time.Minute,
		MaxTries: maxAttempts, MaxAge: time.Hour,
		BackoffBase: time.Millisecond, BackoffCap: time.Millisecond,
		RetriesPerInterval: 100, RetryBurst: 100,
	}, f.store, f.operations, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stalledCharge runs a charge whose processor call fails (pm_card_flaky),
// leaving its record at charge_created with the lease released: what a
// client that got a 503 and never came back leaves behind. The
// reconciler leaves such a record to its client for one lease; the record
// is back-dated past that grace, on the database clock.
func (f *fixture) stalledCharge(t *testing.T, key string) {
	t.Helper()
	f.stalledChargeOf(t, "acme", key)
}

func (f *fixture) stalledChargeOf(t *testing.T, caller, key string) {
	t.Helper()
	ctx := context.Background()
	o, err := orders.Create(ctx, f.pool, caller, orders.NewOrder{Amount: 100, Currency: "usd"})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"payment_method":"pm_card_flaky"}`)
	doc, _ := idempotency.DecodeJSON(body)
	fp, _ := idempotency.Fingerprint("POST", "/v1/orders/"+o.ID+"/charges", doc)
	req := idempotency.Request{CallerID: caller, Key: key, Operation: charges.OperationCharge, Method: "POST", Path: "/v1/orders/" + o.ID + "/charges", Fingerprint: fp}
	_, err = f.store.Serve(ctx, f.charges.ChargeOperation(), req, map[string]string{"order_id": o.ID}, body)
	if !idempotency.IsRetryable(err) {
		t.Fatalf("the first charge attempt: %v; want a retryable processor failure", err)
	}
	f.makeDue(t, key)
}

// makeDue back-dates the reconciler's next try of key to now.
func (f *fixture) makeDue(t *testing.T, key string) {
	t.Helper()
	tag, err := f.pool.Exec(context.Background(), `UPDATE idempotency_keys SET next_attempt_at = now() WHERE key = $1 AND status = 'in_progress'`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("make %q due: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

func (f *fixture) statuses(t *testing.T) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT status || '/' || recovery_point, count(*) FROM idempotency_keys GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func (f *fixture) effects(t *testing.T) []fakeprocessor.LedgerEntry {
	t.Helper()
	effects, err := fakeprocessor.FetchLedger(context.Background(), f.processorURL)
	if err != nil {
		t.Fatal(err)
	}
	return effects
}

// Two reconcilers at once share the stalled charges: every charge is
// finished exactly once, with one processor effect each.
func TestTwoReconcilersFinishEachChargeOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	const n = 12
	for i := range n {
		f.stalledCharge(t, fmt.Sprintf("stalled-%d", i))
	}
	if got := f.statuses(t)["in_progress/charge_created"]; got != n {
		t.Fatalf("%d stalled records; want %d", got, n)
	}
	a, b := f.reconciler(t, 5), f.reconciler(t, 5)
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed := 0
	for _, r := range []*idempotency.Reconciler{a, b} {
		wg.Go(func() {
			for {
				k, err := r.RunOnce(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				claimed += k
				mu.Unlock()
				if k == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if claimed != n {
		t.Errorf("the reconcilers claimed %d records in all; want each of the %d once", claimed, n)
	}
	if got := f.statuses(t); got["completed/finished"] != n || len(got) != 1 {
		t.Errorf("records %v; want all %d completed", got, n)
	}
	effects := f.effects(t)
	keys := map[string]bool{}
	for _, e := range effects {
		keys[e.IdempotencyKey] = true
	}
	if len(effects) != n || len(keys) != n {
		t.Errorf("%d processor effects under %d keys; want %d, one per charge", len(effects), len(keys), n)
	}
	var paid int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE status = 'paid'`).Scan(&paid); err != nil || paid != n {
		t.Errorf("%d paid orders (%v); want %d", paid, err, n)
	}
}

// One caller's pile of stalled operations does not hold up another's
// recovery: a scan takes every caller's first record before anyone's
// second, so globex's charge, stalled after six of acme's, is finished by
// the first scan of four.
func TestOneCallersBacklogDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	for i := range 6 {
		f.stalledCharge(t, fmt.Sprintf("acme-%d", i))
	}
	f.stalledChargeOf(t, "globex", "globex-0")
	if n, err := f.reconciler(t, 5).RunOnce(context.Background()); n != 4 || err != nil {
		t.Fatalf("the first scan claimed %d (%v); want a batch of 4", n, err)
	}
	var status string
	if err := f.pool.QueryRow(context.Background(), `SELECT status FROM idempotency_keys WHERE caller_id = 'globex'`).Scan(&status); err != nil || status != "completed" {
		t.Errorf("globex's charge after the first scan: %s (%v); want completed", status, err)
	}
}

// A transient failure during reconciliation stores nothing and backs off;
// too many attempts set the record aside (dead), never deleting it.
func TestReconcilerBacksOffThenMarksDead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100) // the processor keeps failing
	f.stalledCharge(t, "hopeless")
	r := f.reconciler(t, 3)
	for range 10 {
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		var unresolved bool
		if err := f.pool.QueryRow(context.Background(), `SELECT status IN ('in_progress', 'dead') AND response_status IS NULL FROM idempotency_keys`).Scan(&unresolved); err != nil || !unresolved {
			t.Fatalf("after a failed try the record must stay unresolved, nothing stored (%v)", err)
		}
		// Let the (millisecond) backoff pass on the database clock.
		if _, err := f.pool.Exec(context.Background(), `UPDATE idempotency_keys SET next_attempt_at = now() WHERE status = 'in_progress'`); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.statuses(t); got["dead/charge_created"] != 1 {
		t.Fatalf("records %v; want the charge set aside as dead at charge_created", got)
	}
	var status string
	if err := f.pool.QueryRow(context.Background(), `SELECT status FROM charges`).Scan(&status); err != nil || status != "pending" {
		t.Errorf("charge %s (%v); an uncertain charge must stay pending, never failed", status, err)
	}
	if n := len(f.effects(t)); n != 0 {
		t.Errorf("%d processor effects; want none", n)
	}
}

// A record that never passed its first phase did nothing: the reconciler
// frees its key.
func TestReconcilerDeletesNeverStarted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	doc, _ := idempotency.DecodeJSON([]byte(`{}`))
	fp, _ := idempotency.Fingerprint("POST", "/v1/orders", doc)
	_, err := f.pool.Exec(ctx, `
		INSERT INTO idempotency_keys (caller_id, key, operation, request_method, request_path, request_fingerprint, locked_until)
		VALUES ('acme', 'never-started', 'createOrder', 'POST', '/v1/orders', $1, now() - interval '1 second')`, fp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.reconciler(t, 5).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var p *problem.Error
	if _, err := f.store.Get(ctx, "acme", "never-started"); !errors.As(err, &p) || p.Code != problem.NotFound {
		t.Fatalf("the never-started record is still there (%v)", err)
	}
}

// The retry budget caps how many stalled records the reconciler retries
// per interval of time, however fast it scans, so an outage of the
// processor is not met with a burst of retries; the rest wait. It starts
// full (the burst) and is refilled by the clock, not by scans: a loop that
// scans again at once after a full batch must not refill it.
func TestRetryBudgetThrottlesTheReconciler(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100) // the processor keeps failing: an outage
	for i := range 6 {
		f.stalledCharge(t, fmt.Sprintf("outage-%d", i))
	}
	now := time.Now()
	r, err := idempotency.NewReconciler(idempotency.ReconcilerConfig{
		Interval: time.Second, Batch: 10, MaxRun: time.Minute, MaxTries: 100, MaxAge: time.Hour,
		BackoffBase: time.Hour, BackoffCap: time.Hour, // a record tried once is not due again here
		RetriesPerInterval: 1, RetryBurst: 2,
		Clock: func() time.Time { return now },
	}, f.store, f.operations, quiet)
	if err != nil {
		t.Fatal(err)
	}
	scan := func() int {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	burst, again := scan(), scan()
	now = now.Add(time.Second)
	afterASecond := scan()
	now = now.Add(3 * time.Second)
	afterThree := scan()
	if burst != 2 || again != 0 || afterASecond != 1 || afterThree != 2 {
		t.Errorf("scans retried %d, %d, then %d after a second and %d after three more; want 2 (the burst), 0, 1, 2 (capped by the burst)",
			burst, again, afterASecond, afterThree)
	}
}

// A reconciler refuses a configuration that could not work, such as a
// zero batch (which once made its loop spin, ignoring cancellation).
func TestReconcilerRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	good := idempotency.ReconcilerConfig{
		Interval: time.Second, Batch: 1, MaxRun: time.Minute, MaxTries: 3, MaxAge: time.Hour,
		BackoffBase: time.Second, BackoffCap: time.Minute, RetriesPerInterval: 1, RetryBurst: 1,
	}
	if _, err := idempotency.NewReconciler(good, f.store, f.operations, quiet); err != nil {
		t.Fatalf("a valid configuration was refused: %v", err)
	}
	for name, mutate := range map[string]func(*idempotency.ReconcilerConfig){
		"Batch":              func(c *idempotency.ReconcilerConfig) { c.Batch = 0 },
		"Interval":           func(c *idempotency.ReconcilerConfig) { c.Interval = 0 },
		"MaxRun":             func(c *idempotency.ReconcilerConfig) { c.MaxRun = -time.Second },
		"MaxTries":           func(c *idempotency.ReconcilerConfig) { c.MaxTries = 0 },
		"MaxAge":             func(c *idempotency.ReconcilerConfig) { c.MaxAge = 0 },
		"BackoffCap":         func(c *idempotency.ReconcilerConfig) { c.BackoffCap = time.Millisecond },
		"RetriesPerInterval": func(c *idempotency.ReconcilerConfig) { c.RetriesPerInterval = 0 },
		"RetryBurst":         func(c *idempotency.ReconcilerConfig) { c.RetryBurst = 0 },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := idempotency.NewReconciler(cfg, f.store, f.operations, quiet); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("bad %s: %v; want an error naming it", name, err)
		}
	}
}

// Run returns once its context is canceled, also while records keep it
// busy.
func TestReconcilerStopsWhenCanceled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100) // the processor keeps failing
	for i := range 3 {
		f.stalledCharge(t, fmt.Sprintf("busy-%d", i))
	}
	r := f.reconciler(t, 5)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	waitForAttempt(t, f.pool, 2) // it is working
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was canceled")
	}
}

// A reconciler leaves alone a record of an operation it has no handler
// for (an older replica during a rolling deploy, say), instead of giving up
// on it; a reconciler that knows the operation finishes it.
func TestUnknownOperationIsLeftToAReconcilerThatKnowsIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.stalledCharge(t, "orphan")
	cfg := idempotency.ReconcilerConfig{
		Interval: time.Second, Batch: 1, MaxRun: time.Minute, MaxTries: 3, MaxAge: time.Hour,
		BackoffBase: time.Second, BackoffCap: time.Minute, RetriesPerInterval: 1, RetryBurst: 1,
	}
	noOperations, err := idempotency.NewRegistry() // an older replica's: it knows no operation
	if err != nil {
		t.Fatal(err)
	}
	older, err := idempotency.NewReconciler(cfg, f.store, noOperations, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := older.RunOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("a reconciler without the handler claimed %d records (%v); want none", n, err)
	}
	if got := f.statuses(t); got["in_progress/charge_created"] != 1 {
		t.Fatalf("records %v; want the charge still in progress, untouched", got)
	}
	newer, err := idempotency.NewReconciler(cfg, f.store, f.operations, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := newer.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("the reconciler with the handler claimed %d records (%v); want 1", n, err)
	}
	if got := f.statuses(t); got["completed/finished"] != 1 {
		t.Errorf("records %v; want the charge finished", got)
	}
}

func waitForAttempt(t *testing.T, pool *pgxpool.Pool, attempt int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE attempt >= $1`, attempt).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record reached attempt %d", attempt)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Fencing, end to end: the first owner of a charge stalls inside its
// processor call (its network pauses) past its lease; the reconciler takes
// the record over and finishes the charge. When the stalled owner wakes up
// with the processor's answer, its final phase is refused (its attempt is
// stale): the recovered result stands, and nothing is recorded twice.
func TestStalledOwnerCannotOverwriteRecoveredCharge(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()

	// The stalled owner reaches the processor through a proxy that holds
	// its request until the test lets it go.
	inCall, resume := make(chan struct{}), make(chan struct{})
	target, _ := url.Parse(f.processorURL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	paused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inCall)
		<-resume
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(paused.Close)
	var once sync.Once
	unpause := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(unpause)
	stalledCharges := charges.NewService(f.pool, cardprocessor.NewClient(paused.URL, 30*time.Second))

	o, err := orders.Create(ctx, f.pool, "acme", orders.NewOrder{Amount: 4200, Currency: "usd"})
	if err != nil {
		t.Fatal(err)
	}
	path := "/v1/orders/" + o.ID + "/charges"
	body := []byte(`{"payment_method":"pm_card_visa"}`)
	doc, _ := idempotency.DecodeJSON(body)
	fp, _ := idempotency.Fingerprint("POST", path, doc)
	req := idempotency.Request{CallerID: "acme", Key: "stalled-owner", Operation: charges.OperationCharge, Method: "POST", Path: path, Fingerprint: fp}
	type result struct {
		resp *idempotency.Response
		err  error
	}
	stalled := make(chan result, 1)
	go func() {
		resp, err := f.store.Serve(ctx, stalledCharges.ChargeOperation(), req, map[string]string{"order_id": o.ID}, body)
		stalled <- result{resp, err}
	}()
	<-inCall // the create phase committed; the owner is inside its processor call

	// Its lease runs out (on the database clock), and with it the
	// reconciler's wait for it; the reconciler recovers.
	if _, err := f.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second', next_attempt_at = now() - interval '1 second' WHERE key = 'stalled-owner'`); err != nil {
		t.Fatal(err)
	}
	if n, err := f.reconciler(t, 5).RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("reconciler: %d, %v", n, err)
	}
	recovered, err := f.store.Get(ctx, "acme", "stalled-owner")
	if err != nil || recovered.Status != "completed" || recovered.Attempt != 2 {
		t.Fatalf("after recovery the record is %s at attempt %d (%v)", recovered.Status, recovered.Attempt, err)
	}

	// Its write is refused, and its client is told what the operation's
	// current owner stored: the recovered result, as a replay.
	unpause()
	got := <-stalled
	if got.err != nil || got.resp == nil || !got.resp.Replayed || string(got.resp.Body) != string(recovered.ResponseBody) {
		t.Fatalf("the stalled owner got %v, %v; want its write refused and the recovered response replayed", got.resp, got.err)
	}
	after, err := f.store.Get(ctx, "acme", "stalled-owner")
	if err != nil || after.Attempt != 2 || string(after.ResponseBody) != string(recovered.ResponseBody) || after.UpdatedAt != recovered.UpdatedAt {
		t.Errorf("the stalled owner changed the recovered record (%v)", err)
	}
	var succeeded, evts int
	if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM charges WHERE status = 'succeeded'), (SELECT count(*) FROM events)`).Scan(&succeeded, &evts); err != nil {
		t.Fatal(err)
	}
	if succeeded != 1 || evts != 2 {
		t.Errorf("%d succeeded charges and %d events; want 1 and 2 (charge.succeeded, order.paid)", succeeded, evts)
	}
	if n := len(f.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

// A reconciler told to stop claims nothing more: a claim it could not
// finish would leave the record leased to nobody, and its client told 409,
// until the lease ran out.
func TestStoppedReconcilerClaimsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	f.stalledCharge(t, "left-alone")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := f.reconciler(t, 5).RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("a stopped reconciler claimed %d records (%v); want none", n, err)
	}
	var attempt int
	var leaseLive bool
	if err := f.pool.QueryRow(context.Background(), `SELECT attempt, locked_until > now() FROM idempotency_keys WHERE key = 'left-alone'`).Scan(&attempt, &leaseLive); err != nil {
		t.Fatal(err)
	}
	if attempt != 1 || leaseLive {
		t.Errorf("record at attempt %d, lease live %v; want it untouched (attempt 1, no live lease)", attempt, leaseLive)
	}
}

// A reconciler told to stop between claiming a record and trying it gives
// the record back untried: the lease ends at once, and the try it did not
// make is not counted, so restarting a replica never pushes a record
// toward being set aside. The claim is held on a table lock the test
// holds, and the stop comes while it waits.
func TestStoppingReconcilerGivesBackUntriedRecords(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	f.stalledCharge(t, "untried")
	ctx := context.Background()

	lock, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "LOCK TABLE idempotency_keys IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	claimed := make(chan int, 1)
	r := f.reconciler(t, 10)
	go func() {
		n, _ := r.RunOnce(runCtx)
		claimed <- n
	}()
	deadline := time.Now().Add(10 * time.Second)
	for waiting := 0; waiting == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the reconciler's claim never waited on the lock")
		}
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%reconciler_attempts + 1%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := <-claimed; n != 1 {
		t.Fatalf("the reconciler claimed %d records; want the one", n)
	}
	var attempts int
	var free bool
	if err := f.pool.QueryRow(ctx, `SELECT reconciler_attempts, locked_until <= now() AND next_attempt_at <= now() FROM idempotency_keys WHERE key = 'untried'`).Scan(&attempts, &free); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || !free {
		t.Errorf("after the stop: reconciler_attempts %d, free now %v; want 0 and free", attempts, free)
	}
}

// A record that never passed started is abandoned, however many tries or
// however much time it has used up: nothing happened, so there is nothing
// for a person to look at, and its client may simply retry. (The model
// check found the reconciler setting such a record aside instead, when
// its first abandon had been lost to a stall and it came back past its
// maximum attempts.)
func TestNeverStartedRecordIsDeletedNotDead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path,
		                              request_fingerprint, locked_until, next_attempt_at, reconciler_attempts, created_at)
		VALUES ('acme', 'worn-out', 'in_progress', 'started', 12, 'createCharge', 'POST', '/v1/orders/ord_x/charges',
		        '\x00', now() - interval '1 second', now() - interval '1 second', 11, now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	if n, err := f.reconciler(t, 10).RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce: %d, %v; want the one record", n, err)
	}
	var left int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'worn-out'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d records left (%v); want the never-started record abandoned (deleted), not set aside", left, err)
	}
}
