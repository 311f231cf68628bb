package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/testdb"
)

// Benchmarks of the hot path through HTTP against the real database. Run
// them with `make bench-go`; docs/performance.md records the figures. Besides
// time per request they report the SQL statements the server sent per
// request (statements/op) and the round trips they took (roundtrips/op),
// counted by a pgx tracer on the server's pool: the structural cost that
// time figures on a shared machine blur.
//
//	keyed create: the key's check, BEGIN, INSERT order RETURNING (1 round trip),
//	              INSERT record, COMMIT (1): 5 statements in 2 round trips
//	replay:       0 (the replay cache); from the database, 2: the batch that
//	              fails on the key, and the look-up with the replication check
//	auth:         0 (known keys are cached)
//
// (A batch is one round trip; the first time a connection meets one of its
// statements, pgx prepares it on one more, which a long run amortises.)
// The counter is testdb.Counter, a pgx tracer on the server's pool.

func benchServer(b *testing.B, opts ...func(*serverOptions)) (*testServer, *testdb.Counter) {
	// BENCH_TRACING=on measures the cost of tracing: every span recorded
	// (sampled always) and kept, in the demo's in-memory store, as an
	// exporter would be handed it. Off (the default) is the service as it
	// runs without OTEL_EXPORTER_OTLP_ENDPOINT: no provider, no-op spans.
	// It is per process (the provider is global): run the benchmark once
	// each way (docs/performance.md).
	if os.Getenv("BENCH_TRACING") == "on" {
		testTracing(b)
	}
	counter := &testdb.Counter{}
	ts := newTestServer(b, append(opts, func(o *serverOptions) {
		o.pool = func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }
		// A benchmark measures the service, not the caller's rate limit:
		// off, whatever else the benchmark configures.
		configure := o.config
		o.config = func(c *config.Server) {
			if configure != nil {
				configure(c)
			}
			c.RateLimit = 0
		}
	})...)
	// Warm up: the first request authenticates against the database and
	// fills the key cache; the benchmark measures the steady state.
	if res := ts.createOrder(b, "warm-up", teaOrder); res.Status != http.StatusCreated {
		b.Fatalf("warm-up: %d %s", res.Status, res.Body)
	}
	return ts, counter
}

func report(b *testing.B, counter *testdb.Counter, before testdb.Counts) {
	now := counter.Load()
	b.ReportMetric(float64(now.Statements-before.Statements)/float64(b.N), "statements/op")
	b.ReportMetric(float64(now.RoundTrips-before.RoundTrips)/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkCreateOrderKeyed: a new key per request, one request at a time.
func BenchmarkCreateOrderKeyed(b *testing.B) {
	ts, counter := benchServer(b)
	before := counter.Load()
	i := 0
	for b.Loop() {
		i++
		if res := ts.createOrder(b, "bench-"+strconv.Itoa(i), teaOrder); res.Status != http.StatusCreated {
			b.Fatalf("%d %s", res.Status, res.Body)
		}
	}
	report(b, counter, before)
}

// BenchmarkCreateOrderKeyedParallel: new keys from many concurrent clients.
func BenchmarkCreateOrderKeyedParallel(b *testing.B) {
	ts, counter := benchServer(b)
	before := counter.Load()
	var next atomic.Int64
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := "bench-" + strconv.FormatInt(next.Add(1), 10)
			// send, not createOrder: b.Fatal may not be called off the
			// benchmark's goroutine.
			res, err := ts.send(b, context.Background(), ordersRequest(key, teaOrder))
			if err != nil || res.Status != http.StatusCreated {
				b.Errorf("%v %d %s", err, res.Status, res.Body)
				return
			}
		}
	})
	report(b, counter, before)
}

// BenchmarkReplay: the same completed key, replayed (from the replay
// cache: no statement).
func BenchmarkReplay(b *testing.B) { benchReplay(b) }

// BenchmarkReplayParallel: replays from many concurrent clients.
func BenchmarkReplayParallel(b *testing.B) { benchReplayParallel(b) }

// BenchmarkReplayFromDatabase: replays with the replay cache off, as on a
// replica that has not seen the key: one statement, the claim.
func BenchmarkReplayFromDatabase(b *testing.B) { benchReplay(b, noReplayCache) }

// BenchmarkReplayFromDatabaseParallel: the same, from many concurrent
// clients.
func BenchmarkReplayFromDatabaseParallel(b *testing.B) { benchReplayParallel(b, noReplayCache) }

var noReplayCache = withConfig(func(c *config.Server) { c.ReplayCacheSize = 0 })

func benchReplay(b *testing.B, opts ...func(*serverOptions)) {
	ts, counter := benchServer(b, opts...)
	before := counter.Load()
	for b.Loop() {
		if res := ts.createOrder(b, "warm-up", teaOrder); res.Header.Get("Idempotent-Replayed") != "true" {
			b.Fatalf("not a replay: %d %s", res.Status, res.Body)
		}
	}
	report(b, counter, before)
}

func benchReplayParallel(b *testing.B, opts ...func(*serverOptions)) {
	ts, counter := benchServer(b, opts...)
	before := counter.Load()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := ts.send(b, context.Background(), ordersRequest("warm-up", teaOrder))
			if err != nil || res.Header.Get("Idempotent-Replayed") != "true" {
				b.Errorf("not a replay: %v %d %s", err, res.Status, res.Body)
				return
			}
		}
	})
	report(b, counter, before)
}

// BenchmarkHostileBodies: the most expensive 64 KiB bodies we know how to
// build, each sent to POST /v1/orders by an authenticated caller and
// refused with a 400 (docs/performance.md records the figures). The
// handler is called directly, so that time and bytes allocated per request
// are the server's alone.
func BenchmarkHostileBodies(b *testing.B) {
	ts, _ := benchServer(b)
	const size = 64 << 10
	fill := func(prefix, unit, suffix string) string {
		var s strings.Builder
		s.WriteString(prefix)
		for i := 0; s.Len()+len(unit)+len(suffix)+8 < size; i++ {
			if i > 0 {
				s.WriteByte(',')
			}
			s.WriteString(strings.ReplaceAll(unit, "%d", strconv.Itoa(i)))
		}
		s.WriteString(suffix)
		return s.String()
	}
	for name, body := range map[string]string{
		"deep-nesting":  strings.Repeat("[", size),
		"deep-objects":  strings.Repeat(`{"a":`, size/5),
		"many-members":  fill("{", `"m%d":0`, "}"),
		"escaped-names": fill("{", `"\u0041\u0042%d":0`, "}"),
		"many-objects":  fill("[", `{"a":0,"b":1}`, "]"),
		"long-string":   `{"amount":1,"currency":"usd","description":"` + strings.Repeat("x", size-60) + `"}`,
		"many-escapes":  `{"amount":1,"currency":"usd","description":"` + strings.Repeat(`\u0041`, (size-60)/6) + `"}`,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer sk_test_acme")
				req.Header.Set("Idempotency-Key", "hostile")
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				ts.handler.ServeHTTP(rec, req)
				if rec.Code != http.StatusBadRequest {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
