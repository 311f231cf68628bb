package sweeper_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkSweepMillion sweeps 1,000,000 expired idempotency records while
// a client claims new keys, and reports the sweep's rate (records/s) and
// the claims' latency (p50, p99) during the sweep. One iteration is one
// whole sweep; run it with -benchtime=1x (make bench-sweeper).
func BenchmarkSweepMillion(b *testing.B) {
	const n = 1_000_000
	for b.Loop() {
		b.StopTimer()
		pool := newPoolTB(b)
		seed(b, pool, n)
		b.StartTimer()

		stop := make(chan struct{})
		var latencies []time.Duration
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if _, err := pool.Exec(context.Background(), `
					INSERT INTO idempotency_keys (caller_id, key, operation, request_method, request_path, request_fingerprint, locked_until)
					VALUES ('acme', $1, 'createOrder', 'POST', '/v1/orders', '\x00', now() + interval '30 seconds')
					ON CONFLICT (caller_id, key) DO NOTHING`, fmt.Sprintf("claim-%d", i)); err != nil {
					b.Error(err)
					return
				}
				latencies = append(latencies, time.Since(start))
			}
		})
		start := time.Now()
		r, err := newSweeper(b, config(5000), pool).Sweep(context.Background())
		elapsed := time.Since(start)
		close(stop)
		wg.Wait()
		if err != nil || r.Keys != n {
			b.Fatalf("sweep: %+v, %v; want %d deleted", r, err, n)
		}
		slices.Sort(latencies)
		b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
		b.ReportMetric(float64(r.Batches), "batches")
		b.ReportMetric(float64(len(latencies)), "claims")
		if len(latencies) > 0 {
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "claim-p50-ms")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "claim-p99-ms")
		}
	}
}

// seed inserts n completed records past the window, in chunks.
func seed(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	for done := 0; done < n; done += 100_000 {
		if _, err := pool.Exec(context.Background(), `
			INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, operation, request_method, request_path,
			                              request_fingerprint, response_status, response_headers, response_body, created_at)
			SELECT 'acme', 'old-' || g, 'completed', 'finished', 'createOrder', 'POST', '/v1/orders', '\x00', 201, '{}', '\x7b7d',
			       now() - interval '25 hours' - make_interval(secs => g)
			FROM generate_series($1::int, $2::int) g`, done, done+99_999); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(context.Background(), `VACUUM ANALYZE idempotency_keys`); err != nil {
		b.Fatal(err)
	}
}
