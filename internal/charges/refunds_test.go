package charges_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests drive refunds as the HTTP layer and the reconciler do
// (idempotency.Store.Serve, ClaimStale and Drive), against a real
// PostgreSQL and the fake card processor over HTTP. The money rule they pin
// down: what we record as refunded never exceeds the charge, and always
// matches what the processor refunded.

type refundFixture struct {
	pool         *pgxpool.Pool
	store        *idempotency.Store
	charges      *charges.Service
	refunds      *charges.Service
	proc         *fakeprocessor.Server
	processorURL string
}

// newFixture returns a fresh database with the demo callers and the
// services wired to a fake processor on which pm_card_flaky never
// succeeds (so a charge with it stays pending).
func newRefundFixture(t *testing.T) *refundFixture {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	proc, err := fakeprocessor.New(fakeprocessor.Config{FlakyFailures: 100, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proc)
	t.Cleanup(func() { proc.Close(); srv.Close() })
	client := cardprocessor.NewClient(srv.URL, 5*time.Second)
	return &refundFixture{
		pool:         pool,
		store:        idempotency.NewStore(pool, idempotency.StoreConfig{Lease: time.Minute}, quiet),
		charges:      charges.NewService(pool, client),
		refunds:      charges.NewService(pool, client),
		proc:         proc,
		processorURL: srv.URL,
	}
}

// chargeWith charges a new order of amount with paymentMethod through the
// charge operation, and returns the charge as it then is (succeeded,
// failed or pending).
func (f *refundFixture) chargeWith(t *testing.T, amount int64, paymentMethod string) dbsqlc.Charge {
	t.Helper()
	ctx := context.Background()
	o, err := orders.Create(ctx, f.pool, "acme", orders.NewOrder{Amount: amount, Currency: "eur"})
	if err != nil {
		t.Fatal(err)
	}
	key := "charge-" + o.ID
	path := "/v1/orders/" + o.ID + "/charges"
	body := []byte(`{"payment_method":"` + paymentMethod + `"}`)
	doc, _ := idempotency.DecodeJSON(body)
	fp, err := idempotency.Fingerprint("POST", path, doc)
	if err != nil {
		t.Fatal(err)
	}
	req := idempotency.Request{CallerID: "acme", Key: key, Operation: charges.OperationCharge, Method: "POST", Path: path, Fingerprint: fp}
	_, err = f.store.Serve(ctx, f.charges.ChargeOperation(), req, map[string]string{"order_id": o.ID}, body)
	if err != nil && !idempotency.IsRetryable(err) {
		t.Fatalf("charge with %s: %v", paymentMethod, err)
	}
	rec, err := f.store.Get(ctx, "acme", key)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := queries.GetChargeByKeyRecord(ctx, f.pool, dbsqlc.GetChargeByKeyRecordParams{CallerID: "acme", IdempotencyKeyID: rec.ID})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func (f *refundFixture) paidCharge(t *testing.T, amount int64) dbsqlc.Charge {
	t.Helper()
	ch := f.chargeWith(t, amount, fakeprocessor.PaymentMethodVisa)
	if charges.Status(ch.Status) != charges.StatusSucceeded {
		t.Fatalf("charge is %s; want succeeded", ch.Status)
	}
	return ch
}

func amount(n int64) *int64 { return &n }

// refundWith sends one keyed refund request of callerID through the store
// and service, as the HTTP layer does for POST /v1/charges/{id}/refunds; a
// nil amount refunds what remains.
func (f *refundFixture) refundWith(t *testing.T, service *charges.Service, callerID, key, chargeID string, amt *int64) (*idempotency.Response, error) {
	t.Helper()
	body := "{}"
	if amt != nil {
		body = `{"amount":` + strconv.FormatInt(*amt, 10) + `}`
	}
	path := "/v1/charges/" + chargeID + "/refunds"
	doc, _ := idempotency.DecodeJSON([]byte(body))
	fp, err := idempotency.Fingerprint("POST", path, doc)
	if err != nil {
		return nil, err // not t.Fatal: this may run on another goroutine
	}
	req := idempotency.Request{CallerID: callerID, Key: key, Operation: charges.OperationRefund, Method: "POST", Path: path, Fingerprint: fp}
	return f.store.Serve(context.Background(), service.RefundOperation(), req, map[string]string{"charge_id": chargeID}, []byte(body))
}

// mustRefund is a refund by acme that must end in a stored response.
func (f *refundFixture) mustRefund(t *testing.T, key, chargeID string, amt *int64) *idempotency.Response {
	t.Helper()
	resp, err := f.refundWith(t, f.refunds, "acme", key, chargeID, amt)
	if err != nil {
		t.Fatalf("refund under %q: %v", key, err)
	}
	return resp
}

func (f *refundFixture) record(t *testing.T, key string) idempotency.Record {
	t.Helper()
	rec, err := f.store.Get(context.Background(), "acme", key)
	if err != nil {
		t.Fatalf("record of %q: %v", key, err)
	}
	return rec
}

// refundOf returns the refund the operation under key created.
func (f *refundFixture) refundOf(t *testing.T, key string) dbsqlc.Refund {
	t.Helper()
	re, err := queries.GetRefundByKeyRecord(context.Background(), f.pool, dbsqlc.GetRefundByKeyRecordParams{CallerID: "acme", IdempotencyKeyID: f.record(t, key).ID})
	if err != nil {
		t.Fatalf("refund of %q: %v", key, err)
	}
	return re
}

func (f *refundFixture) getCharge(t *testing.T, id string) dbsqlc.Charge {
	t.Helper()
	ch, err := queries.GetCharge(context.Background(), f.pool, dbsqlc.GetChargeParams{CallerID: "acme", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// refundEffects is the processor's refunds: what it really gave back.
func (f *refundFixture) refundEffects(t *testing.T) []fakeprocessor.LedgerEntry {
	t.Helper()
	effects, err := fakeprocessor.FetchLedger(context.Background(), f.processorURL)
	if err != nil {
		t.Fatal(err)
	}
	var out []fakeprocessor.LedgerEntry
	for _, e := range effects {
		if e.Object == "refund" {
			out = append(out, e)
		}
	}
	return out
}

// count runs a count(*) query.
func (f *refundFixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *refundFixture) refundEvents(t *testing.T, refundID string) int {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM events WHERE type = 'refund.succeeded' AND data->>'refund_id' = $1`, refundID)
}

// wantStoredProblem checks that resp is the problem code with status, and
// that the record under key stored it, so a retry replays it.
func (f *refundFixture) wantStoredProblem(t *testing.T, key string, resp *idempotency.Response, status int, code problem.Code) {
	t.Helper()
	var p struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal(resp.Body, &p); err != nil || resp.Status != status || p.Code != string(code) {
		t.Fatalf("%q answered %d %s; want %d %s", key, resp.Status, resp.Body, status, code)
	}
	rec := f.record(t, key)
	if rec.Status != idempotency.StatusCompleted || rec.ResponseStatus == nil || int(*rec.ResponseStatus) != status || !bytes.Equal(rec.ResponseBody, resp.Body) {
		t.Fatalf("record of %q is %s with %v; want the %d stored", key, rec.Status, rec.ResponseStatus, status)
	}
}

// applySucceeded applies a refund.succeeded webhook in a transaction that
// commits whatever ApplyRefundEvent returns (as the webhook handler commits
// its note of a contradiction), so anything it wrote would stick.
func (f *refundFixture) applySucceeded(t *testing.T, downstreamKey, processorRefundID string) (bool, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	known, applyErr := charges.ApplyRefundEvent(ctx, tx, "acme", events.ProcessorEvent{
		ID: "pevt_test", Type: events.ProcessorRefundSucceeded, DownstreamKey: downstreamKey, ObjectID: processorRefundID,
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after ApplyRefundEvent (%v): %v", applyErr, err)
	}
	return known, applyErr
}

// A partial refund reserves its amount on the charge, is made once at the
// processor under the refund's downstream key, and stores a 201 rendered
// from the succeeded refund; a refund without an amount then takes exactly
// what remains.
func TestPartialRefundReservesItsAmount(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)

	resp := f.mustRefund(t, "part", ch.ID, amount(300))
	re := f.refundOf(t, "part")
	if charges.Status(re.Status) != charges.StatusSucceeded || re.Amount != 300 || re.ChargeID != ch.ID || re.DownstreamKey != cardprocessor.DownstreamKey("acme", "part", f.record(t, "part").RequestFingerprint, 0) {
		t.Fatalf("refund %+v; want a succeeded refund of 300 of %s under its own downstream key", re, ch.ID)
	}
	want, err := f.refundCreated(t, re)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, want.Body) {
		t.Errorf("answered %d %s; want 201 %s", resp.Status, resp.Body, want.Body)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 300 {
		t.Errorf("amount_refunded %d; want 300", got)
	}
	made := f.refundEffects(t)
	if len(made) != 1 || made[0].IdempotencyKey != re.DownstreamKey || made[0].Amount != 300 || made[0].Charge != *ch.ProcessorChargeID {
		t.Fatalf("processor refunds %+v; want one of 300 of %s under %q", made, *ch.ProcessorChargeID, re.DownstreamKey)
	}
	if re.ProcessorRefundID == nil || *re.ProcessorRefundID != made[0].ID {
		t.Errorf("processor refund id %v; want %q", re.ProcessorRefundID, made[0].ID)
	}
	if n := f.refundEvents(t, re.ID); n != 1 {
		t.Errorf("%d refund.succeeded events; want 1", n)
	}
	if again := f.mustRefund(t, "part", ch.ID, amount(300)); !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
		t.Errorf("retry: replayed %v %s; want the stored answer", again.Replayed, again.Body)
	}

	rest := f.mustRefund(t, "rest", ch.ID, nil)
	if rest.Status != http.StatusCreated || f.refundOf(t, "rest").Amount != 700 {
		t.Fatalf("refund of the rest: %d %s; want 201 for 700", rest.Status, rest.Body)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 1000 {
		t.Errorf("amount_refunded %d; want 1000", got)
	}
	if n := len(f.refundEffects(t)); n != 2 {
		t.Errorf("%d processor refunds; want 2", n)
	}
}

// A refund of more than remains is a final answer (a stored 409
// refund_exceeds_charge) that reserves nothing and never reaches the
// processor; once nothing remains, any refund is charge_not_refundable.
func TestRefundAboveTheRemainderIsAStoredConflict(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)
	if resp := f.mustRefund(t, "first", ch.ID, amount(600)); resp.Status != http.StatusCreated {
		t.Fatalf("first refund: %d %s", resp.Status, resp.Body)
	}

	resp := f.mustRefund(t, "too-much", ch.ID, amount(401))
	f.wantStoredProblem(t, "too-much", resp, http.StatusConflict, charges.RefundExceedsCharge)
	if again := f.mustRefund(t, "too-much", ch.ID, amount(401)); !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
		t.Errorf("retry: replayed %v %s; want the stored 409", again.Replayed, again.Body)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 600 {
		t.Errorf("amount_refunded %d after a refused refund; want 600", got)
	}
	if n := f.count(t, `SELECT count(*) FROM refunds`); n != 1 {
		t.Errorf("%d refund rows; want 1 (the refused one creates none)", n)
	}

	// Exactly what remains is fine, and then nothing is.
	if resp := f.mustRefund(t, "exact", ch.ID, amount(400)); resp.Status != http.StatusCreated {
		t.Fatalf("refund of exactly what remains: %d %s", resp.Status, resp.Body)
	}
	f.wantStoredProblem(t, "nothing-left", f.mustRefund(t, "nothing-left", ch.ID, amount(1)), http.StatusConflict, charges.NotRefundable)
	f.wantStoredProblem(t, "nothing-left-rest", f.mustRefund(t, "nothing-left-rest", ch.ID, nil), http.StatusConflict, charges.NotRefundable)

	var refunded int64
	for _, e := range f.refundEffects(t) {
		refunded += e.Amount
	}
	if refunded != 1000 || f.getCharge(t, ch.ID).AmountRefunded != 1000 {
		t.Errorf("the processor refunded %d, we recorded %d; want 1000 both", refunded, f.getCharge(t, ch.ID).AmountRefunded)
	}
}

// Refunds under different keys, all at once: the order's lock serializes
// their reservations, so exactly three of ten 300s fit in 1000 and the rest
// are refund_exceeds_charge. What we recorded, what the succeeded refunds
// add up to and what the processor refunded all agree.
func TestConcurrentRefundsNeverExceedTheCharge(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)
	const n = 10
	resps := make([]*idempotency.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resps[i], errs[i] = f.refundWith(t, f.refunds, "acme", fmt.Sprintf("concurrent-%d", i), ch.ID, amount(300))
		})
	}
	wg.Wait()

	succeeded := 0
	for i := range n {
		key := fmt.Sprintf("concurrent-%d", i)
		if errs[i] != nil {
			t.Fatalf("%s: %v (an over-refund must be a stored 409, never an error)", key, errs[i])
		}
		if resps[i].Status == http.StatusCreated {
			succeeded++
			continue
		}
		f.wantStoredProblem(t, key, resps[i], http.StatusConflict, charges.RefundExceedsCharge)
	}
	if succeeded != 3 {
		t.Errorf("%d refunds of 300 succeeded on a charge of 1000; want 3", succeeded)
	}

	recorded := f.getCharge(t, ch.ID).AmountRefunded
	var rows int64
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(sum(amount), 0) FROM refunds WHERE status = 'succeeded'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	var atProcessor int64
	made := f.refundEffects(t)
	for _, e := range made {
		atProcessor += e.Amount
	}
	if recorded != 900 || rows != 900 || atProcessor != 900 || len(made) != succeeded {
		t.Errorf("amount_refunded %d, succeeded refunds %d, processor %d in %d refunds; want 900 each, one processor refund per success",
			recorded, rows, atProcessor, len(made))
	}
}

// The guarantee under the lock: the database itself refuses a reservation
// past the charged amount (CHECK refunds_within_charge), so even a change
// that forgot the lock could not refund more than was charged.
func TestTheDatabaseRefusesAnOverReservation(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)
	ctx := context.Background()
	if _, err := queries.ReserveRefund(ctx, f.pool, dbsqlc.ReserveRefundParams{Amount: 1000, CallerID: "acme", ID: ch.ID}); err != nil {
		t.Fatalf("reserving the whole charge: %v", err)
	}
	_, err := queries.ReserveRefund(ctx, f.pool, dbsqlc.ReserveRefundParams{Amount: 1, CallerID: "acme", ID: ch.ID})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "refunds_within_charge" {
		t.Fatalf("reserving past the charge: %v; want the refunds_within_charge CHECK to refuse it", err)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 1000 {
		t.Errorf("amount_refunded %d; want 1000", got)
	}
}

// A refund whose answer is lost (the processor refunds, then withholds its
// answer past the client's timeout) stays pending with its reservation
// held. The webhook records it once however often it is delivered (one
// refund.succeeded event), and the resumed operation then finds it
// recorded: it stores the 201 without a second refund at the processor.
func TestApplySucceededIsIdempotent(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)

	// From now on the processor withholds every answer with an effect; a
	// service with a short client timeout gives up on it.
	if err := f.proc.SetChaos(fakeprocessor.Chaos{TimeoutRate: 1}); err != nil {
		t.Fatal(err)
	}
	impatient := charges.NewService(f.pool, cardprocessor.NewClient(f.processorURL, 2*time.Second))
	if _, err := f.refundWith(t, impatient, "acme", "lost", ch.ID, amount(250)); !idempotency.IsRetryable(err) {
		t.Fatalf("refund: %v; want a retryable failure (the answer never came)", err)
	}
	if err := f.proc.SetChaos(fakeprocessor.Chaos{}); err != nil {
		t.Fatal(err)
	}
	pending := f.refundOf(t, "lost")
	if charges.Status(pending.Status) != charges.StatusPending || f.getCharge(t, ch.ID).AmountRefunded != 250 {
		t.Fatalf("refund %s with %d reserved; want pending with 250 reserved", pending.Status, f.getCharge(t, ch.ID).AmountRefunded)
	}
	if rec := f.record(t, "lost"); rec.RecoveryPoint != charges.RecoveryRefundCreated || rec.ResponseStatus != nil {
		t.Fatalf("record at %s with response %v; want %s, nothing stored", rec.RecoveryPoint, rec.ResponseStatus, charges.RecoveryRefundCreated)
	}
	made := f.refundEffects(t)
	if len(made) != 1 || made[0].IdempotencyKey != pending.DownstreamKey {
		t.Fatalf("processor refunds %+v; want the one made under %q", made, pending.DownstreamKey)
	}

	for i := range 2 {
		if known, err := f.applySucceeded(t, pending.DownstreamKey, made[0].ID); !known || err != nil {
			t.Fatalf("delivery %d: %v, %v; want the refund found and recorded", i+1, known, err)
		}
	}
	re := f.refundOf(t, "lost")
	if charges.Status(re.Status) != charges.StatusSucceeded || re.ProcessorRefundID == nil || *re.ProcessorRefundID != made[0].ID {
		t.Fatalf("refund %s with processor id %v; want succeeded with %q", re.Status, re.ProcessorRefundID, made[0].ID)
	}
	if n := f.refundEvents(t, re.ID); n != 1 {
		t.Errorf("%d refund.succeeded events after two deliveries; want 1", n)
	}
	if known, err := f.applySucceeded(t, cardprocessor.DownstreamKey("acme", "unknown", nil, 0), "pre_x"); known || err != nil {
		t.Errorf("unknown downstream key: %v, %v; want false, nil", known, err)
	}

	// The reconciler takes the record over and resumes it.
	if _, err := f.pool.Exec(context.Background(), `
		UPDATE idempotency_keys SET locked_until = now() - interval '1 second', next_attempt_at = now() - interval '1 second'
		WHERE key = 'lost'`); err != nil {
		t.Fatal(err)
	}
	leases, err := f.store.ClaimStale(context.Background(), 10, []string{charges.OperationRefund})
	if err != nil || len(leases) != 1 {
		t.Fatalf("ClaimStale: %d, %v; want the one stale refund", len(leases), err)
	}
	resp, err := f.store.Drive(context.Background(), leases[0], f.refunds.RefundOperation().Resume, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.refundCreated(t, f.refundOf(t, "lost"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, want.Body) {
		t.Errorf("resumed answer %d %s; want 201 %s", resp.Status, resp.Body, want.Body)
	}
	if n := f.refundEvents(t, re.ID); n != 1 {
		t.Errorf("%d refund.succeeded events after the resume; want 1", n)
	}
	if n := len(f.refundEffects(t)); n != 1 {
		t.Errorf("%d processor refunds after the resume; want 1", n)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 250 {
		t.Errorf("amount_refunded %d; want 250", got)
	}
}

// A definite "no" from the processor (here: the charge was partly refunded
// at the processor behind our back, so our refund is too large there) is
// final: the refund fails, its reservation is given back, and a 409 is
// stored. A later webhook claiming it succeeded is a contradiction that
// changes nothing.
func TestRefusedRefundGivesItsReservationBack(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)
	ctx := context.Background()
	outside := cardprocessor.NewClient(f.processorURL, 5*time.Second)
	if _, err := outside.Refund(ctx, "refunded-in-the-dashboard", cardprocessor.RefundRequest{Charge: *ch.ProcessorChargeID, Amount: 800}); err != nil {
		t.Fatal(err)
	}

	resp := f.mustRefund(t, "refused", ch.ID, amount(500))
	f.wantStoredProblem(t, "refused", resp, http.StatusConflict, charges.NotRefundable)
	re := f.refundOf(t, "refused")
	if charges.Status(re.Status) != charges.StatusFailed {
		t.Errorf("refund is %s; want failed", re.Status)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded %d after a refused refund; want 0 (the reservation given back)", got)
	}
	if n := f.refundEvents(t, re.ID); n != 0 {
		t.Errorf("%d refund.succeeded events; want none", n)
	}

	known, err := f.applySucceeded(t, re.DownstreamKey, "pre_contradicting")
	var c *events.ContradictionError
	if known || !errors.As(err, &c) || c.Object != "refund" || c.ID != re.ID || c.Recorded != "failed" || c.Reported != "succeeded" {
		t.Fatalf("webhook for the failed refund: %v, %v; want a contradiction (refund %s failed, reported succeeded)", known, err, re.ID)
	}
	if after := f.refundOf(t, "refused"); charges.Status(after.Status) != charges.StatusFailed || after.ProcessorRefundID != nil || f.refundEvents(t, re.ID) != 0 {
		t.Errorf("after the contradiction the refund is %s (processor id %v); want failed, untouched, no event", after.Status, after.ProcessorRefundID)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded %d after the contradiction; want 0", got)
	}

	// The reservation given back is refundable again.
	if resp := f.mustRefund(t, "what-remains", ch.ID, amount(200)); resp.Status != http.StatusCreated {
		t.Fatalf("refund of 200: %d %s; want 201", resp.Status, resp.Body)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 200 {
		t.Errorf("amount_refunded %d; want 200", got)
	}
}

// Only a succeeded charge can be refunded: a declined or a still pending
// charge is a stored charge_not_refundable, an unknown charge (or another
// caller's) is not found; none of them reserves anything or reaches the
// processor.
func TestRefundOfAChargeThatDidNotSucceedIsRefused(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	declined := f.chargeWith(t, 500, fakeprocessor.PaymentMethodChargeDeclined)
	pending := f.chargeWith(t, 500, fakeprocessor.PaymentMethodFlaky)
	if charges.Status(declined.Status) != charges.StatusFailed || charges.Status(pending.Status) != charges.StatusPending {
		t.Fatalf("charges are %s and %s; want failed and pending", declined.Status, pending.Status)
	}

	for name, ch := range map[string]dbsqlc.Charge{"declined": declined, "pending": pending} {
		f.wantStoredProblem(t, name, f.mustRefund(t, name, ch.ID, amount(100)), http.StatusConflict, charges.NotRefundable)
		if got := f.getCharge(t, ch.ID).AmountRefunded; got != 0 {
			t.Errorf("%s: amount_refunded %d; want 0", name, got)
		}
	}

	// An unknown charge, or another caller's, is a 404 before the claim:
	// nothing stored, the key free for a corrected request.
	if _, err := f.refundWith(t, f.refunds, "acme", "unknown", "ch_unknown", nil); !isProblem(err, problem.NotFound) {
		t.Errorf("refund of an unknown charge: %v; want not_found", err)
	}
	paid := f.paidCharge(t, 500)
	if _, err := f.refundWith(t, f.refunds, "globex", "foreign", paid.ID, nil); !isProblem(err, problem.NotFound) {
		t.Errorf("globex refunding acme's charge: %v; want not_found", err)
	}
	for _, key := range []string{"unknown", "foreign"} {
		caller := map[string]string{"unknown": "acme", "foreign": "globex"}[key]
		if _, err := f.store.Get(context.Background(), caller, key); !isProblem(err, problem.NotFound) {
			t.Errorf("record of %q: %v; want none", key, err)
		}
	}
	if got := f.getCharge(t, paid.ID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded %d after another caller's attempt; want 0", got)
	}

	if n := f.count(t, `SELECT count(*) FROM refunds`); n != 0 {
		t.Errorf("%d refund rows; want none", n)
	}
	if n := len(f.refundEffects(t)); n != 0 {
		t.Errorf("%d processor refunds; want none", n)
	}
}

// List pages through one charge's refunds oldest first: every refund of
// that charge exactly once whatever the page size, none of another
// charge's, and has_more on every page but the last.
func TestListPagesAChargesRefundsOldestFirst(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ctx := context.Background()
	ch := f.paidCharge(t, 1000)
	other := f.paidCharge(t, 1000)
	var want []string // oldest first
	for i := range 4 {
		key := fmt.Sprintf("refund-%d", i)
		f.mustRefund(t, key, ch.ID, amount(100))
		want = append(want, f.refundOf(t, key).ID)
		f.mustRefund(t, fmt.Sprintf("other-%d", i), other.ID, amount(100)) // interleaved, not listed
	}

	for _, limit := range []int{1, 2, 3, 4, 5, 100} {
		var got []string
		after := ""
		for page := 0; ; page++ {
			rows, more, err := charges.ListRefunds(ctx, f.pool, "acme", ch.ID, limit, after)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) > limit || (more && len(rows) != limit) {
				t.Fatalf("limit %d, page %d: %d rows, has_more %v", limit, page, len(rows), more)
			}
			for _, re := range rows {
				if re.ChargeID != ch.ID || re.CallerID != "acme" {
					t.Fatalf("listed refund %s of %s/%s; want only acme's refunds of %s", re.ID, re.CallerID, re.ChargeID, ch.ID)
				}
				got = append(got, re.ID)
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

	fresh := f.paidCharge(t, 500)
	if rows, more, err := charges.ListRefunds(ctx, f.pool, "acme", fresh.ID, 10, ""); err != nil || len(rows) != 0 || more {
		t.Errorf("a charge without refunds: %d rows, has_more %v, %v; want an empty last page", len(rows), more, err)
	}
}

// List answers only about the caller's own charge: an unknown charge, or
// another caller's, is not found; a cursor that is not a refund of this
// charge (unknown, or another charge's) is an invalid starting_after.
func TestListRefusesWhatIsNotTheCallersCharge(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ctx := context.Background()
	ch := f.paidCharge(t, 1000)
	other := f.paidCharge(t, 1000)
	f.mustRefund(t, "mine", ch.ID, amount(100))
	f.mustRefund(t, "other", other.ID, amount(100))
	otherRefund := f.refundOf(t, "other")

	for _, c := range []struct{ caller, charge string }{{"acme", "ch_unknown"}, {"globex", ch.ID}} {
		_, _, err := charges.ListRefunds(ctx, f.pool, c.caller, c.charge, 10, "")
		var p *problem.Error
		if !errors.As(err, &p) || p.Code != problem.NotFound {
			t.Errorf("%s listing the refunds of %s: %v; want not_found", c.caller, c.charge, err)
		}
	}
	for _, cursor := range []string{"re_unknown", otherRefund.ID} {
		rows, more, err := charges.ListRefunds(ctx, f.pool, "acme", ch.ID, 10, cursor)
		var p *problem.Error
		if !errors.As(err, &p) || p.Code != problem.InvalidRequest || len(p.Errors) != 1 || p.Errors[0].Field != "starting_after" || rows != nil || more {
			t.Errorf("cursor %s: %v (%d rows); want invalid_request naming starting_after", cursor, err, len(rows))
		}
	}
}

// decliningProcessor answers every refund with a decline: a definite "no"
// of the other kind, as a real processor's client might report one.
type decliningProcessor struct{ cardprocessor.Processor }

func (decliningProcessor) Refund(context.Context, string, cardprocessor.RefundRequest) (cardprocessor.RefundResult, error) {
	return cardprocessor.RefundResult{}, &cardprocessor.DeclinedError{DeclineCode: "refund_declined"}
}

// Any definite "no" from the processor fails the refund and gives its
// reservation back; none is ever recorded as a success.
func TestDeclinedRefundIsNotRecordedAsASuccess(t *testing.T) {
	t.Parallel()
	f := newRefundFixture(t)
	ch := f.paidCharge(t, 1000)
	declining := charges.NewService(f.pool, decliningProcessor{cardprocessor.NewClient(f.processorURL, 5*time.Second)})
	resp, err := f.refundWith(t, declining, "acme", "declined-refund", ch.ID, amount(400))
	if err != nil {
		t.Fatal(err)
	}
	f.wantStoredProblem(t, "declined-refund", resp, http.StatusConflict, charges.NotRefundable)
	if re := f.refundOf(t, "declined-refund"); charges.Status(re.Status) != charges.StatusFailed {
		t.Errorf("refund is %s; want failed", re.Status)
	}
	if got := f.getCharge(t, ch.ID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded %d; want 0 (the reservation given back)", got)
	}
}

// refundCreated is the response a refund's final phase stores: the refund
// as the API lists it now.
func (f *refundFixture) refundCreated(t *testing.T, row dbsqlc.Refund) (*idempotency.Response, error) {
	t.Helper()
	all, _, err := charges.ListRefunds(context.Background(), f.pool, "acme", row.ChargeID, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range all {
		if re.ID == row.ID {
			return re.Created()
		}
	}
	t.Fatalf("refund %s is not among its charge's refunds", row.ID)
	return nil, nil
}
