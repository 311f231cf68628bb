// Command bench measures the idempotency layer against the database's own
// limit, in one run, on one machine, at one concurrency (make bench):
//
//  1. the floor: the statements the service runs for a keyed order create
//     (the claim; then, in one transaction, the order insert and the
//     record's completion), and for a replay (the claim finding a completed
//     key), issued straight through pgx, with no HTTP;
//  2. the service over HTTP (the real server binary, its in-process fake
//     processor answering at once): keyed creates, replays, a storm of
//     concurrent duplicates of one key, charges; and replays through a
//     second server with the replay cache off, each a claim;
//  3. how the claim and the replay grow with stored keys: their p99 with
//     10 thousand, 1 million and 10 million records in idempotency_keys
//     (built with generate_series, not through HTTP).
//
// It prints requests/s, p50 and p99 for each, and the ratios service/floor.
// The phases that are compared (creates; replays) take turns, so that none
// meets a bigger table or a busier machine than the others did.
// The database is BENCH_DATABASE_URL (default: a payments_bench database on
// the local PostgreSQL), created, migrated and emptied by the run.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

var (
	concurrency = flag.Int("c", 16, "concurrent workers in every phase")
	duration    = flag.Duration("d", 10*time.Second, "how long each phase runs")
	sizes       = flag.String("sizes", "10000,1000000,10000000", "stored-record counts for the growth phase (empty: skip it)")
	serverBin   = flag.String("server", "", "the server binary (default: built by the run)")
)

var queries = dbsqlc.New()

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// result is one phase's figures.
type result struct {
	name     string
	n        int
	elapsed  time.Duration
	p50, p99 time.Duration
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) String() string {
	return fmt.Sprintf("%-34s %9.0f req/s   p50 %7.2f ms   p99 %7.2f ms   (%d requests)",
		r.name, r.rps(), ms(r.p50), ms(r.p99), r.n)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// seq numbers operations across the whole run, so that every phase, and
// every turn of a phase, makes keys no other has used.
var seq atomic.Int64

// phase is one thing to measure: op runs once per request, with the
// worker's number and a number unique in the run.
type phase struct {
	name string
	op   func(worker int, i int64) error
}

// measure runs p on c workers for d and returns its figures.
func measure(p phase, c int, d time.Duration) (result, error) {
	lat, elapsed, err := run1(p, c, d)
	if err != nil {
		return result{}, err
	}
	return summarize(p.name, lat, elapsed), nil
}

// alternate measures the phases that are compared with each other in
// turns: each runs for d in all, in rounds turns of d/rounds, and its
// figures cover all its turns. Taking turns puts every phase against the
// same table sizes, the same autovacuum and the same noisy neighbours; run
// one after the other, the later phase would meet a bigger table and a
// differently busy machine, and the ratio would measure that too.
func alternate(rounds, c int, d time.Duration, phases ...phase) ([]result, error) {
	lats := make([][]time.Duration, len(phases))
	elapsed := make([]time.Duration, len(phases))
	for range rounds {
		for i, p := range phases {
			lat, e, err := run1(p, c, d/time.Duration(rounds))
			if err != nil {
				return nil, err
			}
			lats[i] = append(lats[i], lat...)
			elapsed[i] += e
		}
	}
	out := make([]result, len(phases))
	for i, p := range phases {
		out[i] = summarize(p.name, lats[i], elapsed[i])
		fmt.Println(out[i])
	}
	return out, nil
}

// run1 runs p on c workers for d: each worker sends its next request as
// soon as its last is answered.
func run1(p phase, c int, d time.Duration) ([]time.Duration, time.Duration, error) {
	var (
		mu    sync.Mutex
		lat   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := range c {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				i := seq.Add(1)
				t0 := time.Now()
				if err := p.op(w, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return nil, 0, fmt.Errorf("%s: %w", p.name, first)
	}
	return lat, time.Since(start), nil
}

func summarize(name string, lat []time.Duration, elapsed time.Duration) result {
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	return result{name: name, n: len(lat), elapsed: elapsed, p50: pct(0.50), p99: pct(0.99)}
}

func run(ctx context.Context) error {
	dbURL := os.Getenv("BENCH_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/payments_bench?sslmode=disable&pool_max_conns=20"
	}
	pool, err := postgres.Open(ctx, dbURL, true)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE idempotency_keys, orders, charges, refunds, payouts, balances, events, processor_events CASCADE`); err != nil {
		return err
	}
	if err := auth.SeedDemoCallers(ctx, pool); err != nil {
		return err
	}
	fmt.Printf("bench: %d workers, %s per phase, database %s\n\n", *concurrency, *duration, postgres.Redact(dbURL))

	// 1. The floor: the service's statements, straight through pgx.
	body := []byte(`{"amount":1999,"currency":"usd","description":"Tea"}`)
	fingerprint := sha256.Sum256(body)
	claim := func(key string) (dbsqlc.ClaimIdempotencyKeyRow, error) {
		return queries.ClaimIdempotencyKey(ctx, pool, dbsqlc.ClaimIdempotencyKeyParams{
			CallerID: "acme", Key: key, Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
			RequestFingerprint: fingerprint[:], LeaseSeconds: 30,
		})
	}
	create := func(key string) error {
		row, err := claim(key)
		if err != nil {
			return err
		}
		if !row.Claimed {
			return fmt.Errorf("key %s was not new", key)
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			o, err := queries.CreateOrder(ctx, tx, dbsqlc.CreateOrderParams{CallerID: "acme", ID: postgres.NewID(postgres.PrefixOrder), Amount: 1999, Currency: "usd"})
			if err != nil {
				return err
			}
			resp, _ := json.Marshal(o)
			status := int32(201)
			n, err := queries.CompleteIdempotencyKey(ctx, tx, dbsqlc.CompleteIdempotencyKeyParams{
				ResponseStatus: &status, ResponseHeaders: []byte(`{"Content-Type":["application/json"]}`), ResponseBody: resp,
				CallerID: "acme", ID: row.ID, Attempt: row.Attempt,
			})
			if err == nil && n != 1 {
				err = errors.New("record not completed")
			}
			return err
		})
	}

	// 2. The service: the real server binary, and a second one with the
	// replay cache off, whose replays are each the claim's round trip, as
	// on a replica that has not seen the key.
	base, stop, err := startServer(ctx, dbURL)
	if err != nil {
		return err
	}
	defer stop()
	baseNoCache, stopNoCache, err := startServer(ctx, dbURL, "IDEMPOTENCY_REPLAY_CACHE_SIZE=0")
	if err != nil {
		return err
	}
	defer stopNoCache()
	// The load generator is fasthttp's client, not net/http's: on a machine
	// whose cores the client, the server and the database share, every
	// microsecond the client spends is taken from the other two, and
	// net/http's client spends several times what fasthttp's does per
	// request. (The floor's client, pgx, is lean already.)
	clients := map[string]*fasthttp.HostClient{}
	for _, b := range []string{base, baseNoCache} {
		clients[b] = &fasthttp.HostClient{Addr: strings.TrimPrefix(b, "http://"), MaxConns: *concurrency * 2}
	}
	postTo := func(base, path, key string, body []byte, want ...int) ([]byte, error) {
		req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(res)
		req.SetRequestURI(base + path)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.SetContentType("application/json")
		req.Header.Set("Idempotency-Key", key)
		req.SetBody(body)
		if err := clients[base].DoTimeout(req, res, 30*time.Second); err != nil {
			return nil, err
		}
		b := bytes.Clone(res.Body())
		if !slices.Contains(want, res.StatusCode()) {
			return b, fmt.Errorf("POST %s: %d %s", path, res.StatusCode(), b)
		}
		return b, nil
	}
	post := func(path, key string, body []byte, want ...int) ([]byte, error) {
		return postTo(base, path, key, body, want...)
	}

	// Creates: the floor and the service, in turns.
	const rounds = 4
	creates, err := alternate(rounds, *concurrency, *duration,
		phase{"floor: keyed create (SQL)", func(_ int, i int64) error {
			return create("floor-" + strconv.FormatInt(i, 10))
		}},
		phase{"service: keyed create (HTTP)", func(_ int, i int64) error {
			_, err := post("/v1/orders", "svc-"+strconv.FormatInt(i, 10), body, 201)
			return err
		}})
	if err != nil {
		return err
	}
	floorCreate, svcCreate := creates[0], creates[1]

	// Replays of 1,000 completed keys: the floor's own records for the
	// floor, the service's for the service.
	replayKeys := 1000
	for i := range replayKeys {
		if err := create("replay-" + strconv.Itoa(i)); err != nil {
			return err
		}
		if _, err := post("/v1/orders", "svc-replay-"+strconv.Itoa(i), body, 201); err != nil {
			return err
		}
	}
	replays, err := alternate(rounds, *concurrency, *duration,
		phase{"floor: replay (SQL)", func(_ int, _ int64) error {
			row, err := claim("replay-" + strconv.Itoa(rand.IntN(replayKeys)))
			if err == nil && (row.Claimed || row.Status != "completed") {
				err = errors.New("the replay claimed a key")
			}
			return err
		}},
		phase{"service: replay (HTTP)", func(_ int, _ int64) error {
			_, err := post("/v1/orders", "svc-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}},
		phase{"service: replay, cache off (HTTP)", func(_ int, _ int64) error {
			_, err := postTo(baseNoCache, "/v1/orders", "svc-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}})
	if err != nil {
		return err
	}
	floorReplay, svcReplay, svcReplayDB := replays[0], replays[1], replays[2]

	// A storm: every worker sends the same new key at once, round after
	// round; one request per round creates, the others get 409 or the replay.
	var round atomic.Int64
	storm, err := measure(phase{"service: duplicate storm (HTTP)", func(_ int, i int64) error {
		key := "storm-" + strconv.FormatInt(round.Load(), 10)
		if i%int64(*concurrency) == 0 {
			round.Add(1)
		}
		_, err := post("/v1/orders", key, body, 201, 409)
		return err
	}}, *concurrency, *duration)
	if err != nil {
		return err
	}
	fmt.Println(storm)
	// Charges: each request charges its own fresh order.
	orders := make(chan string, 100_000)
	for i := range 20_000 {
		b, err := post("/v1/orders", "charge-order-"+strconv.Itoa(i), body, 201)
		if err != nil {
			return err
		}
		var o struct{ ID string }
		_ = json.Unmarshal(b, &o)
		orders <- o.ID
	}
	charges, err := measure(phase{"service: charge (HTTP, processor in-process)", func(_ int, _ int64) error {
		select {
		case id := <-orders:
			_, err := post("/v1/orders/"+id+"/charges", "charge-"+id, []byte(`{"payment_method":"pm_card_visa"}`), 201)
			return err
		default:
			return errors.New("ran out of orders to charge: raise the count")
		}
	}}, *concurrency, *duration)
	if err != nil {
		return err
	}
	fmt.Println(charges)

	fmt.Printf("\nratios (one run, same machine, same concurrency):\n")
	fmt.Printf("  keyed create: service / floor      = %.2f   (target >= 0.80)\n", svcCreate.rps()/floorCreate.rps())
	fmt.Printf("  replay:       service / floor      = %.2f   (target >= 0.60)\n", svcReplay.rps()/floorReplay.rps())
	fmt.Printf("  replay, cache off: service / floor = %.2f\n", svcReplayDB.rps()/floorReplay.rps())
	fmt.Printf("  replay / create (service)          = %.2f\n", svcReplay.rps()/svcCreate.rps())

	// 3. Growth with stored keys.
	if *sizes == "" {
		return nil
	}
	fmt.Printf("\nclaim and replay with stored records (SQL, %d workers):\n", *concurrency)
	stored := 0
	for s := range strings.SplitSeq(*sizes, ",") {
		target, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		if err := fill(ctx, pool, stored, target, fingerprint[:]); err != nil {
			return err
		}
		stored = target
		d := min(*duration, 5*time.Second)
		c, err := measure(phase{fmt.Sprintf("  claim, %d stored", target), func(_ int, i int64) error {
			_, err := claim(fmt.Sprintf("grow-%d-%d", target, i))
			return err
		}}, *concurrency, d)
		if err != nil {
			return err
		}
		r, err := measure(phase{fmt.Sprintf("  replay, %d stored", target), func(_ int, _ int64) error {
			row, err := claim("filled-" + strconv.Itoa(rand.IntN(target)))
			if err == nil && row.Claimed {
				err = errors.New("the replay claimed a key")
			}
			return err
		}}, *concurrency, d)
		if err != nil {
			return err
		}
		fmt.Println(c)
		fmt.Println(r)
	}
	return nil
}

// fill adds completed records filled-from … filled-(to-1), as the sweeper
// would find them after a day of traffic, with generate_series.
func fill(ctx context.Context, pool *pgxpool.Pool, from, to int, fingerprint []byte) error {
	start := time.Now()
	_, err := pool.Exec(ctx, `
		INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path,
		                              request_fingerprint, response_status, response_headers, response_body, completed_at)
		SELECT 'acme', 'filled-' || g, 'completed', 'finished', 1, 'createOrder', 'POST', '/v1/orders',
		       $3, 201, '{"Content-Type":["application/json"]}', '{"id":"ord_x","amount":1999,"currency":"usd","status":"pending"}', now()
		FROM generate_series($1::int, $2::int - 1) AS g`, from, to, fingerprint)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
		return err
	}
	fmt.Printf("  (filled to %d records in %s)\n", to, time.Since(start).Round(time.Second))
	return nil
}

// startServer runs the server binary on a free loopback port, with its
// in-process processor and no background workers.
func startServer(ctx context.Context, dbURL string, env ...string) (string, func(), error) {
	bin := *serverBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "bench-")
		if err != nil {
			return "", nil, err
		}
		bin = filepath.Join(dir, "server")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/retrysafe/payments/cmd/server").CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("build the server: %v\n%s", err, out)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL, "HTTP_ADDR="+addr, "RECONCILER_ENABLED=false",
		"RELAY_ENABLED=false", "PAYOUT_WORKERS=0", "LOG_FORMAT=json",
		// The benchmark's callers are the demo callers, and a benchmark
		// measures the service, not the callers' rate limits: off.
		"SEED_DEMO_CALLERS=true", "RATE_LIMIT_PER_SECOND=0"), env...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for range 300 {
		if res, err := http.Get("http://" + addr + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return "http://" + addr, stop, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	return "", nil, errors.New("the server did not become ready")
}
