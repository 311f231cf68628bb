package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// burstIdenticalRequests fires 50 copies of one keyed request at once, at
// the servers in turn, three times with a new key each time, and checks the
// contract for each burst: exactly one execution (one new order, the one
// its stored response names), and every answer either that execution's
// 201, its byte-identical replay, or a 409 with Retry-After.
func burstIdenticalRequests(t *testing.T, prefix string, servers ...*testServer) {
	t.Helper()
	ts := servers[0]
	for round := range 3 {
		key := fmt.Sprintf("%s-%d", prefix, round)
		responses := fire(t, 50, ordersRequest(key, teaOrder), servers...)
		if total := ts.count(t, "orders"); total != round+1 {
			t.Fatalf("%d orders after %d bursts; want %d", total, round+1, round+1)
		}
		var stored int
		if err := ts.db.QueryRow(context.Background(),
			`SELECT count(*) FROM orders o JOIN idempotency_keys k ON k.caller_id = o.caller_id
			 WHERE k.key = $1 AND convert_from(k.response_body, 'UTF8')::jsonb->>'id' = o.id`, key).Scan(&stored); err != nil || stored != 1 {
			t.Fatalf("the stored response of %s names %d existing orders (%v); want 1", key, stored, err)
		}
		checkIdenticalRequests(t, responses)
	}
}

func checkIdenticalRequests(t *testing.T, responses []response) {
	t.Helper()
	var original []byte
	executed, replayed, conflicts := 0, 0, 0
	for _, r := range responses {
		switch {
		case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
			executed++
			original = r.Body
		case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
			replayed++
		case r.Status == http.StatusConflict:
			r.wantProblem(t, http.StatusConflict, "idempotency_key_in_use")
			if r.Header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %v %s", r.Status, r.Header, r.Body)
		}
	}
	if executed != 1 {
		t.Fatalf("%d responses came from an execution; want exactly 1", executed)
	}
	for _, r := range responses {
		if r.Status == http.StatusCreated && !bytes.Equal(r.Body, original) {
			t.Errorf("a 201 differs from the original:\n%s\n%s", r.Body, original)
		}
	}
	t.Logf("%d requests: 1 executed, %d replayed, %d told to retry", len(responses), replayed, conflicts)
}

// fire sends n copies of req at once (released together by a barrier) to
// the given servers in turn and returns every response.
func fire(t *testing.T, n int, req request, servers ...*testServer) []response {
	t.Helper()
	reqs := make([]request, n)
	for i := range reqs {
		reqs[i] = req
	}
	return fireEach(t, reqs, servers...)
}

// fireEach sends every request at once, to the servers in turn.
func fireEach(t *testing.T, reqs []request, servers ...*testServer) []response {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	responses := make([]response, len(reqs))
	errs := make([]error, len(reqs))
	for i, req := range reqs {
		ts := servers[i%len(servers)]
		wg.Go(func() {
			<-start
			responses[i], errs[i] = ts.send(t, context.Background(), req)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return responses
}

func TestFiftyIdenticalRequestsInFlight(t *testing.T) {
	t.Parallel()
	burstIdenticalRequests(t, "burst", newTestServer(t))
}

// TestClientDisconnectStillStoresResponse: the client hangs up while its
// request is inside the effect transaction. The server must still commit
// the order together with its stored response, so that the client's retry
// replays it instead of finding an order with no record of it.
func TestClientDisconnectStillStoresResponse(t *testing.T) {
	t.Parallel()
	serverSawCancel := make(chan struct{})
	var once sync.Once
	ts := newTestServer(t, func(o *serverOptions) {
		o.wrap = func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				go func() {
					<-r.Context().Done()
					once.Do(func() { close(serverSawCancel) })
				}()
				h.ServeHTTP(w, r)
			})
		}
	})
	release := ts.blockInserts(t, "orders")

	ctx, hangUp := context.WithCancel(context.Background())
	clientDone := make(chan error, 1)
	go func() {
		_, err := ts.send(t, ctx, ordersRequest("hang-up", teaOrder))
		clientDone <- err
	}()
	ts.waitForBlockedInserts(t, "orders", 1)
	hangUp()
	if err := <-clientDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v; want it canceled", err)
	}
	<-serverSawCancel // the server knows the client is gone...
	release()         // ... and only now can the order insert proceed.

	// The request finishes in the background; wait for its record.
	waitFor(t, 10*time.Second, "the hung-up request's record is written", func() bool {
		var n int
		_ = ts.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = 'hang-up'`).Scan(&n)
		return n == 1
	})
	if status := keyStatus(t, ts.db, "hang-up"); status != "completed" {
		t.Fatalf("record is %s after the client hung up; want completed", status)
	}
	retry := ts.createOrder(t, "hang-up", teaOrder)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s; want the replay of the order created while the client was gone", retry.Status, retry.Body)
	}
	var o struct{ ID string }
	retry.decode(t, &o)
	var n int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE id = $1`, o.ID).Scan(&n); err != nil || n != 1 || ts.count(t, "orders") != 1 {
		t.Fatalf("the replayed order %s is not the one order in the database (%v)", o.ID, err)
	}
}
