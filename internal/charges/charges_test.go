package charges_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/orders"
	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

// These tests drive the charge operation the way the HTTP layer and the
// reconciler do (idempotency.Store.Serve, ClaimStale and Drive), against
// a real PostgreSQL and the fake card processor over HTTP. They pin down
// the package's own contract: what each phase writes, what is stored as the
// final answer, and that the processor is asked for one effect per charge.

var (
	quiet   = slog.New(slog.NewTextHandler(io.Discard, nil))
	queries = dbsqlc.New()
)

type fixture struct {
	pool         *pgxpool.Pool
	store        *idempotency.Store
	charges      *charges.Service
	processorURL string
}

// newFixture returns a fresh database with the demo callers, a fake
// processor configured by cfg, and a charge service that reaches it through
// the HTTP client, wrapped by wrap when it is not nil.
func newFixture(t *testing.T, cfg fakeprocessor.Config, clientTimeout time.Duration, wrap func(cardprocessor.Processor) cardprocessor.Processor) *fixture {
	t.Helper()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quiet
	proc, err := fakeprocessor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proc)
	t.Cleanup(func() { proc.Close(); srv.Close() })
	var client cardprocessor.Processor = cardprocessor.NewClient(srv.URL, clientTimeout)
	if wrap != nil {
		client = wrap(client)
	}
	return &fixture{
		pool:         pool,
		store:        idempotency.NewStore(pool, idempotency.StoreConfig{Lease: time.Minute}, quiet),
		charges:      charges.NewService(pool, client),
		processorURL: srv.URL,
	}
}

func (f *fixture) order(t *testing.T, callerID string, amount int64) orders.Order {
	t.Helper()
	o, err := orders.Create(context.Background(), f.pool, callerID, orders.NewOrder{Amount: amount, Currency: "usd"})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// charge sends one keyed charge request through the store, as the HTTP
// layer does for POST /v1/orders/{id}/charges.
func (f *fixture) charge(t *testing.T, callerID, key, orderID, paymentMethod string) (*idempotency.Response, error) {
	t.Helper()
	path := "/v1/orders/" + orderID + "/charges"
	body := []byte(`{"payment_method":"` + paymentMethod + `"}`)
	doc, _ := idempotency.DecodeJSON(body)
	fp, err := idempotency.Fingerprint("POST", path, doc)
	if err != nil {
		return nil, err // not t.Fatal: this may run on another goroutine
	}
	req := idempotency.Request{CallerID: callerID, Key: key, Operation: charges.OperationCharge, Method: "POST", Path: path, Fingerprint: fp}
	return f.store.Serve(context.Background(), f.charges.ChargeOperation(), req, map[string]string{"order_id": orderID}, body)
}

// mustCharge is charge for a request that must end in a stored response.
func (f *fixture) mustCharge(t *testing.T, key, orderID, paymentMethod string) *idempotency.Response {
	t.Helper()
	resp, err := f.charge(t, "acme", key, orderID, paymentMethod)
	if err != nil {
		t.Fatalf("charge under %q: %v", key, err)
	}
	return resp
}

func (f *fixture) record(t *testing.T, key string) idempotency.Record {
	t.Helper()
	rec, err := f.store.Get(context.Background(), "acme", key)
	if err != nil {
		t.Fatalf("record of %q: %v", key, err)
	}
	return rec
}

// chargeOf returns the charge the operation under key created.
func (f *fixture) chargeOf(t *testing.T, key string) dbsqlc.Charge {
	t.Helper()
	rec := f.record(t, key)
	ch, err := queries.GetChargeByKeyRecord(context.Background(), f.pool, dbsqlc.GetChargeByKeyRecordParams{CallerID: "acme", IdempotencyKeyID: rec.ID})
	if err != nil {
		t.Fatalf("charge of %q: %v", key, err)
	}
	return ch
}

func (f *fixture) orderStatus(t *testing.T, id string) orders.Status {
	t.Helper()
	o, err := orders.Get(context.Background(), f.pool, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return o.Status
}

// eventTypes lists the outbox events about chargeID, sorted.
func (f *fixture) eventTypes(t *testing.T, chargeID string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT type FROM events WHERE data->>'charge_id' = $1 ORDER BY type`, chargeID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var types []string
	for rows.Next() {
		var typ string
		if err := rows.Scan(&typ); err != nil {
			t.Fatal(err)
		}
		types = append(types, typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return types
}

func (f *fixture) countCharges(t *testing.T, orderID string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE order_id = $1`, orderID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// effects is the processor's ledger: what it really did.
func (f *fixture) effects(t *testing.T) []fakeprocessor.LedgerEntry {
	t.Helper()
	effects, err := fakeprocessor.FetchLedger(context.Background(), f.processorURL)
	if err != nil {
		t.Fatal(err)
	}
	return effects
}

// effectsUnder is the processor's effects made under downstreamKey.
func (f *fixture) effectsUnder(t *testing.T, downstreamKey string) []fakeprocessor.LedgerEntry {
	t.Helper()
	var out []fakeprocessor.LedgerEntry
	for _, e := range f.effects(t) {
		if e.IdempotencyKey == downstreamKey {
			out = append(out, e)
		}
	}
	return out
}

// makeStale puts the record under key where the reconciler takes it over:
// its lease over and its next try due, on the database clock.
func (f *fixture) makeStale(t *testing.T, key string) {
	t.Helper()
	tag, err := f.pool.Exec(context.Background(), `
		UPDATE idempotency_keys
		SET locked_until = now() - interval '1 second', next_attempt_at = now() - interval '1 second'
		WHERE caller_id = 'acme' AND key = $1 AND status = 'in_progress'`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("make %q stale: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// resume does what the reconciler does with a stale record: take it over
// and drive it with the handler registered for charges.
func (f *fixture) resume(t *testing.T, key string) *idempotency.Response {
	t.Helper()
	f.makeStale(t, key)
	before := f.record(t, key)
	leases, err := f.store.ClaimStale(context.Background(), 10, []string{charges.OperationCharge})
	if err != nil || len(leases) != 1 {
		t.Fatalf("ClaimStale: %d leases, %v; want the one stale record", len(leases), err)
	}
	l := leases[0]
	if l.Record().Key != key || l.Record().Attempt != before.Attempt+1 {
		t.Fatalf("took over %q at attempt %d; want %q at attempt %d", l.Record().Key, l.Record().Attempt, key, before.Attempt+1)
	}
	resp, err := f.store.Drive(context.Background(), l, f.charges.ChargeOperation().Resume, time.Minute)
	if err != nil {
		t.Fatalf("resume %q: %v", key, err)
	}
	return resp
}

// applyOutcome applies a webhook's outcome, as the inbox would, in a
// transaction that is committed whatever ApplyChargeEvent returns, as the
// inbox commits its note about a contradiction: whatever the function wrote
// would stick.
func (f *fixture) applyOutcome(t *testing.T, downstreamKey string, o charges.Answer) (bool, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ev := events.ProcessorEvent{ID: "pevt_test", Type: events.ProcessorChargeFailed, DownstreamKey: downstreamKey, ObjectID: o.ProcessorChargeID}
	if o.Succeeded {
		ev.Type = events.ProcessorChargeSucceeded
	}
	if o.DeclineCode != "" {
		ev.DeclineCode = &o.DeclineCode
	}
	known, applyErr := charges.ApplyChargeEvent(ctx, tx, "acme", ev)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after ApplyChargeEvent (%v): %v", applyErr, err)
	}
	return known, applyErr
}

type problemBody struct {
	Status      int    `json:"status"`
	Code        string `json:"code"`
	DeclineCode string `json:"decline_code"`
}

// wantStoredProblem checks that resp is the problem code with status, and
// that it is what the record under key stored, so a retry replays it.
func (f *fixture) wantStoredProblem(t *testing.T, key string, resp *idempotency.Response, status int, code problem.Code) problemBody {
	t.Helper()
	var p problemBody
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		t.Fatalf("%q answered %d %s: %v", key, resp.Status, resp.Body, err)
	}
	if resp.Status != status || p.Status != status || p.Code != string(code) {
		t.Fatalf("%q answered %d %s; want %d %s", key, resp.Status, resp.Body, status, code)
	}
	rec := f.record(t, key)
	if rec.Status != idempotency.StatusCompleted || rec.ResponseStatus == nil || int(*rec.ResponseStatus) != status || !bytes.Equal(rec.ResponseBody, resp.Body) {
		t.Fatalf("record of %q is %s with %v %s; want the %d stored", key, rec.Status, rec.ResponseStatus, rec.ResponseBody, status)
	}
	return p
}

// processorSpy delegates to the real client and lets a test look at the
// database while the processor call is in flight.
type processorSpy struct {
	cardprocessor.Processor
	duringCharge func(downstreamKey string)
}

func (s processorSpy) Charge(ctx context.Context, downstreamKey string, req cardprocessor.ChargeRequest) (cardprocessor.ChargeResult, error) {
	s.duringCharge(downstreamKey)
	return s.Processor.Charge(ctx, downstreamKey, req)
}

// A fresh charge runs its three steps in order: the create phase commits
// the pending charge and the recovery point before the processor is called
// (so a crash during the call leaves a record that knows its downstream
// key), the processor is called once under that key, and the final phase
// stores a 201 whose body is exactly the succeeded charge's Created response,
// with the order paid and both outbox events.
func TestFreshChargeIsCreatedCalledAndFinished(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seenDuringCall []string
	var f *fixture
	f = newFixture(t, fakeprocessor.Config{}, 5*time.Second, func(p cardprocessor.Processor) cardprocessor.Processor {
		return processorSpy{Processor: p, duringCharge: func(downstreamKey string) {
			var status, recoveryPoint, recordStatus string
			err := f.pool.QueryRow(context.Background(), `
				SELECT c.status, k.recovery_point, k.status
				FROM charges c JOIN idempotency_keys k ON k.caller_id = c.caller_id AND k.id = c.idempotency_key_id
				WHERE c.downstream_key = $1`, downstreamKey).Scan(&status, &recoveryPoint, &recordStatus)
			mu.Lock()
			defer mu.Unlock()
			seenDuringCall = append(seenDuringCall, fmt.Sprintf("%s/%s/%s/%v", status, recordStatus, recoveryPoint, err))
		}}
	})
	o := f.order(t, "acme", 4200)

	resp := f.mustCharge(t, "pay", o.ID, fakeprocessor.PaymentMethodVisa)

	mu.Lock()
	during := slices.Clone(seenDuringCall)
	mu.Unlock()
	if want := []string{"pending/in_progress/charge_created/<nil>"}; !slices.Equal(during, want) {
		t.Errorf("during the processor call the database showed %v; want %v (the create phase committed first, and one call)", during, want)
	}

	ch := f.chargeOf(t, "pay")
	if charges.Status(ch.Status) != charges.StatusSucceeded || ch.Amount != 4200 || ch.Currency != "usd" || ch.OrderID != o.ID ||
		ch.PaymentMethod != fakeprocessor.PaymentMethodVisa || ch.FailureCode != nil {
		t.Errorf("charge %+v; want a succeeded charge of the order's 4200 usd", ch)
	}
	// Derived from the request, which every retry carries again, not from
	// the row.
	if want := cardprocessor.DownstreamKey("acme", "pay", f.record(t, "pay").RequestFingerprint, 0); ch.DownstreamKey != want {
		t.Errorf("downstream key %q; want %q", ch.DownstreamKey, want)
	}

	want, err := f.created(t, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, want.Body) || resp.Header.Get("Location") != "/v1/charges/"+ch.ID {
		t.Errorf("answered %d %s (Location %q); want 201 %s (Location %q)", resp.Status, resp.Body, resp.Header.Get("Location"), want.Body, "/v1/charges/"+ch.ID)
	}
	rec := f.record(t, "pay")
	if rec.Status != idempotency.StatusCompleted || rec.RecoveryPoint != idempotency.RecoveryFinished ||
		rec.ResponseStatus == nil || *rec.ResponseStatus != http.StatusCreated || !bytes.Equal(rec.ResponseBody, want.Body) {
		t.Errorf("record %s/%s with %v %s; want completed/finished with the rendered 201", rec.Status, rec.RecoveryPoint, rec.ResponseStatus, rec.ResponseBody)
	}

	effects := f.effects(t)
	if len(effects) != 1 || effects[0].IdempotencyKey != ch.DownstreamKey || effects[0].Amount != 4200 || effects[0].Status != "succeeded" {
		t.Fatalf("processor effects %+v; want one succeeded charge of 4200 under %q", effects, ch.DownstreamKey)
	}
	if ch.ProcessorChargeID == nil || *ch.ProcessorChargeID != effects[0].ID {
		t.Errorf("processor charge id %v; want the processor's %q", ch.ProcessorChargeID, effects[0].ID)
	}
	if got := f.orderStatus(t, o.ID); got != orders.StatusPaid {
		t.Errorf("order is %s; want paid", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.succeeded", "order.paid"}) {
		t.Errorf("events %v; want charge.succeeded and order.paid, once each", got)
	}

	// A retry is answered from the record, without a second call.
	again := f.mustCharge(t, "pay", o.ID, fakeprocessor.PaymentMethodVisa)
	if !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
		t.Errorf("retry: replayed %v, %s; want the stored answer", again.Replayed, again.Body)
	}
	if n := len(f.effects(t)); n != 1 {
		t.Errorf("%d processor effects after a retry; want 1", n)
	}
}

// A failover can lose our last commits (the record, the charge, the order
// paid) but not the processor's charge. The client's retry, the same key
// and request, then runs the operation afresh on new rows, and must send
// the processor the downstream key the lost attempt sent: the processor
// replays its charge instead of making a second one.
func TestRetryAfterLostRowsChargesOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{}, 5*time.Second, nil)
	o := f.order(t, "acme", 4200)
	f.mustCharge(t, "lost", o.ID, fakeprocessor.PaymentMethodVisa)
	// The failover: what the charge wrote is gone, the order is pending again.
	if _, err := f.pool.Exec(context.Background(), `DELETE FROM charges; DELETE FROM idempotency_keys; UPDATE orders SET status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	f.mustCharge(t, "lost", o.ID, fakeprocessor.PaymentMethodVisa)
	if effects := f.effects(t); len(effects) != 1 {
		t.Fatalf("the processor made %d charges for one charge request; want 1", len(effects))
	}
}

// A decline is a definite "no": it is the final answer (a stored 402
// carrying the processor's decline code), the charge is failed, and the
// order stays pending, so that the caller can pay it with another card
// under a new key.
func TestDeclineIsStoredAndLeavesTheOrderPayable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{}, 5*time.Second, nil)
	o := f.order(t, "acme", 1500)

	resp := f.mustCharge(t, "declined", o.ID, fakeprocessor.PaymentMethodChargeDeclined)
	p := f.wantStoredProblem(t, "declined", resp, http.StatusPaymentRequired, charges.CardDeclined)
	if p.DeclineCode != fakeprocessor.DeclineGeneric {
		t.Errorf("decline_code %q; want %q", p.DeclineCode, fakeprocessor.DeclineGeneric)
	}
	ch := f.chargeOf(t, "declined")
	if charges.Status(ch.Status) != charges.StatusFailed || ch.FailureCode == nil || *ch.FailureCode != fakeprocessor.DeclineGeneric {
		t.Errorf("charge %s with failure code %v; want failed with %q", ch.Status, ch.FailureCode, fakeprocessor.DeclineGeneric)
	}
	declines := f.effectsUnder(t, ch.DownstreamKey)
	if len(declines) != 1 || declines[0].Status != "failed" || ch.ProcessorChargeID == nil || *ch.ProcessorChargeID != declines[0].ID {
		t.Errorf("processor effects %+v for processor charge id %v; want the one declined charge, recorded", declines, ch.ProcessorChargeID)
	}
	if got := f.orderStatus(t, o.ID); got != orders.StatusPending {
		t.Errorf("order is %s after a decline; want pending", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.failed"}) {
		t.Errorf("events %v; want charge.failed only", got)
	}
	if again := f.mustCharge(t, "declined", o.ID, fakeprocessor.PaymentMethodChargeDeclined); !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
		t.Errorf("retry: replayed %v, %s; want the stored decline", again.Replayed, again.Body)
	}

	// The failed charge does not hold the order: another card, another key.
	if paid := f.mustCharge(t, "second-card", o.ID, fakeprocessor.PaymentMethodVisa); paid.Status != http.StatusCreated {
		t.Fatalf("charge with another card: %d %s; want 201", paid.Status, paid.Body)
	}
	if got := f.orderStatus(t, o.ID); got != orders.StatusPaid {
		t.Errorf("order is %s; want paid by the second card", got)
	}
	if n := len(f.effects(t)); n != 2 {
		t.Errorf("%d processor effects; want 2 (the decline and the charge)", n)
	}
}

// The central promise, across a takeover: a processor call without a
// definite answer (a 503 from pm_card_flaky) is not an outcome. Nothing is
// stored, the error is retryable, the record stays at charge_created and
// the charge pending. When the reconciler takes the record over and
// resumes it, the call goes out again under the same downstream key (the
// processor's second attempt on that key is the one that succeeds, so a
// new key would fail again), and the charge is made exactly once.
func TestChargeIsCreatedOnceAcrossTakeover(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{FlakyFailures: 1}, 5*time.Second, nil)
	o := f.order(t, "acme", 2500)

	resp, err := f.charge(t, "acme", "flaky", o.ID, fakeprocessor.PaymentMethodFlaky)
	if resp != nil || !idempotency.IsRetryable(err) {
		t.Fatalf("first attempt: %v, %v; want no response and a retryable error", resp, err)
	}
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != problem.ProcessorUnavailable || p.RetryAfter < 1 {
		t.Errorf("first attempt: %v; want processor_unavailable with a Retry-After", err)
	}
	rec := f.record(t, "flaky")
	if rec.Status != idempotency.StatusInProgress || rec.RecoveryPoint != charges.RecoveryChargeCreated || rec.ResponseStatus != nil {
		t.Fatalf("record %s/%s with response %v; want in_progress/%s, nothing stored", rec.Status, rec.RecoveryPoint, rec.ResponseStatus, charges.RecoveryChargeCreated)
	}
	pending := f.chargeOf(t, "flaky")
	if charges.Status(pending.Status) != charges.StatusPending || pending.ProcessorChargeID != nil {
		t.Fatalf("charge %s; want pending, with no processor id", pending.Status)
	}
	if got := f.orderStatus(t, o.ID); got != orders.StatusPending {
		t.Errorf("order is %s; want pending while the charge is uncertain", got)
	}
	if n := len(f.effects(t)); n != 0 {
		t.Fatalf("%d processor effects after a 503; want none", n)
	}

	resumed := f.resume(t, "flaky")

	ch := f.chargeOf(t, "flaky")
	if ch.ID != pending.ID || charges.Status(ch.Status) != charges.StatusSucceeded {
		t.Fatalf("after the takeover the charge is %s %s; want %s succeeded (the same row)", ch.ID, ch.Status, pending.ID)
	}
	want, err := f.created(t, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.Status != http.StatusCreated || !bytes.Equal(resumed.Body, want.Body) {
		t.Errorf("resumed answer %d %s; want 201 %s", resumed.Status, resumed.Body, want.Body)
	}
	effects := f.effects(t)
	if len(effects) != 1 || effects[0].IdempotencyKey != pending.DownstreamKey || effects[0].Status != "succeeded" {
		t.Fatalf("processor effects %+v; want exactly one, under the charge's downstream key %q", effects, pending.DownstreamKey)
	}
	if ch.ProcessorChargeID == nil || *ch.ProcessorChargeID != effects[0].ID {
		t.Errorf("processor charge id %v; want %q", ch.ProcessorChargeID, effects[0].ID)
	}
	if got := f.orderStatus(t, o.ID); got != orders.StatusPaid {
		t.Errorf("order is %s; want paid", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.succeeded", "order.paid"}) {
		t.Errorf("events %v; want charge.succeeded and order.paid, once each", got)
	}

	// The client that was told to retry comes back and gets the result.
	again, err := f.charge(t, "acme", "flaky", o.ID, fakeprocessor.PaymentMethodFlaky)
	if err != nil || !again.Replayed || !bytes.Equal(again.Body, resumed.Body) {
		t.Errorf("client retry: %v, %v; want the resumed answer replayed", again, err)
	}
	if n := len(f.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

// pendingCharge leaves a charge pending behind a processor that keeps
// failing pm_card_flaky, and returns it.
func (f *fixture) pendingCharge(t *testing.T, key string) dbsqlc.Charge {
	t.Helper()
	o := f.order(t, "acme", 900)
	if _, err := f.charge(t, "acme", key, o.ID, fakeprocessor.PaymentMethodFlaky); !idempotency.IsRetryable(err) {
		t.Fatalf("charge under %q: %v; want a retryable failure", key, err)
	}
	ch := f.chargeOf(t, key)
	if charges.Status(ch.Status) != charges.StatusPending {
		t.Fatalf("charge under %q is %s; want pending", key, ch.Status)
	}
	return ch
}

func (f *fixture) getCharge(t *testing.T, id string) dbsqlc.Charge {
	t.Helper()
	ch, err := queries.GetCharge(context.Background(), f.pool, dbsqlc.GetChargeParams{CallerID: "acme", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func isProblem(err error, code problem.Code) bool {
	var p *problem.Error
	return errors.As(err, &p) && p.Code == code
}

func wantContradiction(t *testing.T, err error, ch dbsqlc.Charge, recorded, reported string) {
	t.Helper()
	var c *events.ContradictionError
	if !errors.As(err, &c) {
		t.Fatalf("got %v; want an *events.ContradictionError", err)
	}
	if c.Object != "charge" || c.ID != ch.ID || c.Recorded != recorded || c.Reported != reported {
		t.Errorf("contradiction %+v; want charge %s recorded %s, reported %s", c, ch.ID, recorded, reported)
	}
}

// A webhook's success is recorded once however often it is delivered (one
// charge.succeeded, one order.paid), and a later report of the opposite
// outcome is refused as a contradiction that writes nothing, even in a
// transaction that commits: money state never moves backwards on a report.
func TestApplyChargeOutcomeRecordsSuccessOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{FlakyFailures: 100}, 5*time.Second, nil)
	pending := f.pendingCharge(t, "webhook-success")
	succeeded := charges.Answer{Succeeded: true, ProcessorChargeID: "pch_from_webhook"}

	for i := range 2 {
		if known, err := f.applyOutcome(t, pending.DownstreamKey, succeeded); !known || err != nil {
			t.Fatalf("delivery %d: %v, %v; want the charge found and the outcome applied", i+1, known, err)
		}
	}
	ch := f.getCharge(t, pending.ID)
	if charges.Status(ch.Status) != charges.StatusSucceeded || ch.ProcessorChargeID == nil || *ch.ProcessorChargeID != "pch_from_webhook" {
		t.Fatalf("charge %s with processor id %v; want succeeded with pch_from_webhook", ch.Status, ch.ProcessorChargeID)
	}
	if got := f.orderStatus(t, ch.OrderID); got != orders.StatusPaid {
		t.Errorf("order is %s; want paid", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.succeeded", "order.paid"}) {
		t.Errorf("events %v after two deliveries; want one set: charge.succeeded, order.paid", got)
	}

	known, err := f.applyOutcome(t, pending.DownstreamKey, charges.Answer{ProcessorChargeID: "pch_from_webhook", DeclineCode: "card_declined"})
	if known {
		t.Errorf("a contradiction reported the outcome applied")
	}
	wantContradiction(t, err, pending, "succeeded", "failed")
	after := f.getCharge(t, pending.ID)
	if charges.Status(after.Status) != charges.StatusSucceeded || after.FailureCode != nil || !after.UpdatedAt.Equal(ch.UpdatedAt) {
		t.Errorf("after the contradiction the charge is %s (failure code %v, updated %v, was %v); want it untouched",
			after.Status, after.FailureCode, after.UpdatedAt, ch.UpdatedAt)
	}
	if got := f.orderStatus(t, ch.OrderID); got != orders.StatusPaid {
		t.Errorf("order is %s after the contradiction; want still paid", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.succeeded", "order.paid"}) {
		t.Errorf("events %v after the contradiction; want no new one", got)
	}

	// A report about a charge we never made is not ours: not found, no error.
	if known, err := f.applyOutcome(t, cardprocessor.DownstreamKey("acme", "unknown", nil, 0), succeeded); known || err != nil {
		t.Errorf("unknown downstream key: %v, %v; want false, nil", known, err)
	}
	// Nor is another caller's: globex cannot settle acme's charge.
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ev := events.ProcessorEvent{ID: "pevt_globex", Type: events.ProcessorChargeSucceeded, DownstreamKey: pending.DownstreamKey, ObjectID: succeeded.ProcessorChargeID}
	if known, err := charges.ApplyChargeEvent(ctx, tx, "globex", ev); known || err != nil {
		t.Errorf("another caller's downstream key: %v, %v; want false, nil", known, err)
	}
}

// A webhook's decline is recorded once (one charge.failed, with the generic
// code when the processor gave none) and leaves the order pending; a later
// report that the charge succeeded is a contradiction that neither pays the
// order nor writes an event.
func TestApplyChargeOutcomeRecordsDeclineOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{FlakyFailures: 100}, 5*time.Second, nil)
	pending := f.pendingCharge(t, "webhook-decline")
	declined := charges.Answer{ProcessorChargeID: "pch_declined"} // no decline code given

	for i := range 2 {
		if known, err := f.applyOutcome(t, pending.DownstreamKey, declined); !known || err != nil {
			t.Fatalf("delivery %d: %v, %v; want the outcome applied", i+1, known, err)
		}
	}
	ch := f.getCharge(t, pending.ID)
	if charges.Status(ch.Status) != charges.StatusFailed || ch.FailureCode == nil || *ch.FailureCode != "generic_decline" {
		t.Fatalf("charge %s with failure code %v; want failed with generic_decline", ch.Status, ch.FailureCode)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.failed"}) {
		t.Errorf("events %v after two deliveries; want one charge.failed", got)
	}

	known, err := f.applyOutcome(t, pending.DownstreamKey, charges.Answer{Succeeded: true, ProcessorChargeID: "pch_declined"})
	if known {
		t.Errorf("a contradiction reported the outcome applied")
	}
	wantContradiction(t, err, pending, "failed", "succeeded")
	if after := f.getCharge(t, pending.ID); charges.Status(after.Status) != charges.StatusFailed || !after.UpdatedAt.Equal(ch.UpdatedAt) {
		t.Errorf("after the contradiction the charge is %s; want failed, untouched", after.Status)
	}
	if got := f.orderStatus(t, ch.OrderID); got != orders.StatusPending {
		t.Errorf("order is %s after the contradiction; want pending (never paid on a contradicting report)", got)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.failed"}) {
		t.Errorf("events %v after the contradiction; want no new one", got)
	}
}

// When the processor's answer is lost (pm_card_timeout: the charge is
// made, the answer withheld past the client's timeout) and the webhook
// records the outcome first, the resumed operation finds it recorded: it
// stores a 201 rendered from the charge as the webhook left it, without a
// second effect or a second set of events.
func TestWebhookAndResumedChargeAgree(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{}, 2*time.Second, nil)
	o := f.order(t, "acme", 3100)

	if _, err := f.charge(t, "acme", "lost-answer", o.ID, fakeprocessor.PaymentMethodTimeout); !idempotency.IsRetryable(err) {
		t.Fatalf("first attempt: %v; want a retryable failure (the answer never came)", err)
	}
	pending := f.chargeOf(t, "lost-answer")
	made := f.effectsUnder(t, pending.DownstreamKey)
	if charges.Status(pending.Status) != charges.StatusPending || len(made) != 1 {
		t.Fatalf("charge %s with %d processor effects; want pending, with the one effect the processor made", pending.Status, len(made))
	}

	// The processor's webhook arrives first.
	if known, err := f.applyOutcome(t, pending.DownstreamKey, charges.Answer{Succeeded: true, ProcessorChargeID: made[0].ID}); !known || err != nil {
		t.Fatalf("webhook: %v, %v", known, err)
	}

	resp := f.resume(t, "lost-answer")
	ch := f.getCharge(t, pending.ID)
	want, err := f.created(t, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, want.Body) {
		t.Errorf("resumed answer %d %s; want 201 %s", resp.Status, resp.Body, want.Body)
	}
	if got := f.eventTypes(t, ch.ID); !slices.Equal(got, []string{"charge.succeeded", "order.paid"}) {
		t.Errorf("events %v; want one set", got)
	}
	if n := len(f.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1", n)
	}
}

// An order has at most one live charge, whatever the keys. A second key
// gets a stored 409 order_not_payable, replayed on retry, and never reaches
// the processor: after the first charge succeeded (the order is paid),
// while the first is still pending (the unique index decides, since the
// order is still pending then), and for a canceled order.
func TestSecondChargeOfAnOrderIsNotPayable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{FlakyFailures: 100}, 5*time.Second, nil)
	ctx := context.Background()

	paid := f.order(t, "acme", 100)
	if resp := f.mustCharge(t, "paid-first", paid.ID, fakeprocessor.PaymentMethodVisa); resp.Status != http.StatusCreated {
		t.Fatalf("first charge: %d %s", resp.Status, resp.Body)
	}
	inFlight := f.order(t, "acme", 200)
	if _, err := f.charge(t, "acme", "in-flight-first", inFlight.ID, fakeprocessor.PaymentMethodFlaky); !idempotency.IsRetryable(err) {
		t.Fatalf("first charge: %v; want it left pending", err)
	}
	canceled := f.order(t, "acme", 300)
	if _, err := orders.Cancel(ctx, f.pool, "acme", canceled.ID, charges.HasLiveCharge); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name      string
		order     orders.Order
		wantRows  int
		wantState orders.Status
	}{
		{"paid", paid, 1, orders.StatusPaid},
		{"in-flight", inFlight, 1, orders.StatusPending},
		{"canceled", canceled, 0, orders.StatusCanceled},
	} {
		key := c.name + "-second"
		resp := f.mustCharge(t, key, c.order.ID, fakeprocessor.PaymentMethodVisa)
		f.wantStoredProblem(t, key, resp, http.StatusConflict, charges.OrderNotPayable)
		if again := f.mustCharge(t, key, c.order.ID, fakeprocessor.PaymentMethodVisa); !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
			t.Errorf("%s: retry: replayed %v %s; want the stored 409", c.name, again.Replayed, again.Body)
		}
		if n := f.countCharges(t, c.order.ID); n != c.wantRows {
			t.Errorf("%s: %d charge rows; want %d (the second key created none)", c.name, n, c.wantRows)
		}
		if got := f.orderStatus(t, c.order.ID); got != c.wantState {
			t.Errorf("%s: order is %s; want %s", c.name, got, c.wantState)
		}
	}
	if n := len(f.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want 1 (the first charge only)", n)
	}
}

// Keys racing to charge one order: the order's lock and the unique index
// let exactly one through; every other gets order_not_payable, and the
// processor is asked once.
func TestRacingKeysChargeAnOrderOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{}, 5*time.Second, nil)
	o := f.order(t, "acme", 5000)
	const n = 8
	resps := make([]*idempotency.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resps[i], errs[i] = f.charge(t, "acme", fmt.Sprintf("racer-%d", i), o.ID, fakeprocessor.PaymentMethodVisa)
		})
	}
	wg.Wait()
	created := 0
	for i := range n {
		key := fmt.Sprintf("racer-%d", i)
		if errs[i] != nil {
			t.Fatalf("%s: %v", key, errs[i])
		}
		if resps[i].Status == http.StatusCreated {
			created++
			continue
		}
		f.wantStoredProblem(t, key, resps[i], http.StatusConflict, charges.OrderNotPayable)
	}
	if created != 1 {
		t.Errorf("%d racers charged the order; want exactly 1", created)
	}
	if rows := f.countCharges(t, o.ID); rows != 1 {
		t.Errorf("%d charge rows; want 1", rows)
	}
	if effects := len(f.effects(t)); effects != 1 {
		t.Errorf("%d processor effects; want 1", effects)
	}
}

// Callers are isolated: another caller's order is not found (a 404
// before the claim, so nothing stored, no charge row, no call), and so is
// another caller's charge.
func TestChargeOfAnotherCallersOrderIsNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fakeprocessor.Config{}, 5*time.Second, nil)
	ctx := context.Background()
	o := f.order(t, "acme", 700)

	if _, err := f.charge(t, "globex", "foreign", o.ID, fakeprocessor.PaymentMethodVisa); !isProblem(err, problem.NotFound) {
		t.Fatalf("globex charging acme's order: %v; want not_found", err)
	}
	if _, err := f.store.Get(ctx, "globex", "foreign"); !isProblem(err, problem.NotFound) {
		t.Errorf("globex's record: %v; want none: the key stays free", err)
	}
	if n := f.countCharges(t, o.ID); n != 0 {
		t.Errorf("%d charge rows; want none", n)
	}
	if n := len(f.effects(t)); n != 0 {
		t.Errorf("%d processor effects; want none", n)
	}

	f.mustCharge(t, "own", o.ID, fakeprocessor.PaymentMethodVisa)
	ch := f.chargeOf(t, "own")
	if _, err := charges.Get(ctx, f.pool, "globex", ch.ID); !isProblem(err, problem.NotFound) {
		t.Errorf("globex reading acme's charge: %v; want not_found", err)
	}
	if got, err := charges.Get(ctx, f.pool, "acme", ch.ID); err != nil || got.ID != ch.ID {
		t.Errorf("acme reading its charge: %v", err)
	}
}

// created is the response a charge's final phase stores: what the API
// would answer for the charge id now.
func (f *fixture) created(t *testing.T, id string) (*idempotency.Response, error) {
	t.Helper()
	ch, err := charges.Get(context.Background(), f.pool, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return ch.Created()
}

// explainer is a dbsqlc.DBTX whose QueryRow plans the statement (EXPLAIN,
// which runs nothing) and keeps the plan. It runs nothing else.
type explainer struct {
	*pgxpool.Pool
	plan string
	err  error
}

func (e *explainer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("explainer: only QueryRow is planned")
}

func (e *explainer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	e.err = e.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&e.plan)
	return e.Pool.QueryRow(ctx, "SELECT WHERE false") // no row: the statement did not run
}

// The statements that move a charge find it by its primary key, even
// before PostgreSQL has statistics on the table (a new database, or one
// just emptied). They imply the predicate of charges_one_live_per_order,
// and when that index led with caller_id they were planned on it: each
// scanned every live charge of the merchant, so each charge cost more than
// the one before (docs/performance.md).
func TestChargeUpdatesUseThePrimaryKeyWithoutStatistics(t *testing.T) {
	ctx := context.Background()
	pool := testdb.NewPool(t)
	if err := auth.SeedDemoCallers(ctx, pool); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `
		ALTER TABLE charges SET (autovacuum_enabled = off); -- so that no ANALYZE gives it statistics
		INSERT INTO orders (caller_id, id, amount, currency) SELECT 'acme', 'ord_' || n, 100, 'usd' FROM generate_series(1, 5000) n;
		INSERT INTO charges (caller_id, id, order_id, idempotency_key_id, amount, currency, payment_method, downstream_key, status)
		SELECT 'acme', 'ch_' || n, 'ord_' || n, n, 100, 'usd', 'pm_card_visa', 'dk_' || n, 'succeeded' FROM generate_series(1, 5000) n`)
	if err != nil {
		t.Fatal(err)
	}
	e := &explainer{Pool: pool}
	code := "generic_decline"
	for name, plan := range map[string]func(){
		"SucceedCharge": func() { queries.SucceedCharge(ctx, e, dbsqlc.SucceedChargeParams{CallerID: "acme", ID: "ch_42"}) },
		"FailCharge":    func() { queries.FailCharge(ctx, e, dbsqlc.FailChargeParams{CallerID: "acme", ID: "ch_42", FailureCode: &code}) },
		"ReserveRefund": func() { queries.ReserveRefund(ctx, e, dbsqlc.ReserveRefundParams{CallerID: "acme", ID: "ch_42", Amount: 1}) },
	} {
		e.plan, e.err = "", nil
		plan()
		if e.err != nil || !strings.Contains(e.plan, `"Index Name": "charges_pkey"`) {
			t.Errorf("%s is not planned on the primary key (%v):\n%s", name, e.err, e.plan)
		}
	}
}
