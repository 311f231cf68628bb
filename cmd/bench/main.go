// Command bench measures the idempotency layer against the database's own
// limit, in one run, on one machine, at one concurrency (make bench):
//
//  1. the floor: the statements the service runs for a keyed order create
//     (the key's lookup; then, in one transaction, the order insert and the
//     completed record's insert, BEGIN sent with the first and COMMIT with
//     the second, as the service does), and for a replay (the lookup
//     finding a completed key), issued straight through pgx, with no HTTP;
//  2. the service over HTTP (the real server binary, its in-process fake
//     processor answering at once): keyed creates, replays, a storm of
//     concurrent duplicates of one key, charges; and replays through a
//     second server with the replay cache off, each a claim;
//  3. the bare hop over HTTP (bare.go): this binary again as a child
//     process, net/http and a pgxpool running exactly the service's
//     statements and nothing else, with and without a replay cache: its
//     creates and replays are what the service's would cost if its own
//     code cost nothing;
//  4. how the claim and the replay grow with stored keys: their p99 with
//     10 thousand, 1 million and 10 million records in idempotency_keys
//     (built with generate_series, not through HTTP).
//
// It prints, in this order:
//
//   - what the database wrote per request (dbwork.go: commits, tuples, WAL
//     records and bytes, read from the log, exact) for a plain order insert,
//     a keyed create, a replay from the database and a charge, and keyed
//     create / plain insert;
//   - a line per phase: requests/s, p50 and p99 latency, requests done;
//   - a table of CPU per request, in µs, for each phase, by process (from
//     /proc, so on Linux only; see cpu.go): the server that answered (none
//     for the floor), the bench database's PostgreSQL backends, and this
//     process (the load generator, or pgx for the floor), and their total;
//   - the ratios of requests/s: service / floor (the targets), bare hop /
//     floor (what the hop costs), service / bare hop (what the service's
//     own code costs), for creates, cached replays and replays through the
//     database, each over the whole phases and then round by round (the
//     median and the range of the rounds' ratios: the run's own noise);
//   - the growth phase's lines, unless -sizes is empty.
//
// The phases that are compared (creates; replays) take turns (rounds of
// them, in an order that changes from round to round, see alternate), so
// that none meets a bigger table or a busier machine than the others did.
// The database is BENCH_DATABASE_URL (default: a payments_bench database on
// the local PostgreSQL), created, migrated and emptied by the run; the
// servers and the bare hops open it with the same pool settings (the
// default's pool_max_conns is the number of workers, -c: a worker waits
// for its answer before it sends again, so no pool ever needs more, and
// five pools of 20, the service's own default, would take all of a
// default PostgreSQL's 100 connections).
//
// With -tracing the service records every span and exports it over
// OTLP/HTTP to a receiver in this process, which counts them (otlp.go);
// without it the service runs as it does by default, with tracing off.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

var (
	concurrency = flag.Int("c", 16, "concurrent workers in every phase")
	duration    = flag.Duration("d", 10*time.Second, "how long each phase runs")
	rounds      = flag.Int("rounds", 0, "turns each compared phase's time is cut into (0: the smallest multiple of twice the phases compared that is at least 10: 12 for creates, 10 for replays)")
	sizes       = flag.String("sizes", "10000,1000000,10000000", "stored-record counts for the growth phase (empty: skip it)")
	serverBin   = flag.String("server", "", "the server binary (default: built by the run)")
	bareAddr    = flag.String("bare-serve", "", "serve the bare hop on this address and nothing else (the run starts this itself)")
	bareCache   = flag.Int("bare-cache", 0, "with -bare-serve: keep this many answers for replays (0: none)")
	bareSpin    = flag.Duration("bare-spin", 0, "the bare hops spin this long on the CPU before each request's work: an experiment, to see what a slower server costs PostgreSQL (docs/performance.md)")
	tracing     = flag.Bool("tracing", false, "run the service with tracing on: every span sampled and exported over OTLP/HTTP to a receiver in this process (otlp.go)")
)

var queries = dbsqlc.New()

func main() {
	flag.Parse()
	if *bareAddr != "" {
		if err := bareServe(*bareAddr, *bareCache, *bareSpin); err != nil {
			fmt.Fprintln(os.Stderr, "bench -bare-serve:", err)
			os.Exit(1)
		}
		return
	}
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
	cpu      cpuUsage
	server   bool      // whether a server answered (not the floor)
	turns    []float64 // requests/s in each round, when the phase took turns
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) String() string {
	return fmt.Sprintf("%-34s %9.0f req/s   p50 %7.2f ms   p99 %7.2f ms   (%d requests)",
		r.name, r.rps(), ms(r.p50), ms(r.p99), r.n)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// perRequest is d per request, in µs.
func (r result) perRequest(d time.Duration) float64 {
	return float64(d) / float64(time.Microsecond) / float64(r.n)
}

// cpuTable prints the phases' CPU per request, in µs, by process.
func cpuTable(results ...result) {
	if cpu.off {
		fmt.Printf("\nCPU per request: not measured (no /proc on this system)\n")
		return
	}
	fmt.Printf("\nCPU per request, µs (server: the process that answered; postgres: the bench database's backends;\n" +
		"client: this process, the load generator or, for the floor, pgx):\n")
	w := 0
	for _, r := range results {
		w = max(w, len(r.name))
	}
	fmt.Printf("  %-*s %7s %9s %7s %7s\n", w, "", "server", "postgres", "client", "total")
	for _, r := range results {
		server := "-"
		if r.server {
			server = fmt.Sprintf("%.0f", r.perRequest(r.cpu.server))
		}
		fmt.Printf("  %-*s %7s %9.0f %7.0f %7.0f\n", w, r.name, server, r.perRequest(r.cpu.postgres),
			r.perRequest(r.cpu.client), r.perRequest(r.cpu.server+r.cpu.postgres+r.cpu.client))
	}

	fmt.Printf("\nSystem calls per request, server (read and write calls, from /proc/<pid>/io; exact, not sampled):\n")
	fmt.Printf("  %-*s %7s %7s\n", w, "", "reads", "writes")
	for _, r := range results {
		if r.server {
			fmt.Printf("  %-*s %7.2f %7.2f\n", w, r.name,
				float64(r.cpu.serverIO.reads)/float64(r.n), float64(r.cpu.serverIO.writes)/float64(r.n))
		}
	}
}

// seq numbers operations across the whole run, so that every phase, and
// every turn of a phase, makes keys no other has used.
var seq atomic.Int64

// phase is one thing to measure: op runs once per request, with the
// worker's number and a number unique in the run; server is the process
// that answers it (0 for the floor), whose CPU the phase is charged.
type phase struct {
	name   string
	server int
	op     func(worker int, i int64) error
}

// cpu reads the processes' CPU time around every turn (cpu.go); set by run.
var cpu *meter

// measure runs p on c workers for d and returns its figures.
func measure(p phase, c int, d time.Duration) (result, error) {
	lat, elapsed, used, err := turn(p, c, d)
	if err != nil {
		return result{}, err
	}
	return summarize(p, lat, elapsed, used), nil
}

// alternate measures the phases that are compared with each other in
// turns: each runs for d in all, in roundsFor(len(phases)) turns, and its
// figures cover all its turns. Taking turns puts every phase against the
// same table sizes, the same autovacuum and the same noisy neighbours; run
// one after the other, the later phase would meet a bigger table and a
// differently busy machine, and the ratio would measure that too.
//
// The order changes from round to round, so that no phase mostly follows
// the same one and inherits what it left behind (its dirty pages, the
// autovacuum its writes set off, a checkpoint it brought on): round r runs
// the phases rotated by r/2, forwards in even rounds and backwards in odd
// ones. For three phases, six rounds make a balanced (Williams) design:
// every phase comes first, second and third twice, and follows each of
// the others twice within a round. For five, ten rounds have every phase
// in every place twice, and following each of its two neighbours in the
// list (taken as a circle) four times. Each phase's rate in each round is
// kept (result.turns), so that a ratio can be read round by round, each
// from turns a few seconds apart.
func alternate(c int, d time.Duration, phases ...phase) ([]result, error) {
	n := len(phases)
	count := roundsFor(n)
	lats := make([][]time.Duration, n)
	elapsed := make([]time.Duration, n)
	used := make([]cpuUsage, n)
	turns := make([][]float64, n)
	for r := range count {
		for j := range n {
			i := (r/2 + j) % n
			if r%2 == 1 {
				i = (r/2 + n - 1 - j) % n
			}
			lat, e, u, err := turn(phases[i], c, d/time.Duration(count))
			if err != nil {
				return nil, err
			}
			if len(lat) == 0 {
				return nil, fmt.Errorf("%s: a turn of %s answered nothing", phases[i].name, d/time.Duration(count))
			}
			lats[i] = append(lats[i], lat...)
			elapsed[i] += e
			used[i].add(u)
			turns[i] = append(turns[i], float64(len(lat))/e.Seconds())
		}
	}
	out := make([]result, n)
	for i, p := range phases {
		out[i] = summarize(p, lats[i], elapsed[i], used[i])
		out[i].turns = turns[i]
		fmt.Println(out[i])
	}
	return out, nil
}

// minTurn is the shortest turn alternate may be asked for: over a hundred
// requests at the slowest rates measured here, and ten ticks of the CPU
// clock.
const minTurn = 100 * time.Millisecond

// roundsFor is how many turns each of n compared phases takes: -rounds,
// or by default the smallest multiple of 2n (a whole number of alternate's
// balanced cycles) that is at least 10, and no more than -d allows.
func roundsFor(n int) int {
	if *rounds > 0 {
		return *rounds
	}
	r := 2 * n
	for r < 10 {
		r += 2 * n
	}
	return max(1, min(r, int(*duration/minTurn)))
}

// ratio is a's rate over b's, over the whole phases, followed by the
// median and the range of the same ratio taken round by round (a and b
// from one alternate call): how far one round's figure strays from
// another's says how much of a difference between runs is noise.
func ratio(a, b result) string {
	s := fmt.Sprintf("%.2f", a.rps()/b.rps())
	if len(a.turns) < 2 || len(a.turns) != len(b.turns) {
		return s
	}
	rs := make([]float64, len(a.turns))
	for i := range rs {
		rs[i] = a.turns[i] / b.turns[i]
	}
	slices.Sort(rs)
	median := rs[len(rs)/2]
	if len(rs)%2 == 0 {
		median = (rs[len(rs)/2-1] + median) / 2
	}
	return fmt.Sprintf("%s   (by round: median %.2f, %.2f-%.2f)", s, median, rs[0], rs[len(rs)-1])
}

// turn is run1 with the CPU the processes spent meanwhile.
func turn(p phase, c int, d time.Duration) ([]time.Duration, time.Duration, cpuUsage, error) {
	ctx := context.Background()
	r0, err := cpu.read(ctx, p.server)
	if err != nil {
		return nil, 0, cpuUsage{}, err
	}
	lat, elapsed, err := run1(p, c, d)
	if err != nil {
		return nil, 0, cpuUsage{}, err
	}
	r1, err := cpu.read(ctx, p.server)
	if err != nil {
		return nil, 0, cpuUsage{}, err
	}
	return lat, elapsed, since(r0, r1), nil
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

func summarize(p phase, lat []time.Duration, elapsed time.Duration, used cpuUsage) result {
	slices.Sort(lat)
	pct := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	return result{name: p.name, n: len(lat), elapsed: elapsed, p50: pct(0.50), p99: pct(0.99), cpu: used, server: p.server != 0}
}

func run(ctx context.Context) error {
	if *rounds < 0 {
		return fmt.Errorf("-rounds must be 0 (the default) or more, not %d", *rounds)
	}
	if *rounds > 0 && *duration/time.Duration(*rounds) < minTurn {
		return fmt.Errorf("-d %s in %d rounds makes turns shorter than %s", *duration, *rounds, minTurn)
	}
	dbURL := os.Getenv("BENCH_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/payments_bench?sslmode=disable&pool_max_conns=" + strconv.Itoa(*concurrency)
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
	cpu = newMeter(pool)
	fmt.Printf("bench: %d workers, %s per phase, database %s, service tracing %s\n\n", *concurrency, *duration, postgres.Redact(dbURL), map[bool]string{false: "off", true: "on (every span exported)"}[*tracing])

	// 1. The floor: the service's statements, straight through pgx.
	body := []byte(`{"amount":1999,"currency":"usd","description":"Tea"}`)
	fingerprint := sha256.Sum256(body)
	claim := func(key string) (dbsqlc.ClaimIdempotencyKeyRow, error) {
		return queries.ClaimIdempotencyKey(ctx, pool, dbsqlc.ClaimIdempotencyKeyParams{
			CallerID: "acme", Key: key, Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
			RequestFingerprint: fingerprint[:], LeaseSeconds: 30,
		})
	}
	find := func(key string) (dbsqlc.FindIdempotencyKeyRow, error) {
		return queries.FindIdempotencyKey(ctx, pool, dbsqlc.FindIdempotencyKeyParams{CallerID: "acme", Key: key})
	}
	// As the service's order create (idempotency.Store.ExecuteLocal): look
	// the key up; then, in one transaction, the order and the completed
	// record, BEGIN sent with the first and COMMIT with the second.
	create := func(key string) error {
		if _, err := find(key); !postgres.IsNotFound(err) {
			return fmt.Errorf("key %s was not new (%v)", key, err)
		}
		return postgres.TransactPipelined(ctx, pool, func(tx *postgres.PipelinedTx) error {
			o, err := queries.CreateOrder(ctx, tx, dbsqlc.CreateOrderParams{CallerID: "acme", ID: postgres.NewID(postgres.PrefixOrder), Amount: 1999, Currency: "usd"})
			if err != nil {
				return err
			}
			resp, _ := json.Marshal(o)
			status := int32(201)
			return queries.InsertCompletedIdempotencyKey(ctx, tx.ThenCommit(), dbsqlc.InsertCompletedIdempotencyKeyParams{
				CallerID: "acme", Key: key, Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
				RequestFingerprint: fingerprint[:], ResponseStatus: &status,
				ResponseHeaders: []byte(`{"Content-Type":["application/json"]}`), ResponseBody: resp,
			})
		})
	}

	// 2. The service: the real server binary, and a second one with the
	// replay cache off, whose replays are each the claim's round trip, as
	// on a replica that has not seen the key. And the bare hop (bare.go),
	// twice likewise: with the service's default replay cache (10,000
	// answers) and without.
	var traceEnv []string
	if *tracing {
		receiver, err := startOTLPReceiver()
		if err != nil {
			return err
		}
		defer receiver.report()
		traceEnv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + receiver.url, "OTEL_TRACES_SAMPLER=always_on"}
	}
	svc, err := startServer(ctx, dbURL, traceEnv...)
	if err != nil {
		return err
	}
	defer svc.stop()
	svcNoCache, err := startServer(ctx, dbURL, append(traceEnv, "IDEMPOTENCY_REPLAY_CACHE_SIZE=0")...)
	if err != nil {
		return err
	}
	defer svcNoCache.stop()
	bareHop, err := startBare(ctx, dbURL, 10_000)
	if err != nil {
		return err
	}
	defer bareHop.stop()
	bareNoCache, err := startBare(ctx, dbURL, 0)
	if err != nil {
		return err
	}
	defer bareNoCache.stop()
	base, baseNoCache := svc.base, svcNoCache.base
	// The load generator is fasthttp's client, not net/http's: on a machine
	// whose cores the client, the server and the database share, every
	// microsecond the client spends is taken from the other two, and
	// net/http's client spends several times what fasthttp's does per
	// request. (The floor's client, pgx, is lean already.)
	clients := map[string]*fasthttp.HostClient{}
	for _, b := range []string{base, baseNoCache, bareHop.base, bareNoCache.base} {
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

	// What the database wrote per request, from its log (dbwork.go), on
	// servers that have done nothing else yet: no phase's background work
	// (webhooks, the outbox's deliveries) runs on into the windows.
	const workN = 1000
	workOrders := make([]string, workN)
	for i := range workOrders {
		b, err := post("/v1/orders", "work-order-"+strconv.Itoa(i), body, 201)
		if err != nil {
			return err
		}
		var o struct{ ID string }
		_ = json.Unmarshal(b, &o)
		workOrders[i] = o.ID
	}
	fmt.Printf("\ndatabase work per request (from the WAL: exact; %d requests each, one at a time):\n", workN)
	var plain, keyed dbWork
	for _, w := range []struct {
		name string
		into *dbWork
		do   func(i int) error
	}{
		{"plain order insert (SQL)", &plain, func(int) error {
			_, err := queries.CreateOrder(ctx, pool, dbsqlc.CreateOrderParams{CallerID: "acme", ID: postgres.NewID(postgres.PrefixOrder), Amount: 1999, Currency: "usd"})
			return err
		}},
		{"service: keyed create", &keyed, func(i int) error {
			_, err := post("/v1/orders", "work-"+strconv.Itoa(i), body, 201)
			return err
		}},
		{"service: replay, cache off", nil, func(i int) error {
			_, err := postTo(baseNoCache, "/v1/orders", "work-"+strconv.Itoa(i), body, 201) // a key the first server made
			return err
		}},
		{"service: charge", nil, func(i int) error {
			// The order was made before the window, in work's first
			// pass; the processor's webhooks and the outbox's deliveries
			// that follow a charge land partly in the window.
			_, err := post("/v1/orders/"+workOrders[i]+"/charges", "work-charge-"+strconv.Itoa(i), []byte(`{"payment_method":"pm_card_visa"}`), 201)
			return err
		}},
	} {
		work, err := countWork(ctx, pool, workN, w.do)
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		if w.into != nil {
			*w.into = work
		}
		fmt.Printf("  %-28s %s\n", w.name, work)
	}
	fmt.Printf("  keyed create / plain insert: %.2f times the WAL records, %.2f times the tuples\n", keyed.records/plain.records, keyed.tuples/plain.tuples)

	// Creates: the floor, the service and the bare hop, in turns.
	creates, err := alternate(*concurrency, *duration,
		phase{"floor: keyed create (SQL)", 0, func(_ int, i int64) error {
			return create("floor-" + strconv.FormatInt(i, 10))
		}},
		phase{"service: keyed create (HTTP)", svc.pid, func(_ int, i int64) error {
			_, err := post("/v1/orders", "svc-"+strconv.FormatInt(i, 10), body, 201)
			return err
		}},
		phase{"bare hop: keyed create (HTTP)", bareHop.pid, func(_ int, i int64) error {
			_, err := postTo(bareHop.base, "/v1/orders", "bare-"+strconv.FormatInt(i, 10), body, 201)
			return err
		}})
	if err != nil {
		return err
	}
	floorCreate, svcCreate, bareCreate := creates[0], creates[1], creates[2]

	// Replays of 1,000 completed keys: the floor's own records for the
	// floor, the service's for the service, the bare hop's for the bare hop.
	replayKeys := 1000
	for i := range replayKeys {
		if err := create("replay-" + strconv.Itoa(i)); err != nil {
			return err
		}
		if _, err := post("/v1/orders", "svc-replay-"+strconv.Itoa(i), body, 201); err != nil {
			return err
		}
		if _, err := postTo(bareHop.base, "/v1/orders", "bare-replay-"+strconv.Itoa(i), body, 201); err != nil {
			return err
		}
	}
	replays, err := alternate(*concurrency, *duration,
		phase{"floor: replay (SQL)", 0, func(_ int, _ int64) error {
			row, err := find("replay-" + strconv.Itoa(rand.IntN(replayKeys)))
			if err == nil && row.IdempotencyKey.Status != "completed" {
				err = errors.New("the replay found no completed record")
			}
			return err
		}},
		phase{"service: replay (HTTP)", svc.pid, func(_ int, _ int64) error {
			_, err := post("/v1/orders", "svc-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}},
		phase{"service: replay, cache off (HTTP)", svcNoCache.pid, func(_ int, _ int64) error {
			_, err := postTo(baseNoCache, "/v1/orders", "svc-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}},
		phase{"bare hop: replay (HTTP)", bareHop.pid, func(_ int, _ int64) error {
			_, err := postTo(bareHop.base, "/v1/orders", "bare-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}},
		phase{"bare hop: replay, cache off (HTTP)", bareNoCache.pid, func(_ int, _ int64) error {
			_, err := postTo(bareNoCache.base, "/v1/orders", "bare-replay-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
			return err
		}})
	if err != nil {
		return err
	}
	floorReplay, svcReplay, svcReplayDB, bareReplay, bareReplayDB := replays[0], replays[1], replays[2], replays[3], replays[4]

	// A storm: every worker sends the same new key at once, round after
	// round; one request per round creates, the others get 409 or the replay.
	var round atomic.Int64
	woken0, err := wakeups(base)
	if err != nil {
		return err
	}
	storm, err := measure(phase{"service: duplicate storm (HTTP)", svc.pid, func(_ int, i int64) error {
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
	woken1, err := wakeups(base)
	if err != nil {
		return err
	}
	fmt.Println(wakeupLine(woken0, woken1))
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
	charges, err := measure(phase{"service: charge (HTTP, processor in-process)", svc.pid, func(_ int, _ int64) error {
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

	cpuTable(slices.Concat(creates, replays, []result{storm, charges})...)

	fmt.Printf("\nratios (one run, same machine, same concurrency):\n")
	fmt.Printf("  keyed create: service / floor         = %s   target >= 0.80\n", ratio(svcCreate, floorCreate))
	fmt.Printf("  keyed create: bare hop / floor        = %s\n", ratio(bareCreate, floorCreate))
	fmt.Printf("  keyed create: service / bare hop      = %s\n", ratio(svcCreate, bareCreate))
	fmt.Printf("  replay:       service / floor         = %s   target >= 0.60\n", ratio(svcReplay, floorReplay))
	fmt.Printf("  replay:       service / bare hop      = %s\n", ratio(svcReplay, bareReplay))
	fmt.Printf("  replay, cache off: service / floor    = %s\n", ratio(svcReplayDB, floorReplay))
	fmt.Printf("  replay, cache off: bare hop / floor   = %s\n", ratio(bareReplayDB, floorReplay))
	fmt.Printf("  replay, cache off: service / bare hop = %s\n", ratio(svcReplayDB, bareReplayDB))
	fmt.Printf("  replay / create (service)             = %.2f\n", svcReplay.rps()/svcCreate.rps())

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
		c, err := measure(phase{fmt.Sprintf("  claim, %d stored", target), 0, func(_ int, i int64) error {
			_, err := claim(fmt.Sprintf("grow-%d-%d", target, i))
			return err
		}}, *concurrency, d)
		if err != nil {
			return err
		}
		r, err := measure(phase{fmt.Sprintf("  replay, %d stored", target), 0, func(_ int, _ int64) error {
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

// child is a server process the run started: its URL, its pid (whose CPU
// the phases it answers are charged) and how to stop it.
type child struct {
	base string
	pid  int
	stop func()
}

// startServer runs the server binary on a free loopback port, with its
// in-process processor and no background workers.
func startServer(ctx context.Context, dbURL string, env ...string) (child, error) {
	bin := *serverBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "bench-")
		if err != nil {
			return child{}, err
		}
		bin = filepath.Join(dir, "server")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/retrysafe/payments/cmd/server").CombinedOutput(); err != nil {
			return child{}, fmt.Errorf("build the server: %v\n%s", err, out)
		}
	}
	return startChild(ctx, dbURL, func(addr string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(append(serverEnviron(), "HTTP_ADDR="+addr, "RECONCILER_ENABLED=false",
			"RELAY_ENABLED=false", "PAYOUT_WORKERS=0", "LOG_FORMAT=json",
			// The benchmark's callers are the demo callers, and a benchmark
			// measures the service, not the callers' rate limits: off.
			"SEED_DEMO_CALLERS=true", "RATE_LIMIT_PER_SECOND=0"), env...)
		return cmd
	})
}

// serverEnviron is this process's environment without the OpenTelemetry
// variables: the service's tracing is what -tracing says, never what the
// shell running the bench happened to export.
func serverEnviron() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OTEL_") })
}

// startBare runs the bare hop (bare.go): this binary again, in its
// -bare-serve mode, keeping cacheSize answers for replays.
func startBare(ctx context.Context, dbURL string, cacheSize int) (child, error) {
	self, err := os.Executable()
	if err != nil {
		return child{}, err
	}
	return startChild(ctx, dbURL, func(addr string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, self, "-bare-serve", addr, "-bare-cache", strconv.Itoa(cacheSize), "-bare-spin", bareSpin.String())
		cmd.Env = os.Environ()
		return cmd
	})
}

// startChild starts the command made for a free loopback port, with
// DATABASE_URL=dbURL, and waits until its /readyz answers 200.
func startChild(ctx context.Context, dbURL string, command func(addr string) *exec.Cmd) (child, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return child{}, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := command(addr)
	cmd.Env = append(cmd.Env, "DATABASE_URL="+dbURL)
	// The child's log (a line per request, for the service) goes to a
	// file, as a server's log goes to a file or to a collector in another
	// process. Not to a pipe into this process: reading it would be load
	// generator CPU, charged to the phases of whichever server logs more,
	// on the same two cores.
	logFile, err := os.CreateTemp("", "bench-child-*.log")
	if err != nil {
		return child{}, err
	}
	cmd.Stdout, cmd.Stderr = logFile, os.Stderr
	if err := cmd.Start(); err != nil {
		logFile.Close()
		os.Remove(logFile.Name())
		return child{}, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		os.Remove(logFile.Name())
	}
	for range 300 {
		if err := ctx.Err(); err != nil {
			stop()
			return child{}, err
		}
		if res, err := http.Get("http://" + addr + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return child{base: "http://" + addr, pid: cmd.Process.Pid, stop: stop}, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	return child{}, fmt.Errorf("%s did not become ready", cmd.Path)
}
