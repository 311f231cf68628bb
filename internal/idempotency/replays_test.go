package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/problem"
)

// fakeClock is the replay cache's clock, moved on by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// cachingStore is a Store with the replay cache on, for a retention
// window of a day, on a clock the test moves.
func cachingStore(t *testing.T) (*Store, *fakeClock, func() int) {
	t.Helper()
	s, pool := newStore(t, time.Minute)
	s.CacheReplays(100, 24*time.Hour)
	clock := &fakeClock{now: time.Now()}
	s.replays.now = clock.Now
	return s, clock, func() int { return countOrders(t, pool) }
}

func createOrder(ctx context.Context, l *Lease) error { return l.Phase(ctx, createOrderPhase) }

// A replay from the cache is the stored answer byte for byte, marked as a
// replay, and needs no database: here the pool is closed before it.
func TestReplayCacheAnswersWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	s, _, _ := cachingStore(t)
	ctx := context.Background()
	req := testRequest(t, "cached")
	first, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	s.pool.Close()

	replay, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil {
		t.Fatalf("replay with the database gone: %v; want it from the cache", err)
	}
	if !replay.Replayed || replay.Status != first.Status || !bytes.Equal(replay.Body, first.Body) ||
		replay.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
		t.Fatalf("cached replay %d %v %s; want %d %v %s, replayed", replay.Status, replay.Header, replay.Body, first.Status, first.Header, first.Body)
	}
	// The same key for another request is still a 422, from the cache too.
	other := req
	other.Fingerprint = bytes.Clone(req.Fingerprint)
	other.Fingerprint[0] ^= 1
	_, err = s.serveExternal(ctx, other, claimOnly, createOrder)
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != problem.IdempotencyKeyReused {
		t.Fatalf("another request under a cached key: %v; want 422 reused", err)
	}
}

// Another caller's equal key is another record: the cache never answers
// one caller with another's response.
func TestReplayCacheKeepsCallersApart(t *testing.T) {
	t.Parallel()
	s, _, orders := cachingStore(t)
	ctx := context.Background()
	acme := testRequest(t, "shared-key")
	first, err := s.serveExternal(ctx, acme, claimOnly, createOrder)
	if err != nil {
		t.Fatal(err)
	}
	globex := acme
	globex.CallerID = "globex"
	other, err := s.serveExternal(ctx, globex, claimOnly, createOrder)
	if err != nil || other.Replayed || bytes.Equal(other.Body, first.Body) {
		t.Fatalf("globex under acme's key: %+v, %v; want its own new order", other, err)
	}
	if n := orders(); n != 2 {
		t.Fatalf("%d orders; want 2", n)
	}
}

// An answer is kept for at most nine tenths of what is left of its
// record's retention window, less a minute, counted on the database clock:
// here the record is 23h30m old, so the answer goes after 26 minutes, long
// before the sweeper may delete the record and free the key for a new
// operation. (An answer read from a young record is capped at
// maxReplayAge.)
func TestReplayCacheNeverOutlivesTheRecord(t *testing.T) {
	t.Parallel()
	s, clock, orders := cachingStore(t)
	ctx := context.Background()
	req := testRequest(t, "old")
	first, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil {
		t.Fatal(err)
	}

	// A young record: its answer, cached on completion, lives maxReplayAge.
	clock.Advance(maxReplayAge - time.Second)
	if _, ok := s.replays.get("acme", "old"); !ok {
		t.Fatal("the answer left the cache before maxReplayAge")
	}
	clock.Advance(2 * time.Second)
	if _, ok := s.replays.get("acme", "old"); ok {
		t.Fatal("the answer outlived maxReplayAge")
	}

	// The record is now 23h30m old on the database clock; the replay reads
	// it from the database and caches it for 0.9 × 30 minutes − 1 minute
	// (a few seconds less: the record ages between the UPDATE and the claim).
	if _, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '23 hours 30 minutes' WHERE key = 'old'`); err != nil {
		t.Fatal(err)
	}
	replay, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil || !replay.Replayed || !bytes.Equal(replay.Body, first.Body) {
		t.Fatalf("replay: %+v, %v", replay, err)
	}
	clock.Advance(26*time.Minute - 30*time.Second)
	if _, ok := s.replays.get("acme", "old"); !ok {
		t.Fatal("the answer left the cache early")
	}
	clock.Advance(31 * time.Second)
	if _, ok := s.replays.get("acme", "old"); ok {
		t.Fatal("the answer is still cached 26 minutes after a replay of a 23h30m-old record; the sweeper may delete it at 24h")
	}

	// The window passes and the sweeper deletes the record: the key is a
	// new operation, not the old answer.
	if _, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'old'`); err != nil {
		t.Fatal(err)
	}
	if n, err := queries.SweepIdempotencyKeys(ctx, s.pool, dbsqlc.SweepIdempotencyKeysParams{RetentionSeconds: (24 * time.Hour).Seconds(), Batch: 10}); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	again, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil || again.Replayed || bytes.Equal(again.Body, first.Body) {
		t.Fatalf("after the sweep: %+v, %v; want a new operation", again, err)
	}
	if n := orders(); n != 2 {
		t.Fatalf("%d orders; want 2", n)
	}

	// A record with a minute left of its window is not cached at all.
	if _, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '23 hours 59 minutes' WHERE key = 'old'`); err != nil {
		t.Fatal(err)
	}
	s.replays.entries.Purge()
	if _, err := s.serveExternal(ctx, req, claimOnly, createOrder); err != nil {
		t.Fatal(err)
	}
	if e, ok := s.replays.get("acme", "old"); ok {
		t.Fatalf("a record with a minute left is cached until %s (now %s)", e.expires, clock.Now())
	}
}

// Only completed records are cached: a 409 for a record in progress is
// asked of the database every time, and the answer stored once the owner
// completes is what every later request gets.
func TestReplayCacheHoldsOnlyCompletedRecords(t *testing.T) {
	t.Parallel()
	s, _, _ := cachingStore(t)
	ctx := context.Background()
	req := testRequest(t, "slow")
	entered, finish := make(chan struct{}), make(chan struct{})
	done := make(chan *Response)
	go func() {
		resp, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
			close(entered)
			<-finish
			return l.Phase(ctx, createOrderPhase)
		})
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-entered
	if _, err := s.serveExternal(ctx, req, claimOnly, createOrder); err == nil {
		t.Fatal("a second request while the first runs succeeded; want 409")
	} else {
		wantInProgress(t, err)
	}
	if _, ok := s.replays.get("acme", "slow"); ok {
		t.Fatal("a record in progress is in the replay cache")
	}
	close(finish)
	first := <-done
	replay, err := s.serveExternal(ctx, req, claimOnly, createOrder)
	if err != nil || !replay.Replayed || !bytes.Equal(replay.Body, first.Body) {
		t.Fatalf("replay after completion: %+v, %v; want %s", replay, err, first.Body)
	}
}

// An entry gives back exactly the answer it was given, whatever happens
// to that answer afterwards, and no replay of it can change another.
func TestCachedReplayIsTheAnswerItWasGiven(t *testing.T) {
	t.Parallel()
	req := Request{CallerID: "acme", Key: "k", Method: "POST", Path: "/v1/orders", Fingerprint: []byte{1, 2, 3}}
	header := http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/v1/orders/ord_1"},
		"Link":         {"</a>", "</b>"}, // two values: kept in order
		"Date":         nil,              // present with no value
	}
	resp := &Response{Status: http.StatusCreated, Header: header, Body: []byte(`{"id":"ord_1"}`)}
	e := newCachedReplay(req, resp, time.Now().Add(time.Hour))
	want := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/orders/ord_1"}, "Link": {"</a>", "</b>"}, "Date": nil}

	// The answer is changed after it was cached, as a buffer reused would be.
	resp.Body[2] = 'X'
	header["Location"][0] = "/elsewhere"
	req.Fingerprint[0] = 9

	a := e.response()
	if a.Status != http.StatusCreated || !a.Replayed || string(a.Body) != `{"id":"ord_1"}` || !reflect.DeepEqual(a.Header, want) {
		t.Fatalf("replay %d %v %s (replayed %v); want 201 %v {\"id\":\"ord_1\"}, replayed", a.Status, a.Header, a.Body, a.Replayed, want)
	}
	if !bytes.Equal(e.fingerprint, []byte{1, 2, 3}) || e.method != "POST" || e.path != "/v1/orders" {
		t.Fatalf("first request %x %s %s; want 010203 POST /v1/orders", e.fingerprint, e.method, e.path)
	}

	// One replay's writer appends to its headers and deletes one.
	a.Header["Location"] = append(a.Header["Location"], "/v1/orders/ord_2")
	a.Header["Link"] = append(a.Header["Link"], "</c>")
	delete(a.Header, "Content-Type")
	if b := e.response(); !reflect.DeepEqual(b.Header, want) {
		t.Fatalf("the next replay's headers %v; want %v", b.Header, want)
	}
}

// On the wire, a replay from the cache is the replay from the database:
// the same status, headers and body, through a real net/http server, for
// an answer whose headers hold what a handler could put there: two values
// of one header, and headers present with no value (null and [] as
// stored), which stop net/http sniffing a Content-Type and adding a Date.
func TestCachedReplayWritesWhatTheDatabaseReplayWrites(t *testing.T) {
	t.Parallel()
	stored, err := encodeHeaders(http.Header{"Content-Type": nil, "Date": {}, "Location": {"/v1/orders/ord_1"}, "Link": {"</a>", "</b>"}})
	if err != nil {
		t.Fatal(err)
	}
	status := int32(http.StatusCreated)
	fromDatabase, err := storedResponse(Record{ResponseStatus: &status, ResponseHeaders: stored, ResponseBody: []byte("<html>ord_1</html>")})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{CallerID: "acme", Key: "k", Method: "POST", Path: "/v1/orders", Fingerprint: []byte{1}}
	fromCache := newCachedReplay(req, fromDatabase, time.Now().Add(time.Hour)).response()

	wire := func(r *Response) (int, http.Header, string) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _ = r.Write(w) }))
		defer srv.Close()
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, res.Header, string(body)
	}
	dbStatus, dbHeader, dbBody := wire(fromDatabase)
	cacheStatus, cacheHeader, cacheBody := wire(fromCache)
	if _, sniffed := dbHeader["Content-Type"]; sniffed || dbHeader.Get("Date") != "" || dbHeader.Values("Link")[1] != "</b>" {
		t.Fatalf("the database's replay wrote %v; want no Content-Type, no Date, two Links", dbHeader)
	}
	if cacheStatus != dbStatus || cacheBody != dbBody || !reflect.DeepEqual(cacheHeader, dbHeader) {
		t.Fatalf("from the cache: %d %v %q; from the database: %d %v %q", cacheStatus, cacheHeader, cacheBody, dbStatus, dbHeader, dbBody)
	}
}
