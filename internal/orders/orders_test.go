package orders_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests pin down the order rules against a real PostgreSQL: what is
// created, who can see it, how lists page, and when an order can be
// canceled. Orders that need a charge get a real one, through the charge
// operation and the fake processor over HTTP.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func create(t *testing.T, db dbsqlc.DBTX, callerID string, amount int64) orders.Order {
	t.Helper()
	o, err := orders.Create(context.Background(), db, callerID, orders.NewOrder{Amount: amount, Currency: "usd"})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func get(t *testing.T, pool *pgxpool.Pool, id string) orders.Order {
	t.Helper()
	o, err := orders.Get(context.Background(), pool, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func wantProblem(t *testing.T, err error, code problem.Code) *problem.Error {
	t.Helper()
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != code {
		t.Fatalf("got %v; want the problem %s", err, code)
	}
	return p
}

func sameOrder(a, b orders.Order) bool {
	return a.CallerID == b.CallerID && a.ID == b.ID && a.Amount == b.Amount && a.Currency == b.Currency &&
		((a.Description == nil) == (b.Description == nil)) && (a.Description == nil || *a.Description == *b.Description) &&
		a.Status == b.Status && a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt)
}

// payments charges orders through the real charge operation.
type payments struct {
	pool    *pgxpool.Pool
	store   *idempotency.Store
	charges *charges.Service
	procURL string
	claimed *sync.Map // key → what to call once it is claimed
}

// newPayments wires the charge operation to a fake processor on which
// pm_card_flaky never succeeds, so a charge with it stays pending.
func newPayments(t *testing.T, pool *pgxpool.Pool) *payments {
	t.Helper()
	proc, err := fakeprocessor.New(fakeprocessor.Config{FlakyFailures: 100, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proc)
	t.Cleanup(func() { proc.Close(); srv.Close() })
	claimed := new(sync.Map)
	return &payments{
		pool:    pool,
		claimed: claimed,
		store:   idempotency.NewStore(pool, idempotency.StoreConfig{Lease: time.Minute, Faults: afterClaim{claimed}}, quiet),
		charges: charges.NewService(pool, cardprocessor.NewClient(srv.URL, 5*time.Second)),
		procURL: srv.URL,
	}
}

// charge runs a keyed charge of acme's order and returns the response (nil
// with a retryable error when the charge was left pending).
func (p *payments) charge(t *testing.T, key, orderID, paymentMethod string) (*idempotency.Response, error) {
	t.Helper()
	return p.chargeAfterClaim(t, key, orderID, paymentMethod, func() {})
}

// chargeAfterClaim is charge, calling claimed once the key is claimed, just
// before the charge's first phase starts.
func (p *payments) chargeAfterClaim(t *testing.T, key, orderID, paymentMethod string, claimed func()) (*idempotency.Response, error) {
	t.Helper()
	path := "/v1/orders/" + orderID + "/charges"
	body := []byte(`{"payment_method":"` + paymentMethod + `"}`)
	doc, _ := idempotency.DecodeJSON(body)
	fp, err := idempotency.Fingerprint("POST", path, doc)
	if err != nil {
		return nil, err // not t.Fatal: this may run on another goroutine
	}
	p.claimed.Store(key, claimed)
	req := idempotency.Request{CallerID: "acme", Key: key, Operation: charges.OperationCharge, Method: "POST", Path: path, Fingerprint: fp}
	return p.store.Serve(context.Background(), p.charges.ChargeOperation(), req, map[string]string{"order_id": orderID}, body)
}

// afterClaim is the store's Faults for chargeAfterClaim: it calls the
// function stored under a record's key once the key is claimed.
type afterClaim struct{ *sync.Map }

func (a afterClaim) AfterClaim(rec idempotency.Record) {
	if f, ok := a.Load(rec.Key); ok {
		f.(func())()
	}
}
func (afterClaim) AfterPhase(idempotency.Record)        {}
func (afterClaim) BeforeFinalCommit(idempotency.Record) {}
func (afterClaim) Unfenced() bool                       { return false }

// An order is created pending, with what was asked for and an ord_ id,
// and Get returns it as it was stored.
func TestCreateMakesAPendingOrder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	desc := "two tickets"
	o, err := orders.Create(ctx, pool, "acme", orders.NewOrder{Amount: 1299, Currency: "eur", Description: &desc})
	if err != nil {
		t.Fatal(err)
	}
	if o.CallerID != "acme" || !strings.HasPrefix(o.ID, "ord_") || o.Amount != 1299 || o.Currency != "eur" ||
		o.Description == nil || *o.Description != desc || o.Status != orders.StatusPending || o.CreatedAt.IsZero() {
		t.Errorf("created %+v; want a pending ord_ order of acme for 1299 eur, described", o)
	}
	if got := get(t, pool, o.ID); !sameOrder(got, o) {
		t.Errorf("Get returned %+v; want %+v", got, o)
	}
	plain := create(t, pool, "acme", 1)
	if plain.Description != nil || plain.ID == o.ID {
		t.Errorf("second order %+v; want no description and a new id", plain)
	}

	// The schema is the backstop behind the contract's validation.
	for _, bad := range []orders.NewOrder{{Amount: 0, Currency: "usd"}, {Amount: 1, Currency: "USD"}} {
		if _, err := orders.Create(ctx, pool, "acme", bad); err == nil {
			t.Errorf("created an order of %d %q; want the database to refuse it", bad.Amount, bad.Currency)
		}
	}
	if _, err := orders.Create(ctx, pool, "initech", orders.NewOrder{Amount: 1, Currency: "usd"}); err == nil {
		t.Error("created an order for a caller that does not exist")
	}
}

// Orders are isolated by caller: to globex, acme's order does not exist
// (the same not_found as an id nobody has), it is not in globex's list,
// and globex cannot cancel it.
func TestOrdersAreIsolatedByCaller(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	o := create(t, pool, "acme", 500)
	own := create(t, pool, "globex", 700)

	foreign := wantProblem(t, func() error { _, err := orders.Get(ctx, pool, "globex", o.ID); return err }(), problem.NotFound)
	missing := wantProblem(t, func() error { _, err := orders.Get(ctx, pool, "globex", "ord_missing"); return err }(), problem.NotFound)
	if foreign.Status() != http.StatusNotFound || foreign.Status() != missing.Status() {
		t.Errorf("another caller's order answers %d, a missing one %d; want the same 404", foreign.Status(), missing.Status())
	}
	list, _, err := orders.List(ctx, pool, "globex", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != own.ID {
		t.Errorf("globex lists %d orders; want only its own", len(list))
	}
	_, err = orders.Cancel(ctx, pool, "globex", o.ID, charges.HasLiveCharge)
	wantProblem(t, err, problem.NotFound)
	if got := get(t, pool, o.ID); got.Status != orders.StatusPending {
		t.Errorf("acme's order is %s after globex tried to cancel it; want pending", got.Status)
	}
}

// List pages through a caller's orders newest first: every order exactly
// once, whatever the page size, has_more on every page but the last, and
// orders created in the same instant (one transaction) ordered by id, so
// the keyset cursor neither skips nor repeats them.
func TestListPagesNewestFirst(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()

	var want []string // newest first
	for range 3 {
		want = slices.Insert(want, 0, create(t, pool, "acme", 100).ID)
	}
	// Three at one instant: the id breaks the tie.
	var sameInstant []string
	for range 3 {
		sameInstant = append(sameInstant, create(t, pool, "acme", 200).ID)
	}
	if _, err := pool.Exec(ctx, `UPDATE orders SET created_at = (SELECT max(created_at) FROM orders WHERE id = ANY($1)) WHERE id = ANY($1)`, sameInstant); err != nil {
		t.Fatal(err)
	}
	slices.Sort(sameInstant)
	slices.Reverse(sameInstant)
	want = slices.Concat(sameInstant, want)
	want = slices.Insert(want, 0, create(t, pool, "acme", 300).ID)
	create(t, pool, "globex", 400) // not acme's

	for _, limit := range []int{1, 2, 3, 6, 7, 8, 100} {
		var got []string
		after := ""
		for page := 0; ; page++ {
			rows, more, err := orders.List(ctx, pool, "acme", limit, after)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) > limit || (more && len(rows) != limit) {
				t.Fatalf("limit %d, page %d: %d rows, has_more %v", limit, page, len(rows), more)
			}
			for _, o := range rows {
				got = append(got, o.ID)
			}
			if !more {
				break
			}
			if page > len(want) {
				t.Fatalf("limit %d: still has_more after %d pages", limit, page)
			}
			after = rows[len(rows)-1].ID
		}
		if !slices.Equal(got, want) {
			t.Errorf("limit %d: listed %v; want %v", limit, got, want)
		}
	}
}

// A cursor must name one of the caller's orders: an unknown id, or another
// caller's, is an invalid request naming starting_after, not an empty
// page and not a peek into another tenant's list.
func TestListRefusesACursorThatIsNotTheCallers(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	create(t, pool, "acme", 100)
	foreign := create(t, pool, "globex", 100)
	for _, cursor := range []string{"ord_missing", foreign.ID} {
		rows, more, err := orders.List(ctx, pool, "acme", 10, cursor)
		p := wantProblem(t, err, problem.InvalidRequest)
		if len(p.Errors) != 1 || p.Errors[0].Field != "starting_after" || rows != nil || more {
			t.Errorf("cursor %s: %+v, %d rows; want one error naming starting_after, no rows", cursor, p.Errors, len(rows))
		}
	}
}

// Cancel is naturally idempotent: the first cancels a pending order, the
// second returns it exactly as it is (same status, same updated_at), and
// the order stays canceled.
func TestCancelTwiceLeavesTheSameState(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	o := create(t, pool, "acme", 100)

	first, err := orders.Cancel(ctx, pool, "acme", o.ID, charges.HasLiveCharge)
	if err != nil || first.Status != orders.StatusCanceled || first.ID != o.ID || first.UpdatedAt.Before(o.UpdatedAt) {
		t.Fatalf("cancel: %+v, %v; want the order canceled", first, err)
	}
	second, err := orders.Cancel(ctx, pool, "acme", o.ID, charges.HasLiveCharge)
	if err != nil || !sameOrder(second, first) {
		t.Errorf("second cancel: %+v, %v; want %+v unchanged", second, err, first)
	}
	if got := get(t, pool, o.ID); !sameOrder(got, first) {
		t.Errorf("stored order %+v; want %+v", got, first)
	}
	_, err = orders.Cancel(ctx, pool, "acme", "ord_missing", charges.HasLiveCharge)
	wantProblem(t, err, problem.NotFound)
}

// Only an order without a live charge can be canceled: a paid order and
// one whose charge is still pending are refused (409 order_not_cancelable)
// and left as they are; a declined charge does not hold the order.
func TestCancelIsRefusedWhileAChargeIsLive(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	pay := newPayments(t, pool)

	paid := create(t, pool, "acme", 100)
	if resp, err := pay.charge(t, "paid", paid.ID, fakeprocessor.PaymentMethodVisa); err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("charge: %v, %v", resp, err)
	}
	pending := create(t, pool, "acme", 100)
	if _, err := pay.charge(t, "pending", pending.ID, fakeprocessor.PaymentMethodFlaky); !idempotency.IsRetryable(err) {
		t.Fatalf("charge: %v; want it left pending", err)
	}
	declined := create(t, pool, "acme", 100)
	if resp, err := pay.charge(t, "declined", declined.ID, fakeprocessor.PaymentMethodChargeDeclined); err != nil || resp.Status != http.StatusPaymentRequired {
		t.Fatalf("charge: %v, %v; want a decline", resp, err)
	}

	for _, c := range []struct {
		order orders.Order
		state orders.Status
	}{{paid, orders.StatusPaid}, {pending, orders.StatusPending}} {
		_, err := orders.Cancel(ctx, pool, "acme", c.order.ID, charges.HasLiveCharge)
		if p := wantProblem(t, err, orders.NotCancelable); p.Status() != http.StatusConflict {
			t.Errorf("status %d; want 409", p.Status())
		}
		if got := get(t, pool, c.order.ID); got.Status != c.state {
			t.Errorf("order is %s after a refused cancel; want %s", got.Status, c.state)
		}
	}
	if o, err := orders.Cancel(ctx, pool, "acme", declined.ID, charges.HasLiveCharge); err != nil || o.Status != orders.StatusCanceled {
		t.Errorf("cancel after a decline: %+v, %v; want canceled", o, err)
	}
}

// A cancel and a charge of the same order racing: the order's row lock
// orders them, so exactly one wins. Either the order is canceled and was
// never charged (no charge row, nothing at the processor), or it is paid
// and the cancel was refused; never a canceled order with a live charge.
// The cancel starts once the charge has claimed its key, so both reach the
// order's lock at about the same time.
func TestCancelAndChargeRaceOneWins(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	pay := newPayments(t, pool)
	const n = 10
	type outcome struct {
		order     orders.Order
		cancelErr error
		resp      *idempotency.Response
		chargeErr error
	}
	results := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		results[i].order = create(t, pool, "acme", 100)
		id := results[i].order.ID
		claimed := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(claimed) }) }
		wg.Go(func() {
			<-claimed
			_, results[i].cancelErr = orders.Cancel(ctx, pool, "acme", id, charges.HasLiveCharge)
		})
		wg.Go(func() {
			defer release() // also when the claim itself failed
			results[i].resp, results[i].chargeErr = pay.chargeAfterClaim(t, fmt.Sprintf("race-%d", i), id, fakeprocessor.PaymentMethodVisa, release)
		})
	}
	wg.Wait()

	effects, err := fakeprocessor.FetchLedger(ctx, pay.procURL)
	if err != nil {
		t.Fatal(err)
	}
	paid := 0
	for _, r := range results {
		if r.chargeErr != nil {
			t.Fatalf("charge of %s: %v", r.order.ID, r.chargeErr)
		}
		var live int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE order_id = $1 AND status IN ('pending', 'succeeded')`, r.order.ID).Scan(&live); err != nil {
			t.Fatal(err)
		}
		switch got := get(t, pool, r.order.ID); got.Status {
		case orders.StatusCanceled:
			if r.cancelErr != nil || r.resp.Status != http.StatusConflict || live != 0 {
				t.Errorf("%s canceled: cancel %v, charge %d, %d live charges; want the charge refused and none live", r.order.ID, r.cancelErr, r.resp.Status, live)
			}
		case orders.StatusPaid:
			paid++
			var p *problem.Error
			if !errors.As(r.cancelErr, &p) || p.Code != orders.NotCancelable || r.resp.Status != http.StatusCreated || live != 1 {
				t.Errorf("%s paid: cancel %v, charge %d, %d live charges; want the cancel refused and one charge", r.order.ID, r.cancelErr, r.resp.Status, live)
			}
		default:
			t.Errorf("%s is %s; want canceled or paid", r.order.ID, got.Status)
		}
	}
	t.Logf("%d of %d orders paid, the others canceled", paid, n)
	if len(effects) != paid {
		t.Errorf("%d processor effects for %d paid orders; want one each and none for a canceled order", len(effects), paid)
	}
}

// Lock holds the order's row until its transaction ends: a second Lock of
// the same order cannot get it meanwhile (here it gives up at a short
// lock_timeout instead of queueing), a plain Get is not held up, another
// caller's Lock of the same id touches nothing, and once the first
// transaction commits, a Get after the next Lock reads the order as that
// transaction left it.
func TestLockHoldsTheOrderUntilTheTransactionEnds(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	o := create(t, pool, "acme", 100)

	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if err := orders.Lock(ctx, first, "acme", o.ID); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if _, err := first.Exec(ctx, `UPDATE orders SET description = 'changed under the lock' WHERE id = $1`, o.ID); err != nil {
		t.Fatal(err)
	}

	lock := func(callerID string) error {
		return postgres.Transact(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
				return err
			}
			return orders.Lock(ctx, tx, callerID, o.ID)
		})
	}
	var pgErr *pgconn.PgError
	if err := lock("acme"); !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
		t.Fatalf("a second Lock while the first transaction holds the order: %v; want it to wait (lock_not_available at the lock_timeout)", err)
	}
	if err := lock("globex"); err != nil {
		t.Errorf("another caller's Lock of the id waited for acme's order: %v", err)
	}
	if got := get(t, pool, o.ID); got.Description != nil {
		t.Errorf("Get saw an uncommitted change: %q", *got.Description)
	}

	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = postgres.Transact(ctx, pool, func(tx pgx.Tx) error {
		if err := orders.Lock(ctx, tx, "acme", o.ID); err != nil {
			return err
		}
		locked, err := orders.Get(ctx, tx, "acme", o.ID)
		if err == nil && (locked.Description == nil || *locked.Description != "changed under the lock") {
			t.Errorf("Get after Lock, after the commit, returned %+v; want the committed change", locked)
		}
		return err
	})
	if err != nil {
		t.Fatalf("Lock after the first transaction ended: %v", err)
	}
}
