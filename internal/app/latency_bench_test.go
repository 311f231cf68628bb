package app

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

// How long a retry waits for its answer, in the two cases that matter
// most (docs/performance.md records the figures). They are benchmarks, not
// tests: they print what they measure, and assert only that the answers
// are right.

// BenchmarkDuplicateDuringSlowCharge: a charge whose processor call takes
// 1.5 s, and a duplicate with the same key sent 0.3 s after it, by a single
// raw request and by the project's Go client. It reports how long after
// the original's answer the duplicate got its own (ms-after-original: the
// worst over the iterations, and the mean).
func BenchmarkDuplicateDuringSlowCharge(b *testing.B) {
	ts := newTestServer(b, withConfig(func(c *config.Server) { c.RateLimit = 0 }))
	ts.setChaos(b, fakeprocessor.Chaos{LatencyMS: 1500})
	c, err := client.New(ts.URL, "sk_test_acme", client.DefaultPolicy(), nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, how := range []string{"raw", "client"} {
		b.Run(how, func(b *testing.B) {
			var lags []time.Duration
			i := 0
			for b.Loop() {
				i++
				o := ts.newOrder(b, "sk_test_acme", 1000+i) // a new amount: a new order (newOrder's key is the amount)
				key := fmt.Sprintf("slow-%s-%d", how, i)
				var originalDone, duplicateDone time.Time
				var wg sync.WaitGroup
				wg.Go(func() {
					if res := ts.do(b, chargeRequest(o.ID, key, "pm_card_visa")); res.Status != http.StatusCreated {
						b.Errorf("original: %d %s", res.Status, res.Body)
					}
					originalDone = time.Now()
				})
				time.Sleep(300 * time.Millisecond) // the duplicate is sent 0.3 s later: the scenario, not a wait for state
				switch how {
				case "raw":
					res := ts.do(b, chargeRequest(o.ID, key, "pm_card_visa"))
					if res.Status != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "true" {
						b.Errorf("duplicate: %d %s; want the original's 201, replayed", res.Status, res.Body)
					}
				case "client":
					_, result, err := c.Charge(context.Background(), o.ID, apiclient.PmCardVisa, client.WithIdempotencyKey(key))
					if err != nil || !result.Replayed {
						b.Errorf("duplicate through the client: %+v, %v; want the replay", result, err)
					}
				}
				duplicateDone = time.Now()
				wg.Wait()
				lags = append(lags, duplicateDone.Sub(originalDone))
			}
			reportLags(b, lags, "ms-after-original")
		})
	}
}

// BenchmarkAnswerAfterKill: a server SIGKILLed in the middle of a charge
// (after the processor charged the card, before anything was recorded),
// with the default 10 s lease; a client retrying as told, through another
// replica, gets its final answer this long after the kill (s-after-kill).
func BenchmarkAnswerAfterKill(b *testing.B) {
	processorURL := startProcessorProcess(b)
	dbURL := testdb.New(b)
	db := testdb.Pool(b, dbURL)
	common := []string{"PROCESSOR_URL=" + processorURL, "RECONCILER_ENABLED=false", "RATE_LIMIT_PER_SECOND=0"}
	survivor := startServerProcess(b, dbURL, common...)
	survivor.db = db
	var lags []time.Duration
	i := 0
	for b.Loop() {
		i++
		doomed := startServerProcess(b, dbURL, append(common, "FAULT_CRASH_POINTS="+AfterProcessorCall)...)
		doomed.db = db
		o := survivor.newOrder(b, "sk_test_acme", 2000+i)
		key := fmt.Sprintf("killed-%d", i)
		if res, err := doomed.send(b, context.Background(), chargeRequest(o.ID, key, "pm_card_visa")); err == nil {
			b.Fatalf("the doomed server answered %d %s; it should have died at the crash point", res.Status, res.Body)
		}
		_ = doomed.cmd.Wait()
		killed := time.Now()
		_, result, err := retryingClient(b, survivor.URL).Charge(context.Background(), o.ID,
			apiclient.PmCardVisa, client.WithIdempotencyKey(key))
		if err != nil {
			b.Fatalf("the retry after the kill: %+v, %v", result, err)
		}
		lags = append(lags, time.Since(killed))
		_ = doomed.cmd.Process.Signal(syscall.SIGKILL) // already dead; for the record
	}
	reportLags(b, lags, "s-after-kill")
}

// reportLags reports the worst and the mean of lags in the unit named.
func reportLags(b *testing.B, lags []time.Duration, unit string) {
	if len(lags) == 0 {
		return
	}
	scale := time.Millisecond
	if unit[0] == 's' {
		scale = time.Second
	}
	var sum time.Duration
	for _, l := range lags {
		sum += l
	}
	b.ReportMetric(float64(slices.Max(lags))/float64(scale), "max-"+unit)
	b.ReportMetric(float64(sum)/float64(len(lags))/float64(scale), "mean-"+unit)
}
