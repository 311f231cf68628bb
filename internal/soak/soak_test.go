package soak

import (
	"bufio"
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

var (
	duration  = flag.Duration("soak.duration", 15*time.Second, "how long the clients send requests (make soak: 10m)")
	workers   = flag.Int("soak.clients", 8, "concurrent clients")
	killEvery = flag.Duration("soak.kill-every", 3*time.Second, "how often a random replica is killed (SIGKILL) and restarted")
	summary   = flag.String("soak.summary", "", "also write the summary to this file")
)

// TestSoak: see the package documentation.
func TestSoak(t *testing.T) {
	t.Parallel()
	// A PostgreSQL of the soak's own, so that it can restart it.
	dbURL, restartDatabase, dbFault := soakDatabase(t)
	db := testdb.Pool(t, dbURL)
	sv := startServers(t, dbURL, serversConfig{replicas: 3, chaos: true})
	s := newSoak(t, sv.urls)
	ctx, stop := context.WithTimeout(context.Background(), *duration)
	defer stop()

	// The faults: a replica killed every few seconds, and in the middle
	// the database restarted as if it had crashed. The two take turns
	// (faultTurn): a replica started while the database is down would find
	// nothing to connect to and exit, which is a fault of the test, not of
	// the service.
	var faults sync.WaitGroup
	var faultTurn sync.Mutex
	var kills, dbRestarts atomic.Int64
	faults.Go(func() {
		tick := time.NewTicker(*killEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				func() {
					faultTurn.Lock()
					defer faultTurn.Unlock() // also if start gives up (Goexit)
					r := sv.replicas[rand.IntN(len(sv.replicas))]
					r.kill()
					kills.Add(1)
					r.start(t)
				}()
			}
		}
	})
	faults.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(*duration / 2):
		}
		faultTurn.Lock()
		defer faultTurn.Unlock()
		if err := restartDatabase(); err != nil {
			t.Errorf("restart the database: %v", err)
			return
		}
		dbRestarts.Add(1)
	})

	s.runClients(ctx)
	faults.Wait()
	s.settle(db, sv)
	s.report(fmt.Sprintf("soak: %s, %d clients, 3 replicas, %s", *duration, *workers, chaosSummary),
		fmt.Sprintf("faults              %d replicas killed with SIGKILL, %d %s", kills.Load(), dbRestarts.Load(), dbFault))
	if len(s.ops) < 20 || kills.Load() == 0 || dbRestarts.Load() != 1 {
		t.Errorf("the soak did too little to show anything: %d keyed requests, %d kills, %d database restarts (want 1)",
			len(s.ops), kills.Load(), dbRestarts.Load())
	}
}

// chaosSummary describes the processor's chaos that startServers sets.
const chaosSummary = "processor chaos (10% errors, 5% withheld answers, 30% duplicate webhooks)"

// servers are the programs every soak runs: the processor as its own
// process, with chaos on, and three server replicas on one database.
type servers struct {
	bin          string // the built programs: server, processor, sweeper
	processorURL string
	urls         []string
	replicas     []*process
	logs         *syncBuffer
}

// serversConfig says how many replicas to run, whether the processor's
// chaos is on (chaosSummary), and what to add to each replica's
// environment.
type serversConfig struct {
	replicas int
	chaos    bool
	env      []string
}

// startServers builds and starts the processor and the replicas on dbURL.
func startServers(t *testing.T, dbURL string, cfg serversConfig) *servers {
	bin := build(t)
	sv := &servers{bin: bin, logs: &syncBuffer{}}
	procPort, ports := testdb.FreePort(t), make([]string, cfg.replicas)
	for i := range ports {
		ports[i] = testdb.FreePort(t)
	}
	sv.processorURL = "http://127.0.0.1:" + procPort
	webhookSecret := "whsec_" + cryptorand.Text()

	proc := &process{name: "processor", bin: filepath.Join(bin, "processor"), logs: sv.logs, env: []string{
		"PROCESSOR_ADDR=127.0.0.1:" + procPort, "WEBHOOK_SECRET=" + webhookSecret,
		// Webhooks go to the first replica, which comes back on its port.
		"WEBHOOK_URL=http://127.0.0.1:" + ports[0] + "/webhooks/processor",
		"PROCESSOR_TIMEOUT_HOLD=3s",
		// Payouts arrive after half a second (ba_test_slow: five).
		"PROCESSOR_PAYOUT_DELAY=500ms",
	}}
	if cfg.chaos {
		proc.env = append(proc.env, "CHAOS_ERROR_RATE=0.1", "CHAOS_TIMEOUT_RATE=0.05", "CHAOS_DUPLICATE_WEBHOOK_RATE=0.3")
	}
	proc.start(t)
	sv.replicas = make([]*process, len(ports))
	for i, p := range ports {
		sv.replicas[i] = &process{name: fmt.Sprintf("replica-%d", i), bin: filepath.Join(bin, "server"), logs: sv.logs, env: append([]string{
			"DATABASE_URL=" + dbURL, "HTTP_ADDR=127.0.0.1:" + p, "PROCESSOR_URL=" + sv.processorURL,
			"IDEMPOTENCY_LEASE=3s", "PROCESSOR_TIMEOUT=1s", "RECONCILER_INTERVAL=200ms", "RELAY_INTERVAL=500ms",
			"PAYOUT_RESCUE_AFTER=7s", "LOG_FORMAT=json",
			"PROCESSOR_WEBHOOK_SECRET=" + webhookSecret, "SEED_DEMO_CALLERS=true",
			// The callers' endpoint below is on loopback.
			"WEBHOOK_ALLOW_PRIVATE=true",
			// A load test: the callers' rate limits are off, so that the
			// soak measures the service, not the limit.
			"RATE_LIMIT_PER_SECOND=0",
		}, cfg.env...)}
		if i == len(ports)-1 {
			// The last replica replays only from the database, so that the
			// final check of every key reads what the database kept (a
			// replica's cached answer would hide a completion lost in the
			// restart), and the others' cached answers must equal it.
			sv.replicas[i].env = append(sv.replicas[i].env, "IDEMPOTENCY_REPLAY_CACHE_SIZE=0")
		}
		sv.replicas[i].start(t)
		sv.urls = append(sv.urls, "http://127.0.0.1:"+p)
	}
	// The callers' webhook endpoint, which acknowledges every delivery:
	// outside the demo nothing is pushed to a caller without one.
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(receiver.Close)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `UPDATE callers SET webhook_url = $1`, receiver.URL); err != nil {
		t.Fatal(err)
	}
	return sv
}

// runClients runs the clients until ctx ends.
func (s *soak) runClients(ctx context.Context) {
	var clients sync.WaitGroup
	for i := range *workers {
		clients.Go(func() { s.client(ctx, i) })
	}
	clients.Wait()
}

// settle ends the outage (chaos off), retries with their keys the
// operations still without a final answer, waits for the reconcilers,
// relays and payout jobs to finish what nobody asks for, and checks
// everything from the outside.
func (s *soak) settle(db *pgxpool.Pool, sv *servers) {
	t := s.t
	setChaos(t, sv.processorURL, fakeprocessor.Chaos{})
	settle, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.finishAll(settle)
	waitUntil(t, settle, "no record in progress", func() bool {
		var n int
		_ = db.QueryRow(settle, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'`).Scan(&n)
		return n == 0
	})
	waitUntil(t, settle, "every charge and refund final", func() bool {
		var n int
		_ = db.QueryRow(settle, `SELECT (SELECT count(*) FROM charges WHERE status = 'pending') + (SELECT count(*) FROM refunds WHERE status = 'pending')`).Scan(&n)
		return n == 0
	})
	waitUntil(t, settle, "every payout final", func() bool {
		var n int
		_ = db.QueryRow(settle, `SELECT count(*) FROM payouts WHERE status IN ('pending', 'in_transit')`).Scan(&n)
		return n == 0
	})
	waitUntil(t, settle, "every event delivered", func() bool {
		var n int
		_ = db.QueryRow(settle, `SELECT count(*) FROM events WHERE delivered_at IS NULL`).Scan(&n)
		return n == 0
	})

	s.checkReplays(settle)
	s.checkAcknowledged(settle, db)
	s.checkMoney(settle, db, sv.processorURL)
	s.checkLogs(sv.logs.String())
	s.checkHistory()
}

// checkHistory checks every answer of the run against the contract (see
// history_test.go), and fails the soak on a violation, naming the
// visualisation of each key that broke it.
func (s *soak) checkHistory() {
	s.mu.Lock()
	history := slices.Clone(s.history)
	s.mu.Unlock()
	res, err := checkHistory(history, s.historyDir)
	s.checked = res
	if err != nil {
		s.t.Errorf("history check: %v", err)
	}
	if len(res.illegal) > 0 || len(res.undecided) > 0 {
		s.violation("history: %d keys whose answers no order of the requests explains (%q), %d undecided (%q); visualisations: %s",
			len(res.illegal), res.illegal, len(res.undecided), res.undecided, strings.Join(res.files, " "))
	}
}

// op is one keyed request of a logical operation, and its final answer.
type op struct {
	key, method, path, body string
	status                  int    // the final answer's status (0: none yet)
	id                      string // the object it names, or the problem code
}

type soak struct {
	t    *testing.T
	urls []string
	// attemptTimeout is how long a client waits for one answer (but the
	// clients that hang up on purpose).
	attemptTimeout time.Duration

	mu  sync.Mutex
	ops map[string]*op
	// acks is every final answer a client received (a copy's too, and a
	// replay's), to be found again, with the same content, once settled.
	acks []ack
	// attempts is every HTTP attempt of a keyed request, when it was sent
	// and how it ended.
	attempts []attempt
	// history is every keyed request, the final replays included, for the
	// history check; historyDir is where a failed check writes its
	// visualisations (empty: a temporary directory, logged).
	history    []historyOp
	historyDir string
	checked    historyResult

	operations, requests, retries, conflicts, unavailable, hangups, violations atomic.Int64
	payoutsPaid, payoutsFailed                                                 int // once settled
	lost                                                                       int // acknowledged answers not found again, once settled
}

func newSoak(t *testing.T, urls []string) *soak {
	s := &soak{t: t, urls: urls, ops: map[string]*op{}, attemptTimeout: 10 * time.Second}
	if *summary != "" {
		// A failed history check's visualisations go next to the report.
		s.historyDir = filepath.Dir(*summary)
	}
	return s
}

// ack is a final answer a client received: the object it names, with what
// of it never changes, or the problem's code.
type ack struct {
	key    string
	status int
	id     string
	fact   string // "" for a problem
}

// attempt is one HTTP attempt of a keyed request: its status (0 when no
// answer came, and then whether the client gave up waiting) and, for a
// success, whether it was a replay.
type attempt struct {
	start, end time.Time
	status     int
	code       string // a 503's problem code: the database's or the processor's outage
	replayed   bool
	gaveUp     bool
	err        string // why no answer came
}

// violation records a broken guarantee.
func (s *soak) violation(format string, args ...any) {
	s.violations.Add(1)
	s.t.Errorf(format, args...)
}

func (s *soak) newClient(url string, timeout time.Duration, attempts int) *client.Client {
	c, err := client.New(url, "sk_test_acme", client.Policy{MaxAttempts: attempts, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second},
		&http.Client{Timeout: timeout, Transport: timed{s}})
	if err != nil {
		s.t.Fatal(err)
	}
	c.OnAttempt = func(a client.Attempt) {
		s.requests.Add(1)
		if a.Number > 1 {
			s.retries.Add(1)
		}
		switch a.Status {
		case http.StatusConflict:
			s.conflicts.Add(1)
		case http.StatusServiceUnavailable:
			s.unavailable.Add(1)
		}
	}
	return c
}

// timed records every attempt a soak client makes.
type timed struct{ s *soak }

func (tr timed) RoundTrip(req *http.Request) (*http.Response, error) {
	h := tr.s.record(req)
	a := attempt{start: time.Now()}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		// The whole answer is read here, for the history: an answer whose
		// body did not arrive is no answer (its outcome unknown), for the
		// history and for the client alike.
		var b []byte
		b, err = io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(b))
		if err != nil {
			res = nil
		} else if h != nil {
			tr.s.answered(h, res, b)
		}
		if res != nil && res.StatusCode == http.StatusServiceUnavailable {
			var p struct{ Code string }
			_ = json.Unmarshal(b, &p)
			a.code = p.Code
		}
	}
	if err != nil && h != nil {
		tr.s.answered(h, nil, nil)
	}
	a.end = time.Now()
	if err == nil {
		a.status, a.replayed = res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true"
	} else {
		// The client gave up when its timeout passed. Checking the
		// deadline, not only the context's error, matters: http.Client
		// cancels a timed out request through both its context and its
		// Cancel channel, and when the transport sees the channel first it
		// returns "net/http: request canceled" a moment before the context
		// says so. (Nor is the time since a.start the measure: the
		// client's clock started before this RoundTrip did.)
		deadline, ok := req.Context().Deadline()
		a.gaveUp = req.Context().Err() != nil || os.IsTimeout(err) || (ok && !a.end.Before(deadline))
		a.err = err.Error()
	}
	tr.s.mu.Lock()
	tr.s.attempts = append(tr.s.attempts, a)
	tr.s.mu.Unlock()
	return res, err
}

// client runs logical operations until ctx ends.
func (s *soak) client(ctx context.Context, n int) {
	for i := 0; ctx.Err() == nil; i++ {
		s.operations.Add(1)
		prefix := fmt.Sprintf("c%d-%d", n, i)
		amount := int64(500 + rand.IntN(5000))
		order := s.keyed(ctx, &op{key: prefix + "-order", method: "POST", path: "/v1/orders",
			body: fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, amount)})
		if order == nil || order.status != http.StatusCreated {
			continue
		}
		pms := []apiclient.CreateChargeRequestPaymentMethod{apiclient.PmCardVisa, apiclient.PmCardVisa, apiclient.PmCardFlaky,
			apiclient.PmCardRateLimited, apiclient.PmCardTimeout, apiclient.PmCardLostResponse, apiclient.PmCardChargeDeclined}
		charge := &op{key: prefix + "-charge", method: "POST", path: "/v1/orders/" + order.id + "/charges",
			body: fmt.Sprintf(`{"payment_method":%q}`, pms[rand.IntN(len(pms))])}
		if rand.IntN(5) == 0 {
			// A cancel races the charge, on another replica.
			var race sync.WaitGroup
			race.Go(func() { s.keyed(ctx, charge) })
			race.Go(func() { s.cancel(ctx, order.id) })
			race.Wait()
			continue
		}
		if s.keyed(ctx, charge); charge.status != http.StatusCreated {
			continue
		}
		if rand.IntN(2) == 0 {
			s.keyed(ctx, &op{key: prefix + "-refund", method: "POST", path: "/v1/charges/" + charge.id + "/refunds",
				body: fmt.Sprintf(`{"amount":%d}`, 1+rand.Int64N(amount))})
		}
		if rand.IntN(3) == 0 {
			// A payout of part of the balance, which the charges fill and the
			// refunds and other payouts draw on: sometimes more than is
			// there (a stored 409 insufficient_balance).
			destinations := []apiclient.CreatePayoutRequestDestination{apiclient.BaTestOk, apiclient.BaTestOk,
				apiclient.BaTestFlaky, apiclient.BaTestClosed, apiclient.BaTestSlow}
			s.keyed(ctx, &op{key: prefix + "-payout", method: "POST", path: "/v1/payouts",
				body: fmt.Sprintf(`{"amount":%d,"currency":"usd","destination":%q}`, 1+rand.Int64N(amount), destinations[rand.IntN(len(destinations))])})
		}
	}
}

// keyed runs one keyed request until its final answer (or ctx ends): the
// project's client, on a random replica, sometimes with a concurrent
// duplicate on another replica, sometimes after an attempt whose client
// hangs up at once. It records the op and returns it.
func (s *soak) keyed(ctx context.Context, o *op) *op {
	s.mu.Lock()
	s.ops[o.key] = o
	s.mu.Unlock()
	if rand.IntN(10) == 0 {
		// A client that gives up 20ms in; the request may go on.
		s.hangups.Add(1)
		if a := s.send(ctx, s.newClient(s.urls[rand.IntN(len(s.urls))], 20*time.Millisecond, 1), o); final(a) {
			s.acknowledge(o.key, a) // it was quick enough to hear it
		}
	}
	for ctx.Err() == nil && o.status == 0 {
		first := rand.IntN(len(s.urls))
		if rand.IntN(3) == 0 {
			// A duplicate, at the same moment, on another replica.
			dup := &op{key: o.key, method: o.method, path: o.path, body: o.body}
			var both sync.WaitGroup
			both.Go(func() {
				s.finalize(dup, s.send(ctx, s.newClient(s.urls[(first+1)%len(s.urls)], s.attemptTimeout, 8), dup))
			})
			s.finalize(o, s.send(ctx, s.newClient(s.urls[first], s.attemptTimeout, 8), o))
			both.Wait()
			if o.status != 0 && dup.status != 0 && (o.status != dup.status || o.id != dup.id) {
				s.violation("key %s: concurrent copies answered %d %s and %d %s", o.key, o.status, o.id, dup.status, dup.id)
			}
			continue
		}
		s.finalize(o, s.send(ctx, s.newClient(s.urls[first], s.attemptTimeout, 8), o))
	}
	return o
}

// answer is what a call came to: a status and the object id or problem
// code, and for a success what never changes of the object.
type answer struct {
	status int
	id     string
	fact   string
	err    error
}

// fact is what never changes of an object, as the API shows it and as
// checkAcknowledged reads it from the database.
func fact(kind, id string, amount int64, currency string, created time.Time) string {
	return fmt.Sprintf("%s %s %d %s %s", kind, id, amount, currency, created.UTC().Format(time.RFC3339Nano))
}

func (s *soak) send(ctx context.Context, c *client.Client, o *op) answer {
	opt := client.WithIdempotencyKey(o.key)
	var id, f string
	var err error
	ok := http.StatusCreated
	switch {
	case o.path == "/v1/payouts":
		var body apiclient.CreatePayoutRequest
		_ = json.Unmarshal([]byte(o.body), &body)
		var v apiclient.Payout
		v, _, err = c.Payout(ctx, body, opt)
		id, ok, f = v.Id, http.StatusAccepted, fact("payout", v.Id, v.Amount, string(v.Currency), v.CreatedAt)
	case o.path == "/v1/orders":
		var body apiclient.CreateOrderRequest
		_ = json.Unmarshal([]byte(o.body), &body)
		var v apiclient.Order
		v, _, err = c.CreateOrder(ctx, body, opt)
		id, f = v.Id, fact("order", v.Id, v.Amount, string(v.Currency), v.CreatedAt)
	case strings.HasSuffix(o.path, "/charges"):
		var body apiclient.CreateChargeRequest
		_ = json.Unmarshal([]byte(o.body), &body)
		var v apiclient.Charge
		v, _, err = c.Charge(ctx, strings.Split(o.path, "/")[3], body.PaymentMethod, opt)
		id, f = v.Id, fact("charge", v.Id, v.Amount, string(v.Currency), v.CreatedAt)
	default:
		var body apiclient.CreateRefundRequest
		_ = json.Unmarshal([]byte(o.body), &body)
		var v apiclient.Refund
		v, _, err = c.Refund(ctx, strings.Split(o.path, "/")[3], body.Amount, opt)
		id, f = v.Id, fact("refund", v.Id, v.Amount, "", v.CreatedAt)
	}
	var apiErr *client.Error
	switch {
	case err == nil:
		return answer{status: ok, id: id, fact: f}
	case errors.As(err, &apiErr):
		return answer{status: apiErr.Status, id: string(apiErr.Problem.Code)}
	}
	return answer{err: err}
}

// finalize records a final answer; a transient one is not final: the
// caller tries again with the key.
func (s *soak) finalize(o *op, a answer) {
	if !final(a) {
		return
	}
	s.acknowledge(o.key, a)
	o.status, o.id = a.status, a.id
}

// final says whether an answer is final: not a transient one (no answer,
// or one the project's client retries: 409 in progress, 429, 502, 503,
// 504). The history check (history_test.go) reads answers the same way.
func final(a answer) bool {
	return a.err == nil && !retried(a.status, a.id)
}

// acknowledge records a final answer a client received.
func (s *soak) acknowledge(key string, a answer) {
	if a.status >= 500 {
		s.violation("key %s: final %d %s", key, a.status, a.id)
	}
	s.mu.Lock()
	s.acks = append(s.acks, ack{key: key, status: a.status, id: a.id, fact: a.fact})
	s.mu.Unlock()
}

// cancel cancels the order (naturally idempotent, no key) until it gets
// an answer.
func (s *soak) cancel(ctx context.Context, orderID string) {
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "POST", s.urls[rand.IntN(len(s.urls))]+"/v1/orders/"+orderID+"/cancel", nil)
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		s.requests.Add(1)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK || res.StatusCode == http.StatusConflict {
				return
			}
		}
		time.Sleep(100 * time.Millisecond) // this client's own backoff
	}
}

// finishAll retries, with their keys, the operations left without a final
// answer when the clients stopped.
func (s *soak) finishAll(ctx context.Context) {
	s.mu.Lock()
	var open []*op
	for _, o := range s.ops {
		if o.status == 0 {
			open = append(open, o)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, o := range open {
		wg.Go(func() {
			for ctx.Err() == nil && o.status == 0 {
				s.finalize(o, s.send(ctx, s.newClient(s.urls[rand.IntN(len(s.urls))], s.attemptTimeout, 8), o))
			}
		})
	}
	wg.Wait()
	for _, o := range open {
		if o.status == 0 {
			s.violation("key %s: no final answer after settling", o.key)
		}
	}
}

// checkReplays asks every replica for every key once more: each answers
// the stored response, marked as a replay, byte for byte the same, and
// the same as what the client got.
func (s *soak) checkReplays(ctx context.Context) {
	for _, o := range s.ops {
		var first []byte
		for _, u := range s.urls {
			req, _ := http.NewRequestWithContext(ctx, o.method, u+o.path, strings.NewReader(o.body))
			req.Header.Set("Authorization", "Bearer sk_test_acme")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", o.key)
			h := s.record(req)
			h.check = true
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				s.answered(h, nil, nil)
				s.violation("replay of %s on %s: %v", o.key, u, err)
				continue
			}
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				s.answered(h, nil, nil)
				s.violation("replay of %s on %s: %v", o.key, u, err)
				continue
			}
			s.answered(h, res, b)
			got := append([]byte(fmt.Sprintf("%d ", res.StatusCode)), b...)
			switch {
			case res.Header.Get("Idempotent-Replayed") != "true":
				s.violation("key %s on %s: %d %s, not a replay", o.key, u, res.StatusCode, b)
			case first == nil:
				first = got
				if res.StatusCode != o.status || !bytes.Contains(b, []byte(`"`+o.id+`"`)) {
					s.violation("key %s: the client got %d %s, the stored answer is %s", o.key, o.status, o.id, got)
				}
			case !bytes.Equal(got, first):
				s.violation("key %s: replicas replay different answers:\n%s\n%s", o.key, first, got)
			}
		}
	}
}

// checkAcknowledged finds every final answer a client received in what
// the database kept: its key answers the same (checkReplays compared the
// replay with the first final answer; every other copy must name the same
// object or problem), and every object a success named exists, with the
// same amount, currency and creation time. An answer missing here is an
// acknowledged operation lost.
func (s *soak) checkAcknowledged(ctx context.Context, db *pgxpool.Pool) {
	stored := map[string]string{}
	rows, err := db.Query(ctx, `
		SELECT 'order', id, amount, currency, created_at FROM orders
		UNION ALL SELECT 'charge', id, amount, currency, created_at FROM charges
		UNION ALL SELECT 'refund', id, amount, '', created_at FROM refunds
		UNION ALL SELECT 'payout', id, amount, currency, created_at FROM payouts`)
	if err != nil {
		s.t.Fatal(err)
	}
	for rows.Next() {
		var kind, id, currency string
		var amount int64
		var created time.Time
		if err := rows.Scan(&kind, &id, &amount, &currency, &created); err != nil {
			s.t.Fatal(err)
		}
		stored[id] = fact(kind, id, amount, currency, created)
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	for _, a := range s.acks {
		o := s.ops[a.key]
		switch {
		case a.status != o.status || a.id != o.id:
			s.lost++
			s.violation("key %s: a client was answered %d %s, the key now answers %d %s", a.key, a.status, a.id, o.status, o.id)
		case a.fact != "" && stored[a.id] != a.fact:
			s.lost++
			s.violation("key %s: a client was answered with %q; the database has %q", a.key, a.fact, stored[a.id])
		}
	}
}

// checkMoney compares the processor's ledger with our records.
func (s *soak) checkMoney(ctx context.Context, db *pgxpool.Pool, processorURL string) {
	ledger, err := fakeprocessor.FetchLedger(ctx, processorURL)
	if err != nil {
		s.t.Fatal(err)
	}
	effects := map[string][]fakeprocessor.LedgerEntry{}
	var ledgerNet int64
	for _, e := range ledger {
		effects[e.IdempotencyKey] = append(effects[e.IdempotencyKey], e)
		switch {
		case e.Object == fakeprocessor.ObjectCharge && e.Status == fakeprocessor.StatusSucceeded:
			ledgerNet += e.Amount
		case e.Object == fakeprocessor.ObjectRefund:
			ledgerNet -= e.Amount
		case e.Object == fakeprocessor.ObjectPayout && e.Status == fakeprocessor.PayoutPaid:
			ledgerNet -= e.Amount
		}
	}
	// What "done" is called on each side, and which way the money went.
	final := map[string]struct {
		local, remote string
		sign          int64
	}{
		"charge": {"succeeded", fakeprocessor.StatusSucceeded, 1},
		"refund": {"succeeded", fakeprocessor.StatusSucceeded, -1},
		"payout": {"paid", fakeprocessor.PayoutPaid, -1},
	}
	known := map[string]bool{}
	rows, err := db.Query(ctx, `
		SELECT 'charge', downstream_key, status, amount FROM charges
		UNION ALL SELECT 'refund', downstream_key, status, amount FROM refunds
		UNION ALL SELECT 'payout', downstream_key, status, amount FROM payouts`)
	if err != nil {
		s.t.Fatal(err)
	}
	var localNet int64
	for rows.Next() {
		var kind, key, status string
		var amount int64
		if err := rows.Scan(&kind, &key, &status, &amount); err != nil {
			s.t.Fatal(err)
		}
		known[key] = true
		got := effects[key]
		if len(got) > 1 {
			s.violation("%s %s: %d processor effects under one key", kind, key, len(got))
		}
		f := final[kind]
		if kind == "payout" && len(got) == 1 && got[0].Status != status {
			s.violation("payout %s is %s here and %s at the processor", key, status, got[0].Status)
		}
		succeeded := slices.ContainsFunc(got, func(e fakeprocessor.LedgerEntry) bool { return e.Status == f.remote })
		switch {
		case status == f.local && !succeeded:
			s.violation("%s %s %s here, not at the processor (%+v)", kind, key, status, got)
		case status == "failed" && succeeded:
			s.violation("%s %s failed here but went through at the processor", kind, key)
		case status != f.local && status != "failed":
			s.violation("%s %s still %s after settling", kind, key, status)
		}
		if status == f.local {
			localNet += f.sign * amount
		}
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	for key := range effects {
		if !known[key] {
			s.violation("the processor has an effect under %s, which no record of ours names", key)
		}
	}
	if ledgerNet != localNet {
		s.violation("money: the processor moved %d net, our records say %d", ledgerNet, localNet)
	}
	var broken int
	if err := db.QueryRow(ctx, `
		SELECT count(*) FROM charges c
		WHERE c.amount_refunded <> coalesce((SELECT sum(amount) FROM refunds r WHERE r.caller_id = c.caller_id AND r.charge_id = c.id AND r.status <> 'failed'), 0)
		   OR c.amount_refunded > c.amount`).Scan(&broken); err != nil {
		s.t.Fatal(err)
	}
	if broken > 0 {
		s.violation("%d charges whose refunds do not add up or exceed the charge", broken)
	}
	if err := db.QueryRow(ctx, `
		SELECT count(*) FROM orders o
		WHERE (o.status = 'paid') <> EXISTS (SELECT 1 FROM charges c WHERE c.caller_id = o.caller_id AND c.order_id = o.id AND c.status = 'succeeded')
		   OR (SELECT count(*) FROM charges c WHERE c.caller_id = o.caller_id AND c.order_id = o.id AND c.status = 'succeeded') > 1`).Scan(&broken); err != nil {
		s.t.Fatal(err)
	}
	if broken > 0 {
		s.violation("%d orders whose status and charges disagree (paid without one succeeded charge, or charged twice)", broken)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'paid'), count(*) FILTER (WHERE status = 'failed') FROM payouts`).
		Scan(&s.payoutsPaid, &s.payoutsFailed); err != nil {
		s.t.Fatal(err)
	}
	// The balance is what the money says it is: the balance as read (its
	// checkpoint and the entries since) is the sum of all its entries, and
	// that is succeeded charges, less succeeded refunds and paid payouts,
	// with nothing held once all are final, and what the processor's
	// ledger moved.
	var available, pending, entries, want int64
	if err := db.QueryRow(ctx, `
		SELECT b.available, b.pending,
		       (SELECT coalesce(sum(amount) FILTER (WHERE to_account = 'available'), 0)
		               - coalesce(sum(amount) FILTER (WHERE from_account = 'available'), 0)
		        FROM ledger_entries WHERE caller_id = 'acme' AND currency = 'usd'),
		       (SELECT coalesce(sum(amount), 0) FROM charges WHERE status = 'succeeded')
		       - (SELECT coalesce(sum(amount), 0) FROM refunds WHERE status = 'succeeded')
		       - (SELECT coalesce(sum(amount), 0) FROM payouts WHERE status = 'paid')
		FROM ledger_balance('acme', 'usd') b`).Scan(&available, &pending, &entries, &want); err != nil {
		s.t.Fatal(err)
	}
	if available != want || available != entries || available != ledgerNet || pending != 0 {
		s.violation("balance: %d available and %d pending; its entries say %d available, the charges, refunds and payouts %d and 0, the processor %d",
			available, pending, entries, want, ledgerNet)
	}
	var dead int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'dead'`).Scan(&dead); err != nil {
		s.t.Fatal(err)
	}
	if dead > 0 {
		s.violation("%d operations set aside as dead", dead)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE state = 'discarded'`).Scan(&dead); err != nil {
		s.t.Fatal(err)
	}
	if dead > 0 {
		s.violation("%d payout jobs discarded", dead)
	}
}

func (s *soak) checkLogs(logs string) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "panic") || strings.Contains(line, `"status":500`) {
			s.violation("log: %s", line)
		}
	}
	for _, secret := range []string{"sk_test_acme", "whsec_"} {
		if strings.Contains(logs, secret) {
			s.violation("the logs contain %s", secret)
		}
	}
}

// report logs the summary (header, the load's figures, then lines) and
// writes it to -soak.summary.
func (s *soak) report(header string, lines ...string) {
	final := map[int]int{}
	for _, o := range s.ops {
		final[o.status]++
	}
	text := fmt.Sprintf(`%s
  logical operations  %d (%d keyed requests, final answers by status %v)
  HTTP attempts       %d (retries %d, 409s %d, 503s %d, clients that hung up %d)
  payouts             %d paid, %d failed (the destination closed), each one transfer at the processor
  acknowledged        %d final answers received, %d lost
`, header, s.operations.Load(), len(s.ops), final, s.requests.Load(), s.retries.Load(), s.conflicts.Load(),
		s.unavailable.Load(), s.hangups.Load(), s.payoutsPaid, s.payoutsFailed, len(s.acks), s.lost)
	for _, l := range append(s.checked.lines(), lines...) {
		text += "  " + l + "\n"
	}
	text += fmt.Sprintf("  violations          %d\n", s.violations.Load())
	s.t.Log("\n" + text)
	if *summary != "" {
		if err := os.WriteFile(*summary, []byte(text), 0o644); err != nil {
			s.t.Error(err)
		}
	}
}

// --- processes -------------------------------------------------------------

func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testdb.Build(dir, "cmd/server", "cmd/processor", "cmd/sweeper"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// process is one of the soak's programs, started again after a kill.
type process struct {
	name, bin string
	args, env []string
	logs      *syncBuffer
	// ready is what the program logs once it serves (default: the
	// servers' "listening").
	ready string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
}

// start runs the program and waits until it logs that it is ready.
func (p *process) start(t *testing.T) {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	ready := p.ready
	if ready == "" {
		ready = `"msg":"listening"`
	}
	listening := make(chan struct{})
	// What this start printed until it was ready, to say why if it never
	// is: the shared log mixes every process's lines, and is only read at
	// the end of a run that got that far.
	var early syncBuffer
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		isReady := false
		for sc.Scan() {
			p.logs.Write(append(sc.Bytes(), '\n'))
			if isReady {
				continue
			}
			early.Write(append(sc.Bytes(), '\n'))
			if strings.Contains(sc.Text(), ready) {
				isReady = true
				close(listening)
			}
		}
		waitErr := cmd.Wait() // after the last read from its output, as exec asks
		if !isReady {
			fmt.Fprintf(&early, "(%v)\n", waitErr)
		}
		close(exited)
	}()
	select {
	case <-listening:
	case <-exited:
		t.Fatalf("%s exited before it was ready; it printed:\n%s", p.name, early.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start listening within 30s; it printed:\n%s", p.name, early.String())
	}
}

func (p *process) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// running reports whether the process started last is still running.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func setChaos(t *testing.T, processorURL string, c fakeprocessor.Chaos) {
	t.Helper()
	b, _ := json.Marshal(c)
	req, _ := http.NewRequest(http.MethodPut, processorURL+"/admin/chaos", bytes.NewReader(b))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("set chaos: %s", res.Status)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("not reached while settling: %s", what)
		}
		time.Sleep(100 * time.Millisecond) // polling the system's state
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
