package soak

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/testdb"
)

// TestHistoryCheckFindsUnfencedCompletion shows that the history check can
// fail, and on what: the bug the fence exists to stop. It runs a short
// soak twice, on servers as usual and on servers started with
// FAULT_UNFENCED_COMPLETION=true (idempotency.Faults), whose completion is
// written without its fence (attempt, status, live lease).
//
// The soak makes takeovers happen on purpose: two replicas, each stalling
// an owner right after it inserts a record (FAULT_STALL_POINTS=after_claim:
// two leases without renewing, as a paused process would), and every
// charge sent twice at once, to both replicas. Whichever copy claims the
// key stalls; the other waits for it (IDEMPOTENCY_WAIT), sees its lease
// lapse, takes the record over, charges the order, completes the record
// and answers. Then the stalled owner wakes and runs the charge's first
// phase, which finds the order paid: a final answer, which it tries to
// store. With the fence that write is refused, its work rolls back, and it
// answers with the stored response: the history is linearizable. Without
// it, it overwrites the answer a client already has with another: two
// completions, two different answers under one key, and the check must
// say so and draw the key. (Orders cannot show it: an order create is one
// transaction with its record, and has no lease to lose.)
func TestHistoryCheckFindsUnfencedCompletion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		unfenced     bool
		linearizable bool
	}{{false, true}, {true, false}} {
		t.Run(fmt.Sprintf("unfenced=%t", c.unfenced), func(t *testing.T) {
			t.Parallel()
			res, takeovers := stalledSoak(t, c.unfenced)
			for _, l := range res.lines() {
				t.Log(l)
			}
			t.Logf("takeovers           %d records taken over from a stalled owner", takeovers)
			if takeovers < 3 || res.partitions < 3 {
				t.Fatalf("the soak did too little to show anything: %d takeovers, %d keys", takeovers, res.partitions)
			}
			switch {
			case c.linearizable && len(res.illegal)+len(res.undecided) > 0:
				t.Errorf("the fenced build: %d keys not linearizable (%q), %d undecided; visualisations: %q",
					len(res.illegal), res.illegal, len(res.undecided), res.files)
			case !c.linearizable && len(res.illegal) == 0:
				t.Errorf("without the fence, the history check found nothing (%d takeovers)", takeovers)
			case !c.linearizable:
				t.Logf("not linearizable, as it must be: %q; the first:", res.illegal)
				for _, h := range res.firstIllegal {
					t.Logf("  %s", h)
				}
				for _, f := range res.files {
					if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
						t.Errorf("visualisation %s: %v", f, err)
					}
				}
			}
		})
	}
}

// stalledSoak runs the load of TestHistoryCheckFindsUnfencedCompletion on
// servers that write their completions unfenced or not, and returns the history check's result and how
// many records were taken over.
func stalledSoak(t *testing.T, unfenced bool) (historyResult, int) {
	dbURL := testdb.New(t)
	db := testdb.Pool(t, dbURL)
	sv := startServers(t, dbURL, serversConfig{replicas: 2, env: []string{
		"FAULT_UNFENCED_COMPLETION=" + strconv.FormatBool(unfenced),
		// A short lease keeps the stall (two leases) short. The reconciler
		// is off, so that what takes a record over is the waiting copy,
		// as it is for a client's retry.
		"IDEMPOTENCY_LEASE=1s", "IDEMPOTENCY_WAIT=5s", "FAULT_STALL_POINTS=after_claim", "RECONCILER_ENABLED=false",
	}})
	s := newSoak(t, sv.urls)
	s.historyDir = t.TempDir()
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	var clients sync.WaitGroup
	for n := range 4 {
		clients.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				s.operations.Add(1)
				order := s.keyed(ctx, &op{key: fmt.Sprintf("stall-c%d-%d-order", n, i), method: "POST", path: "/v1/orders",
					body: fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, 100+i)})
				if order.status != http.StatusCreated {
					continue
				}
				o := &op{key: fmt.Sprintf("stall-c%d-%d", n, i), method: "POST", path: "/v1/orders/" + order.id + "/charges",
					body: `{"payment_method":"pm_card_visa"}`}
				dup := *o
				// Both copies at once, one on each replica, each until it
				// has a final answer; not bound to ctx, so that every key
				// the load began ends with its answers.
				var both sync.WaitGroup
				for r, c := range []*op{o, &dup} {
					both.Go(func() {
						for attempts := 0; c.status == 0 && attempts < 5; attempts++ {
							s.finalize(c, s.send(context.Background(), s.newClient(sv.urls[r], s.attemptTimeout, 8), c))
						}
					})
				}
				both.Wait()
				if o.status == 0 || dup.status == 0 {
					t.Errorf("key %s: no final answer (%d, %d)", o.key, o.status, dup.status)
				}
				s.mu.Lock()
				s.ops[o.key] = o
				s.mu.Unlock()
			}
		})
	}
	clients.Wait()
	var takeovers int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE attempt > 1`).Scan(&takeovers); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	history := slices.Clone(s.history)
	s.mu.Unlock()
	res, err := checkHistory(history, s.historyDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range history {
		if h.status >= http.StatusInternalServerError && h.status != http.StatusServiceUnavailable {
			t.Errorf("key %s: %d", h.key, h.status)
		}
	}
	return res, takeovers
}
