// Command bench measures what a keyed request costs the database, and how
// fast the service runs against the database's own limit, in one run on
// one machine (make bench; docs/performance.md has the method and the
// figures). It prints:
//
//  1. each phase's work per request, counted exactly (dbwork.go);
//  2. requests/s and p50/p99, the compared phases taking turns (alternate):
//     a plain order insert through pgx (the physical limit of a create),
//     the floor (the service's statements through pgx) and the service's
//     keyed creates over HTTP; then the replays; charges; payouts;
//  3. the ratios, and with -baseline, this server / that one (an
//     optimization's with and without, in the same run);
//  4. how the claim and the replay grow with stored keys (-sizes).
//
// The servers are the real binary with its in-process fake processor and
// no background workers. The database is BENCH_DATABASE_URL (default:
// payments_bench on the local PostgreSQL), migrated and emptied by the run.
// Every pool has -c connections: a worker waits for its answer before it
// sends again, so none needs more.
package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	sizes       = flag.String("sizes", "10000,1000000,10000000", "stored-record counts for the growth phase (empty: skip it)")
	baseline    = flag.String("baseline", "", "a second server binary to compare with in the same run (say, one built without an optimization)")
	dbLatency   = flag.Duration("db-latency", 0, "delay each way between every client and PostgreSQL, through toxiproxy (e.g. 500us)")
)

var queries = dbsqlc.New()

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dbURL := os.Getenv("BENCH_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/payments_bench?sslmode=disable"
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return fmt.Errorf("BENCH_DATABASE_URL must be a URL: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(*concurrency))
	u.RawQuery = q.Encode()
	admin, err := postgres.Open(ctx, u.String(), true) // straight to the database: not counted
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := postgres.Migrate(admin); err != nil {
		return err
	}
	for _, stmt := range []string{`CREATE EXTENSION IF NOT EXISTS pg_walinspect`,
		`TRUNCATE idempotency_keys, orders, charges, refunds, payouts, ledger_entries, ledger_checkpoints, events, processor_events CASCADE`} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	if err := auth.SeedDemoCallers(ctx, admin); err != nil {
		return err
	}
	fmt.Printf("bench: %d workers, %s per phase, database %s, %s each way to it\n",
		*concurrency, *duration, postgres.Redact(u.String()), *dbLatency)
	counted, direct, err := startProxies(u.Host, *dbLatency)
	if err != nil {
		return err
	}
	bin, err := serverBinary()
	if err != nil {
		return err
	}
	defer stopServers()

	// The clients: a pool for the SQL phases and the servers (this
	// checkout's and -baseline's, each also with its replay cache off, as a
	// replica that has not seen the key). connect starts them on the database
	// at host, after stopping any it started before: the counted phase
	// reaches the database through the counter, the timed ones without it
	// (a relay on these shared cores would charge every round trip twice).
	var pool *pgxpool.Pool
	var servers, uncached []child // servers[0] is this checkout's
	binaries := map[string]string{"service": bin, "baseline": *baseline}
	connect := func(host string) error {
		stopServers()
		u.Host = host
		if pool, err = postgres.Open(ctx, u.String(), true); err != nil {
			return err
		}
		stops = append(stops, pool.Close)
		servers, uncached = nil, nil
		for _, name := range []string{"service", "baseline"} {
			if binaries[name] == "" {
				continue
			}
			c, err := startServer(ctx, name, binaries[name], u.String())
			if err != nil {
				return err
			}
			noCache, err := startServer(ctx, name, binaries[name], u.String(), "IDEMPOTENCY_REPLAY_CACHE_SIZE=0")
			if err != nil {
				return err
			}
			servers, uncached = append(servers, c), append(uncached, noCache)
		}
		return nil
	}
	if err := connect(counted); err != nil {
		return err
	}

	// The phases. The floor is the service's statements for a keyed create
	// (idempotency.Store.ExecuteLocal: the order and the completed record
	// in one transaction, one round trip) and for a replay.
	body := []byte(`{"amount":1999,"currency":"usd","description":"Tea"}`)
	fingerprint := sha256.Sum256(body)
	insert := func(db postgres.Statements) error {
		return queries.CreateOrder(ctx, db, dbsqlc.CreateOrderParams{CallerID: "acme", ID: postgres.NewID(postgres.PrefixOrder), Amount: 1999, Currency: "usd", CreatedAt: time.Now()})
	}
	plain := phase{"plain order insert (SQL)", func(int64) error { return insert(pool) }}
	floorCreate := phase{"floor: keyed create (SQL)", func(i int64) error {
		return postgres.TransactPipelined(ctx, pool, func(tx *postgres.PipelinedTx) error {
			if err := insert(postgres.Later(tx)); err != nil {
				return err
			}
			status := int32(201)
			return queries.InsertCompletedIdempotencyKey(ctx, tx.ThenCommit(), dbsqlc.InsertCompletedIdempotencyKeyParams{
				CallerID: "acme", Key: "floor-" + strconv.FormatInt(i, 10), Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
				RequestFingerprint: fingerprint[:], ResponseStatus: &status,
				ResponseHeaders: []byte(`{"Content-Type":["application/json"]}`), ResponseBody: body,
			})
		})
	}}
	const replayKeys = 1000 // each replay phase picks one of them at random
	floorReplay := phase{"floor: replay (SQL)", func(int64) error {
		key := dbsqlc.FindIdempotencyKeyParams{CallerID: "acme", Key: "floor-" + strconv.Itoa(rand.IntN(replayKeys))}
		if row, err := queries.FindIdempotencyKey(ctx, pool, key); err != nil || row.IdempotencyKey.Status != "completed" {
			return cmp.Or(err, errors.New("the replay found no completed record"))
		}
		return nil
	}}
	create := func(c child) phase {
		return phase{c.name + ": keyed create (HTTP)", func(i int64) error {
			return c.post("/v1/orders", c.name+"-"+strconv.FormatInt(i, 10), body, 201)
		}}
	}
	replay := func(c child, what string) phase {
		return phase{c.name + ": " + what + " (HTTP)", func(int64) error {
			return c.post("/v1/orders", c.name+"-"+strconv.Itoa(rand.IntN(replayKeys)), body, 201)
		}}
	}
	// Charges take fresh orders; payouts draw on what the charges credited.
	orders := make([]string, 50_000)
	for i := range orders {
		orders[i] = postgres.NewID(postgres.PrefixOrder)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) SELECT 'acme', unnest($1::text[]), 1999, 'usd'`, orders); err != nil {
		return err
	}
	var charged atomic.Int64
	charge := phase{"service: charge (HTTP)", func(int64) error {
		i := charged.Add(1) - 1
		if i >= int64(len(orders)) {
			return errors.New("ran out of orders to charge: raise the count")
		}
		return servers[0].post("/v1/orders/"+orders[i]+"/charges", "charge-"+orders[i], []byte(`{"payment_method":"pm_card_visa"}`), 201)
	}}
	payout := phase{"service: payout accepted (HTTP)", func(i int64) error {
		return servers[0].post("/v1/payouts", "payout-"+strconv.FormatInt(i, 10), []byte(`{"amount":1,"currency":"usd"}`), 202)
	}}

	// 1. The database's work per request, first, so that no background
	// work (webhooks, deliveries) runs on into the windows. The creates'
	// keys, numbered from 0, are those the replays find.
	fmt.Printf("\ndatabase work per request (exact; %d requests each, one at a time):\n", replayKeys)
	each := []phase{plain, floorCreate}
	for _, c := range servers {
		each = append(each, create(c))
	}
	each = append(each, floorReplay, replay(servers[0], "cached replay"))
	for _, c := range uncached {
		each = append(each, replay(c, "replay from the database"))
	}
	var work []dbWork
	for _, p := range append(each, charge, payout) {
		w, err := countWork(ctx, admin, replayKeys, func(i int) error { return p.op(int64(i)) })
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		work = append(work, w)
		fmt.Printf("  %-42s %s\n", p.name, w)
	}
	fmt.Printf("  keyed create / plain insert: %.2f times the round trips, %.2f the tuples, %.2f the WAL records\n",
		work[2].trips/work[0].trips, work[2].tuples/work[0].tuples, work[2].records/work[0].records)

	// 2. Rates, and 3. ratios.
	if err := connect(direct); err != nil {
		return err
	}
	creates, replays := []phase{plain, floorCreate}, []phase{floorReplay}
	for i, c := range servers {
		creates = append(creates, create(c))
		replays = append(replays, replay(uncached[i], "replay from the database"), replay(c, "cached replay"))
		for k := range replayKeys { // the restart emptied its replay cache
			if err := c.post("/v1/orders", c.name+"-"+strconv.Itoa(k), body, 201); err != nil {
				return err
			}
		}
	}
	seq.Store(replayKeys)
	fmt.Printf("\nrequests/s (%d workers; compared phases take turns):\n", *concurrency)
	created, err := alternate(*concurrency, *duration, creates...)
	if err != nil {
		return err
	}
	replayed, err := alternate(*concurrency, *duration, replays...)
	if err != nil {
		return err
	}
	for _, p := range []phase{charge, payout} {
		if _, err := alternate(*concurrency, *duration, p); err != nil {
			return err
		}
	}
	fmt.Printf("\nratios of requests/s (one run, same machine, same concurrency):\n")
	fmt.Printf("  keyed create / plain insert           = %s\n", ratio(created[2], created[0]))
	fmt.Printf("  keyed create: service / floor         = %s\n", ratio(created[2], created[1]))
	fmt.Printf("  replay from the database / floor      = %s\n", ratio(replayed[1], replayed[0]))
	fmt.Printf("  cached replay / from the database     = %s\n", ratio(replayed[2], replayed[1]))
	if len(servers) > 1 {
		fmt.Printf("  keyed create: service / baseline      = %s\n", ratio(created[2], created[3]))
		fmt.Printf("  replay from the database: service / baseline = %s\n", ratio(replayed[1], replayed[3]))
		fmt.Printf("  cached replay: service / baseline     = %s\n", ratio(replayed[2], replayed[4]))
	}

	// 4. Growth with stored keys.
	fmt.Printf("\nthe claim and the replay with stored records (SQL):\n")
	claim := func(key string) (dbsqlc.ClaimIdempotencyKeyRow, error) {
		return queries.ClaimIdempotencyKey(ctx, pool, dbsqlc.ClaimIdempotencyKeyParams{CallerID: "acme", Key: key,
			Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders", RequestFingerprint: fingerprint[:], LeaseSeconds: 30})
	}
	stored := 0
	for s := range strings.SplitSeq(*sizes, ",") {
		if s == "" {
			continue
		}
		target, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		// Completed records, as the sweeper would find them after a day of traffic.
		if _, err := admin.Exec(ctx, `
			INSERT INTO idempotency_keys (caller_id, key, status, recovery_point, attempt, operation, request_method, request_path,
			    request_fingerprint, response_status, response_headers, response_body, completed_at)
			SELECT 'acme', 'filled-' || g, 'completed', 'finished', 1, 'createOrder', 'POST', '/v1/orders', $3, 201,
			    '{"Content-Type":["application/json"]}', '{"id":"ord_x","amount":1999,"currency":"usd","status":"pending"}', now()
			FROM generate_series($1::int, $2::int - 1) AS g`, stored, target, fingerprint[:]); err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
			return err
		}
		stored = target
		d := min(*duration, 5*time.Second)
		for _, p := range []phase{
			{fmt.Sprintf("claim, %d stored", target), func(i int64) error { _, err := claim("grow-" + strconv.FormatInt(i, 10)); return err }},
			{fmt.Sprintf("replay, %d stored", target), func(int64) error {
				if row, err := claim("filled-" + strconv.Itoa(rand.IntN(target))); err != nil || row.Claimed {
					return cmp.Or(err, errors.New("the replay claimed a key"))
				}
				return nil
			}},
		} {
			if _, err := alternate(*concurrency, d, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// serverBinary is the server built from this checkout.
func serverBinary() (string, error) {
	bin := filepath.Join(os.TempDir(), "payments-bench-server")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/server")
	cmd.Dir = "../.." // the service's module, not the bench's
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the server: %v\n%s", err, out)
	}
	return bin, nil
}

// child is a server the run started.
type child struct {
	name, base string
	client     *fasthttp.HostClient
}

// stops stops every server and pool the run started (stopServers).
var stops []func()

func stopServers() {
	for _, stop := range stops {
		stop()
	}
	stops = nil
}

// post sends body to path under key, and fails on a status not in want.
// fasthttp's client spends less CPU than net/http's, CPU taken from the
// server and the database on this machine's shared cores.
func (c child) post(path, key string, body []byte, want ...int) error {
	req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(res)
	req.SetRequestURI(c.base + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.SetContentType("application/json")
	req.Header.Set("Idempotency-Key", key)
	req.SetBody(body)
	if err := c.client.DoTimeout(req, res, 30*time.Second); err != nil {
		return err
	}
	if !slices.Contains(want, res.StatusCode()) {
		return fmt.Errorf("POST %s: %d %s", path, res.StatusCode(), res.Body())
	}
	return nil
}

// startServer runs bin on a free loopback port, with its in-process
// processor and no background workers, and waits until it is ready. Its
// log goes to a file, as a server's goes to a file or a collector in
// another process: reading it here would take CPU from the phases.
func startServer(ctx context.Context, name, bin, dbURL string, env ...string) (child, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return child{}, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OTEL_") }), // tracing off
		"DATABASE_URL="+dbURL, "HTTP_ADDR="+addr, "RECONCILER_ENABLED=false", "RELAY_ENABLED=false", "PAYOUT_WORKERS=0",
		"LOG_FORMAT=json", "SEED_DEMO_CALLERS=true", "RATE_LIMIT_PER_SECOND=0") // the service, not the callers' limits
	cmd.Env = append(cmd.Env, env...)
	log, err := os.CreateTemp("", "bench-server-*.log")
	if err != nil {
		return child{}, err
	}
	cmd.Stdout, cmd.Stderr = log, os.Stderr
	if err := cmd.Start(); err != nil {
		return child{}, err
	}
	stops = append(stops, func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		os.Remove(log.Name())
	})
	c := child{name: name, base: "http://" + addr, client: &fasthttp.HostClient{Addr: addr, MaxConns: *concurrency * 2}}
	for range 300 {
		if res, err := http.Get(c.base + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return c, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return child{}, fmt.Errorf("%s did not become ready", bin)
}
