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
	"context"
	"crypto/sha256"
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
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
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
		`TRUNCATE idempotency_keys, orders, charges, refunds, payouts, ledger_entries, ledger_checkpoints, events, processor_events CASCADE`,
		`DELETE FROM callers WHERE id LIKE 'bench\_%'`} {
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
	// A processor that sends no webhooks, for the charge's own line: with
	// the in-process one, each charge's webhook lands in the same window.
	quiet, quietSecret, err := startQuietProcessor()
	if err != nil {
		return err
	}
	var pool *pgxpool.Pool
	var servers, uncached []child // servers[0] is this checkout's
	var unhooked child            // this checkout's, with the quiet processor
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
		unhooked, err = startServer(ctx, "service", bin, u.String(), "PROCESSOR_URL="+quiet, "PROCESSOR_WEBHOOK_SECRET="+quietSecret)
		return err
	}
	if err := connect(counted); err != nil {
		return err
	}

	// The phases. The floor is the service's statements for a keyed create
	// (idempotency.Store.Serve of a Local operation: the order and the completed record
	// in one transaction, two round trips) and for a replay.
	body := []byte(`{"amount":1999,"currency":"usd","description":"Tea"}`)
	fingerprint := sha256.Sum256(body)
	insert := func(db dbsqlc.DBTX) error {
		_, err := queries.CreateOrder(ctx, db, dbsqlc.CreateOrderParams{CallerID: "acme", ID: postgres.NewID("ord"), Amount: 1999, Currency: "usd"})
		return err
	}
	plain := phase{"plain order insert (SQL)", func(int64) error { return insert(pool) }}
	floorCreate := phase{"floor: keyed create (SQL)", func(i int64) error {
		return postgres.TransactPipelined(ctx, pool, func(tx *postgres.PipelinedTx) error {
			if err := insert(tx); err != nil {
				return err
			}
			status := int32(201)
			return queries.InsertCompletedIdempotencyKey(ctx, tx, dbsqlc.InsertCompletedIdempotencyKeyParams{
				CallerID: "acme", Key: "floor-" + strconv.FormatInt(i, 10), Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders",
				RequestFingerprint: fingerprint[:], ResponseStatus: &status,
				ResponseHeaders: []byte(`{"Content-Type":["application/json"]}`), ResponseBody: body,
			})
		})
	}}
	const replayKeys = 1000 // each replay phase picks one of them at random
	// A replay's floor is the service's own engine (idempotency.Store,
	// which has no replay cache) in this process, no HTTP: the statements of
	// a replay from the database, on the keys the service created.
	doc, _ := idempotency.DecodeJSON(body)
	createFingerprint, err := idempotency.Fingerprint("POST", "/v1/orders", doc)
	if err != nil {
		return err
	}
	engine := engineOn(func() *pgxpool.Pool { return pool })
	floorReplay := phase{"floor: replay from the database (SQL)", func(int64) error {
		resp, err := engine().Serve(ctx, orders.CreateOperation, idempotency.Request{CallerID: "acme", Key: "service-" + strconv.Itoa(rand.IntN(replayKeys)),
			Operation: "createOrder", Method: "POST", Path: "/v1/orders", Fingerprint: createFingerprint}, nil, body)
		if err == nil && resp.Status != http.StatusCreated {
			err = fmt.Errorf("floor replay: %d %s", resp.Status, resp.Body)
		}
		return err
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
	// Charges take fresh orders, of one caller (acme) or of sixteen
	// (bench_00 to bench_15, one picked per request in turn); payouts draw
	// on what the charges credited.
	sixteen, err := benchCallers(ctx, admin, 16)
	if err != nil {
		return err
	}
	one := []*caller{{id: "acme", apiKey: "sk_test_acme"}}
	for _, callers := range [][]*caller{sixteen, one} {
		if err := addOrders(ctx, admin, callers, 100_000); err != nil {
			return err
		}
	}
	chargeBody, payoutBody := []byte(`{"payment_method":"pm_card_visa"}`), []byte(`{"amount":1,"currency":"usd"}`)
	charge := func(name string, callers []*caller, srv func() child) phase {
		return phase{name, func(i int64) error {
			c := callers[i%int64(len(callers))]
			order, err := c.nextOrder()
			if err != nil {
				return err
			}
			return srv().postAs(c.apiKey, "/v1/orders/"+order+"/charges", "charge-"+order, chargeBody, 201)
		}}
	}
	payout := func(name string, callers []*caller) phase {
		return phase{name, func(i int64) error {
			c := callers[i%int64(len(callers))]
			return unhooked.postAs(c.apiKey, "/v1/payouts", "payout-"+strconv.FormatInt(i, 10), payoutBody, 202)
		}}
	}
	chargeOne := charge("service: charge, one caller (HTTP)", one, func() child { return unhooked })
	chargeSixteen := charge("service: charge, 16 callers (HTTP)", sixteen, func() child { return unhooked })
	chargeHooked := charge("service: charge and its webhook (HTTP)", one, func() child { return servers[0] })
	payoutOne, payoutSixteen := payout("service: payout accepted, one caller (HTTP)", one), payout("service: payout accepted, 16 callers (HTTP)", sixteen)
	floorCharge, err := chargeFloor(ctx, "floor: charge, one caller (SQL)", func() *pgxpool.Pool { return pool }, one)
	if err != nil {
		return err
	}
	floorSixteen, err := chargeFloor(ctx, "floor: charge, 16 callers (SQL)", func() *pgxpool.Pool { return pool }, sixteen)
	if err != nil {
		return err
	}

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
	for _, p := range append(each, floorCharge, chargeOne, chargeHooked, payoutOne) {
		w, err := countWork(ctx, admin, replayKeys, func(i int) error { return p.op(int64(i)) })
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		work = append(work, w)
		fmt.Printf("  %-42s %s\n", p.name, w)
	}
	hooked, own := work[len(work)-2], work[len(work)-3]
	fmt.Printf("  %-42s %s\n", "  of which the processor's webhook", dbWork{trips: hooked.trips - own.trips, commits: hooked.commits - own.commits,
		tuples: hooked.tuples - own.tuples, records: hooked.records - own.records, bytes: hooked.bytes - own.bytes})
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
	// Done with: their pools' connections, with -baseline's servers too,
	// would leave the charges' pools short of PostgreSQL's default 100.
	for _, c := range append(servers, uncached...) {
		c.stop()
	}
	charged, err := alternate(*concurrency, *duration, floorCharge, chargeOne, chargeSixteen, floorSixteen)
	if err != nil {
		return err
	}
	paid, err := alternate(*concurrency, *duration, payoutOne, payoutSixteen)
	if err != nil {
		return err
	}
	fmt.Printf("\nratios of requests/s (one run, same machine, same concurrency):\n")
	fmt.Printf("  keyed create / plain insert           = %s\n", ratio(created[2], created[0]))
	fmt.Printf("  keyed create: service / floor         = %s\n", ratio(created[2], created[1]))
	fmt.Printf("  replay from the database / floor      = %s\n", ratio(replayed[1], replayed[0]))
	fmt.Printf("  cached replay / from the database     = %s\n", ratio(replayed[2], replayed[1]))
	fmt.Printf("  charge: service / floor               = %s\n", ratio(charged[1], charged[0]))
	fmt.Printf("  charge: one caller / 16 callers       = %s\n", ratio(charged[1], charged[2]))
	fmt.Printf("  charge floor: one caller / 16 callers = %s\n", ratio(charged[0], charged[3]))
	fmt.Printf("  charge (one caller) / keyed create    = %s\n", ratio(charged[1], created[2]))
	fmt.Printf("  payout accepted: one caller / 16      = %s\n", ratio(paid[0], paid[1]))
	if len(servers) > 1 {
		fmt.Printf("  keyed create: service / baseline      = %s\n", ratio(created[2], created[3]))
		fmt.Printf("  replay from the database: service / baseline = %s\n", ratio(replayed[1], replayed[3]))
		fmt.Printf("  cached replay: service / baseline     = %s\n", ratio(replayed[2], replayed[4]))
	}

	// 4. Growth with stored keys.
	fmt.Printf("\nthe claim and the replay with stored records (SQL):\n")
	claim := func(key string) error { // a new key's record, as an external operation's first phase inserts it
		_, err := queries.InsertIdempotencyKey(ctx, pool, dbsqlc.InsertIdempotencyKeyParams{CallerID: "acme", Key: key,
			Operation: "createOrder", RequestMethod: "POST", RequestPath: "/v1/orders", RequestFingerprint: fingerprint[:], LeaseSeconds: 30})
		return err
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
			{fmt.Sprintf("claim, %d stored", target), func(i int64) error { return claim("grow-" + strconv.FormatInt(i, 10)) }},
			{fmt.Sprintf("replay, %d stored", target), func(int64) error {
				_, err := queries.FindIdempotencyKey(ctx, pool, dbsqlc.FindIdempotencyKeyParams{CallerID: "acme", Key: "filled-" + strconv.Itoa(rand.IntN(target))})
				return err
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
	stop       func()
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
	return c.postAs("sk_test_acme", path, key, body, want...)
}

// postAs is post with another caller's API key.
func (c child) postAs(apiKey, path, key string, body []byte, want ...int) error {
	req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(res)
	req.SetRequestURI(c.base + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set("Authorization", "Bearer "+apiKey)
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
	stop := sync.OnceFunc(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		os.Remove(log.Name())
	})
	stops = append(stops, stop)
	c := child{name: name, base: "http://" + addr, client: &fasthttp.HostClient{Addr: addr, MaxConns: *concurrency * 2}, stop: stop}
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
