package app

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// setChaos replaces the fake processor's chaos settings through its admin
// endpoint, as an operator (or the demo) would.
func (ts *testServer) setChaos(t testing.TB, c fakeprocessor.Chaos) {
	t.Helper()
	body, _ := json.Marshal(c)
	req, _ := http.NewRequest(http.MethodPut, ts.processorURL+"/admin/chaos", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("set chaos: %d", res.StatusCode)
	}
}

// A processor outage must not lock a customer out of their own operation
// once it is over. Through the outage each retry gets a 503 (the owner gave
// the record up), never a 409 (nobody is working on it); the reconciler
// tries on its own schedule and backs off meanwhile; and the first retry
// after the processor recovers gets the final answer, with one charge at
// the processor.
func TestClientRetryIsNotLockedOutAfterAnOutage(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) {
		c.Lease = 2 * time.Second
		c.ProcessorTimeout = time.Second
		c.ReconcilerInterval = 10 * time.Millisecond
	}))
	o := ts.newOrder(t, "sk_test_acme", 2500)
	retry := chargeRequest(o.ID, "through-the-outage", "pm_card_visa")

	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1})
	for i := range 3 {
		res := ts.do(t, retry)
		res.wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
		if res.Header.Get("Retry-After") == "" {
			t.Fatalf("retry %d: a 503 without Retry-After", i)
		}
	}

	// The client goes quiet for a while. The reconciler takes the record
	// over on its own schedule, fails against the processor too, and backs
	// off. Stop it once it has tried, so that nothing else is in flight
	// when the client comes back.
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		ts.reconciler(t, time.Second).Run(ctx)
	}()
	waitFor(t, 20*time.Second, "the reconciler's own try during the outage", func() bool {
		var attempt int
		if err := ts.db.QueryRow(context.Background(),
			`SELECT attempt FROM idempotency_keys WHERE key = 'through-the-outage'`).Scan(&attempt); err != nil {
			t.Fatal(err)
		}
		return attempt >= 4 // three by the client, then the reconciler's
	})
	stop()
	<-stopped

	// The processor recovers, and the client's very next retry resumes the
	// charge: no 409, however the reconciler has scheduled its next try.
	ts.setChaos(t, fakeprocessor.Chaos{})
	res := ts.do(t, retry)
	if res.Status != http.StatusCreated {
		t.Fatalf("first retry after the outage: %d %s; want 201 at once", res.Status, res.Body)
	}
	var ch charge
	res.decode(t, &ch)
	n := 0
	for _, e := range ts.effects(t) {
		if e.Amount == 2500 {
			n++
		}
	}
	if ch.Status != "succeeded" || n != 1 {
		t.Fatalf("charge %s with %d processor effects; want succeeded with 1", ch.Status, n)
	}
}

// The outage as it was reported: the reconciler runs all along, and the
// client retries through the outage as fast as it likes. While the client
// keeps coming back, the reconciler leaves the record to it (each 503 puts
// the reconciler's next try a lease away), so the client never meets a 409,
// and its first retry after the processor recovers is answered.
func TestClientRetryingThroughAnOutageNeverMeetsA409(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) {
		c.Lease = 5 * time.Second
		c.ProcessorTimeout = time.Second
		c.ReconcilerInterval = 10 * time.Millisecond
	}))
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		ts.reconciler(t, time.Second).Run(ctx)
	}()
	t.Cleanup(func() { stop(); <-stopped })

	o := ts.newOrder(t, "sk_test_acme", 3100)
	retry := chargeRequest(o.ID, "fast-retries", "pm_card_visa")
	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1})
	for range 20 {
		ts.do(t, retry).wantProblem(t, http.StatusServiceUnavailable, "processor_unavailable")
	}
	ts.setChaos(t, fakeprocessor.Chaos{})
	if res := ts.do(t, retry); res.Status != http.StatusCreated {
		t.Fatalf("first retry after the outage: %d %s; want 201", res.Status, res.Body)
	}
	var reconcilerTries int
	if err := ts.db.QueryRow(context.Background(),
		`SELECT reconciler_attempts FROM idempotency_keys WHERE key = 'fast-retries'`).Scan(&reconcilerTries); err != nil {
		t.Fatal(err)
	}
	if reconcilerTries != 0 {
		t.Errorf("the reconciler took the record over %d times while its client was retrying; want 0", reconcilerTries)
	}
}
