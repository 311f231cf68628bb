package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests drive the store directly against a real PostgreSQL, to pin
// down interleavings (a stalled owner, a takeover) that HTTP cannot time.

func newStore(t *testing.T, lease time.Duration) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return NewStore(pool, StoreConfig{Lease: lease}, slog.New(slog.NewTextHandler(io.Discard, nil))), pool
}

func testRequest(t *testing.T, key string) Request {
	t.Helper()
	fp, err := fingerprintBody("POST", "/v1/orders", []byte(`{"amount":100,"currency":"usd"}`))
	if err != nil {
		t.Fatal(err)
	}
	return Request{CallerID: "acme", Key: key, Operation: "createOrder", Method: "POST", Path: "/v1/orders", Fingerprint: fp}
}

// expireLease simulates the passage of the lease on the database clock:
// the owner "crashed" long enough ago.
func expireLease(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE caller_id = 'acme' AND key = $1 AND status = 'in_progress'`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expire lease of %q: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

func countOrders(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// createOrderPhase is the order-creation phase, responding with the order id.
func createOrderPhase(ctx context.Context, tx pgx.Tx) (Result, error) {
	// The order's own insert, written out: package orders declares its
	// operation with this package, so these tests cannot import it.
	id := postgres.NewID("ord")
	if _, err := tx.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', $1, 100, 'usd')`, id); err != nil {
		return nil, err
	}
	return JSONResponse(http.StatusCreated, nil, map[string]string{"id": id})
}

// asAnswered is err as a client would get it: a claim that found a live
// owner is a 409 (serveExternal, with no time to wait, answers so).
func asAnswered(err error) error {
	var busy *busyError
	if errors.As(err, &busy) {
		return busy.problem()
	}
	return err
}

func wantInProgress(t *testing.T, err error) {
	t.Helper()
	var p *problem.Error
	if !errors.As(asAnswered(err), &p) || p.Code != problem.IdempotencyKeyInUse || p.RetryAfter <= 0 {
		t.Fatalf("got %v; want a 409 in-progress problem with Retry-After", err)
	}
}

func TestClaimIsAtomicUnderConcurrency(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, time.Minute)
	req := testRequest(t, "race")
	const n = 40
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		leases = make(chan *Lease, n)
		errs   = make(chan error, n)
	)
	for range n {
		wg.Go(func() {
			<-start
			l, replay, err := s.claim(context.Background(), req)
			switch {
			case err != nil:
				errs <- err
			case replay != nil:
				errs <- errors.New("replay of an operation that never completed")
			default:
				leases <- l
			}
		})
	}
	close(start)
	wg.Wait()
	close(leases)
	close(errs)
	if len(leases) != 1 {
		t.Fatalf("%d requests own the key; want exactly 1", len(leases))
	}
	for err := range errs {
		wantInProgress(t, err)
	}
	if l := <-leases; l.record.Attempt != 1 || l.RecoveryPoint() != RecoveryStarted {
		t.Errorf("owner has attempt %d at %q; want 1 at started", l.record.Attempt, l.RecoveryPoint())
	}
}

// Two copies of a local operation that both found the key free (each ran
// the key's check, and its effect, before either wrote its record) are
// still one execution: the key's unique index decides, not the check. The
// second insert waits for the first's commit and fails, its effect rolls
// back, and it is answered with the first's answer, replayed.
func TestUniqueIndexDecidesBetweenCopiesPastTheCheck(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	req := testRequest(t, "twins")
	var bothChecked, wg sync.WaitGroup
	bothChecked.Add(2)
	answers, errs := make([]*Response, 2), make([]error, 2)
	for i := range 2 {
		var once sync.Once
		wg.Go(func() {
			answers[i], errs[i] = s.serveLocal(context.Background(), req, func(ctx context.Context, tx pgx.Tx) (*Response, error) {
				res, err := createOrderPhase(ctx, tx) // sent with the key's check: the key was found free
				// Neither copy writes its record before both found the key free.
				once.Do(func() { bothChecked.Done(); bothChecked.Wait() })
				if err != nil {
					return nil, err
				}
				return res.(*Response), nil
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if answers[0].Replayed == answers[1].Replayed || !bytes.Equal(answers[0].Body, answers[1].Body) {
		t.Errorf("replayed %v and %v, bodies %s and %s; want one answer and its replay", answers[0].Replayed, answers[1].Replayed, answers[0].Body, answers[1].Body)
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

func TestTakeoverResumesFromRecoveryPoint(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "crashed")

	first, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The first owner passes one phase boundary, then "crashes".
	if err := first.Phase(ctx, func(context.Context, pgx.Tx) (Result, error) {
		return RecoveryPoint("charge_created"), nil
	}); err != nil {
		t.Fatal(err)
	}

	// While its lease is live, a retry is told to wait.
	_, _, err = s.claim(ctx, req)
	wantInProgress(t, err)

	expireLease(t, pool, "crashed")
	second, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.record.Attempt != 2 || second.RecoveryPoint() != "charge_created" {
		t.Fatalf("takeover at attempt %d, point %q; want attempt 2 at charge_created", second.record.Attempt, second.RecoveryPoint())
	}
	if err := second.Phase(ctx, createOrderPhase); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "acme", "crashed")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != StatusCompleted || rec.RecoveryPoint != "finished" || rec.LockedUntil != nil || rec.Attempt != 2 {
		t.Errorf("record after takeover: status %s, point %s, locked_until %v, attempt %d", rec.Status, rec.RecoveryPoint, rec.LockedUntil, rec.Attempt)
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

func TestOnlyOneTakeoverWins(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	req := testRequest(t, "contended")
	if _, _, err := s.claim(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	expireLease(t, pool, "contended")

	const n = 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	var mu sync.Mutex
	var owners []*Lease
	for range n {
		wg.Go(func() {
			<-start
			l, _, err := s.claim(context.Background(), req)
			if err != nil {
				wantInProgress(t, err)
				return
			}
			mu.Lock()
			owners = append(owners, l)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if len(owners) != 1 || owners[0].record.Attempt != 2 {
		t.Fatalf("%d takeovers; want exactly one, at attempt 2", len(owners))
	}
}

// TestStaleOwnerCannotOverwrite is the fencing guarantee: an owner that
// stalls mid-phase past its lease, while a newer attempt takes over, finds
// its late writes refused and its phase (effect included) rolled back; the
// newer attempt's result is the one that stands.
func TestStaleOwnerCannotOverwrite(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "fenced")

	stale, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	inPhase, resume := make(chan struct{}), make(chan struct{})
	var resumeOnce sync.Once
	unstall := func() { resumeOnce.Do(func() { close(resume) }) }
	t.Cleanup(unstall) // never leave the stalled phase holding a connection
	staleDone := make(chan error, 1)
	go func() {
		staleDone <- stale.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (Result, error) {
			res, err := createOrderPhase(ctx, tx) // the stale owner's effect, uncommitted
			close(inPhase)
			<-resume // ... and here it stalls, past its lease
			return res, err
		})
	}()
	<-inPhase

	expireLease(t, pool, "fenced")
	fresh, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The stale owner wakes up while the new owner is still mid-operation
	// (the record is in progress either way): only the attempt number tells
	// the two apart, and it must refuse the stale write.
	unstall()
	if err := <-staleDone; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("stale owner's phase returned %v; want ErrLeaseLost", err)
	}
	if err := stale.Phase(ctx, func(context.Context, pgx.Tx) (Result, error) { return RecoveryPoint("charge_created"), nil }); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("stale recovery point write returned %v; want ErrLeaseLost", err)
	}
	if err := fresh.Phase(ctx, createOrderPhase); err != nil {
		t.Fatal(err)
	}

	rec, err := s.Get(ctx, "acme", "fenced")
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ ID string }
	if err := json.Unmarshal(rec.ResponseBody, &body); err != nil {
		t.Fatal(err)
	}
	var onlyOrder string
	if err := pool.QueryRow(ctx, `SELECT id FROM orders`).Scan(&onlyOrder); err != nil {
		t.Fatalf("want exactly one order: %v", err)
	}
	if rec.Attempt != 2 || rec.RecoveryPoint != "finished" || body.ID != onlyOrder || fresh.response == nil {
		t.Errorf("record: attempt %d, point %s, response order %s; the only order is %s", rec.Attempt, rec.RecoveryPoint, body.ID, onlyOrder)
	}
}

func TestServeDetachesFromCancellation(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := s.serveExternal(ctx, testRequest(t, "detached"), claimOnly, func(ctx context.Context, l *Lease) error {
		cancel() // the client hangs up mid-operation
		return l.Phase(ctx, createOrderPhase)
	})
	if err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("Serve after the caller's cancellation: %v, %v; want the operation to finish", resp, err)
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// An owner whose lease ran out may not write, even if nobody has taken the
// record over yet: only a live lease moves a record forward. The next
// claim takes over and finishes the operation once.
func TestLapsedOwnerCannotWrite(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "lapsed")
	owner, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	expireLease(t, pool, "lapsed")
	if err := owner.Phase(ctx, createOrderPhase); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("phase after the lease ran out: %v; want ErrLeaseLost", err)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Fatalf("%d orders; the lapsed owner's effect should have rolled back", n)
	}
	next, _, err := s.claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Phase(ctx, createOrderPhase); err != nil {
		t.Fatal(err)
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// A phase that outlasts its lease cannot commit, even with nobody taking
// the record over: the fenced write compares the lease with
// clock_timestamp(), the time of the write, not with now(), which inside
// the phase's transaction is the time the transaction began.
func TestPhaseThatOutlastsItsLeaseCannotCommit(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	owner, _, err := s.claim(ctx, testRequest(t, "outlasted"))
	if err != nil {
		t.Fatal(err)
	}
	err = owner.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (Result, error) {
		res, err := createOrderPhase(ctx, tx) // the phase's transaction has begun
		// The lease runs out while the phase works: it ends now, after the
		// transaction began (moved here, instead of waiting it out).
		if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = clock_timestamp() WHERE caller_id = 'acme' AND key = 'outlasted'`); err != nil {
			return nil, err
		}
		return res, err
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a phase that outlasted its lease returned %v; want ErrLeaseLost", err)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Errorf("%d orders; the phase that outlasted its lease should have rolled back", n)
	}
}

// A panicking handler is a bug: its outcome is a stored 500, not a record
// left to panic again on every takeover.
func TestPanicIsAFinalInternalError(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	req := testRequest(t, "panics")
	resp, err := s.serveExternal(ctx, req, claimOnly, func(ctx context.Context, l *Lease) error {
		return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (Result, error) {
			if _, err := createOrderPhase(ctx, tx); err != nil {
				return nil, err
			}
			panic("bug")
		})
	})
	if err != nil || resp.Status != http.StatusInternalServerError {
		t.Fatalf("serveExternal with a panicking step: %v, %v; want a stored 500", resp, err)
	}
	again, err := s.serveExternal(ctx, req, claimOnly, func(context.Context, *Lease) error {
		t.Error("the handler ran again for a completed key")
		return nil
	})
	if err != nil || !again.Replayed || again.Status != http.StatusInternalServerError {
		t.Fatalf("retry: %v, %v; want the stored 500 replayed", again, err)
	}
	if n := countOrders(t, pool); n != 0 {
		t.Errorf("%d orders; the panicking phase should have rolled back", n)
	}
}

// claimOnly is a first phase that does nothing but claim the key, for the
// tests whose handler runs every phase from RecoveryStarted.
func claimOnly(context.Context, pgx.Tx, Record) (Result, error) { return RecoveryStarted, nil }

// claim claims req's key as serveExternal does, with claimOnly for a first
// phase, or answers from the record the key has (found).
func (s *Store) claim(ctx context.Context, req Request) (*Lease, *Response, error) {
	observed, span := startClaim(ctx, req)
	defer span.End()
	lease, resp, err := s.start(ctx, observed, req, claimOnly)
	if errors.Is(err, errKeyTaken) {
		lease, resp, err = s.found(observed, req)
	}
	return lease, resp, err
}

// In this test binary, a second order under an id already taken is a
// refusal, as a unique field of a fork's resource would be (its package
// declares it with postgres.Refuse).
func init() {
	postgres.Refuse("orders_pkey", problem.Define("order_id_taken", http.StatusConflict, "Order id taken"), "an order with this id exists")
}

// A local operation whose insert breaks a unique constraint declared a
// refusal answers with that problem, stored under the key and replayed,
// never a 500: the insert is sent with the key's record and COMMIT, so the
// violation surfaces from the batch, where the refusal still names it.
func TestLocalUniqueViolationIsAStoredRefusal(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx) (*Response, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) VALUES ('acme', 'ord_twice', 100, 'usd')`); err != nil {
			return nil, err
		}
		return JSONResponse(http.StatusCreated, nil, map[string]string{"id": "ord_twice"})
	}
	if _, err := s.serveLocal(ctx, testRequest(t, "first"), insert); err != nil {
		t.Fatal(err)
	}
	req := testRequest(t, "second")
	refused, err := s.serveLocal(ctx, req, insert)
	if err != nil {
		t.Fatal(err)
	}
	if refused.Status != http.StatusConflict || !bytes.Contains(refused.Body, []byte(`"order_id_taken"`)) {
		t.Fatalf("a duplicate id answered %d %s; want the declared 409", refused.Status, refused.Body)
	}
	replay, err := s.serveLocal(ctx, req, insert)
	if err != nil {
		t.Fatal(err)
	}
	if !replay.Replayed || replay.Status != refused.Status || !bytes.Equal(replay.Body, refused.Body) {
		t.Errorf("the retry answered %d %s (replayed %v); want the stored 409, replayed", replay.Status, replay.Body, replay.Replayed)
	}
	if n := countOrders(t, pool); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}
