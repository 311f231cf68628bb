package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/sweeper"
)

// The tests in this file walk the idempotency contract table of docs/design.md,
// one row at a time, through HTTP against a real database.

const teaOrder = `{"amount":1999,"currency":"usd","description":"Tea"}`

// Row: same key, completed → the stored response, byte for byte, with the
// allow-listed headers and Idempotent-Replayed: true.
func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)

	first := ts.createOrder(t, `"replay-1"`, teaOrder)
	if first.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.Status, first.Body)
	}
	if first.Header.Get("Idempotent-Replayed") != "" {
		t.Error("the first response is marked as a replay")
	}
	var o struct{ ID, Status, Currency, Description string }
	first.decode(t, &o)
	if !strings.HasPrefix(o.ID, "ord_") || o.Status != "pending" || first.Header.Get("Location") != "/v1/orders/"+o.ID {
		t.Fatalf("created order %+v with Location %q", o, first.Header.Get("Location"))
	}

	// The same logical request: bare key form, keys reordered, other spacing.
	again := ts.createOrder(t, `replay-1`, `{ "description": "Tea", "currency": "usd", "amount": 1999 }`)
	if again.Status != first.Status || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("replay: %d %s; want %d %s", again.Status, again.Body, first.Status, first.Body)
	}
	if again.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("replay lacks Idempotent-Replayed: true")
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if again.Header.Get(h) != first.Header.Get(h) {
			t.Errorf("replayed %s = %q; want %q", h, again.Header.Get(h), first.Header.Get(h))
		}
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}

	// Only allow-listed headers are stored.
	var stored map[string][]string
	if err := ts.db.QueryRow(context.Background(), `SELECT response_headers FROM idempotency_keys`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for name := range stored {
		if name != "Content-Type" && name != "Location" && name != "Content-Encoding" {
			t.Errorf("stored header %s is not on the allow-list", name)
		}
	}
}

// Row: key missing on a keyed operation → 400, not stored.
func TestKeyMissing(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme", body: teaOrder})
	res.wantProblem(t, http.StatusBadRequest, "idempotency_key_missing")
	if ts.count(t, "idempotency_keys")+ts.count(t, "orders") != 0 {
		t.Error("a request without a key changed something")
	}
}

// Row: key malformed (empty, too long, bad characters, repeated) → 400, not stored.
func TestKeyMalformed(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for name, lines := range map[string][]string{
		"empty sf-string":  {`""`},
		"too long":         {strings.Repeat("k", 256)},
		"too long quoted":  {`"` + strings.Repeat("k", 256) + `"`},
		"non-ASCII":        {"clé-1"},
		"tab inside":       {"a\tb"},
		"unterminated":     {`"abc`},
		"after the quotes": {`"abc"def`},
		"repeated lines":   {"k1", "k1"},
	} {
		t.Run(name, func(t *testing.T) {
			res := ts.do(t, request{method: "POST", path: "/v1/orders", apiKey: "sk_test_acme",
				header: http.Header{"Idempotency-Key": lines}, body: teaOrder})
			res.wantProblem(t, http.StatusBadRequest, "idempotency_key_invalid")
		})
	}
	if ts.count(t, "idempotency_keys")+ts.count(t, "orders") != 0 {
		t.Error("a request with a malformed key changed something")
	}
	// The longest valid key works.
	if res := ts.createOrder(t, strings.Repeat("k", 255), teaOrder); res.Status != http.StatusCreated {
		t.Errorf("255-character key: %d %s", res.Status, res.Body)
	}
}

// Row: request invalid → 400 with field details, not stored, so a corrected
// retry under the same key works.
func TestInvalidRequestIsNotStored(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	bad := ts.createOrder(t, "fix-me", `{"amount":0,"currency":"usd"}`)
	p := bad.wantProblem(t, http.StatusBadRequest, "invalid_request")
	errs, _ := p["errors"].([]any)
	if len(errs) != 1 || errs[0].(map[string]any)["field"] != "/amount" {
		t.Errorf("field errors %v; want one for /amount", p["errors"])
	}
	if n := ts.count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("an invalid request stored %d key records", n)
	}
	if good := ts.createOrder(t, "fix-me", teaOrder); good.Status != http.StatusCreated {
		t.Fatalf("corrected retry with the same key: %d %s; want 201", good.Status, good.Body)
	}
}

// Row: same key, different fingerprint → 422, never a silent success.
func TestKeyReusedForDifferentRequest(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	if res := ts.createOrder(t, "reuse", teaOrder); res.Status != http.StatusCreated {
		t.Fatal(res.Status)
	}
	for _, body := range []string{
		`{"amount":2000,"currency":"usd","description":"Tea"}`,
		`{"amount":1999,"currency":"usd"}`,
		`{"amount":1999,"currency":"eur","description":"Tea"}`,
	} {
		ts.createOrder(t, "reuse", body).wantProblem(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// Row: same key, first request still in progress (lease live) → 409 with
// Retry-After. The first request, a charge, is held inside its last phase
// by a table lock, so "in progress" is a fact, not a timing accident. (An
// order create is never seen in progress: it is one transaction, and a
// copy waits on the key's unique index; TestLocalDuplicateWaitsOnTheUniqueIndex.)
func TestInProgressIsConflict(t *testing.T) {
	t.Parallel()
	// A duplicate waits for the original up to IDEMPOTENCY_WAIT (see
	// TestDuplicateGetsTheOriginalsAnswer); with 0 it is answered at once.
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.IdempotencyWait = 0 }))
	o := ts.newOrder(t, "sk_test_acme", 1999)
	release := ts.blockInserts(t, "ledger_entries")

	firstDone := make(chan response, 1)
	firstErr := make(chan error, 1)
	go func() {
		res, err := ts.send(t, context.Background(), chargeRequest(o.ID, "slow", "pm_card_visa"))
		firstDone <- res
		firstErr <- err
	}()
	ts.waitForBlockedInserts(t, "ledger_entries", 1)

	dup := ts.do(t, chargeRequest(o.ID, "slow", "pm_card_visa"))
	dup.wantProblem(t, http.StatusConflict, "idempotency_key_in_use")
	// Retry-After is short: the owner renews its lease while it works, and
	// asking again in a second or two is when it is useful.
	if ra, err := strconv.Atoi(dup.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 2 {
		t.Errorf("Retry-After = %q; want 1 or 2 seconds", dup.Header.Get("Retry-After"))
	}
	// A different body under the in-progress key is still a misuse: 422.
	ts.do(t, chargeRequest(o.ID, "slow", "pm_card_chargeDeclined")).wantProblem(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	// The record says so too.
	var rec struct {
		Status      string     `json:"status"`
		LockedUntil *time.Time `json:"locked_until"`
	}
	ts.get(t, "/v1/idempotency-keys/slow").decode(t, &rec)
	if rec.Status != "in_progress" || rec.LockedUntil == nil {
		t.Errorf("record while in progress: %+v", rec)
	}

	release()
	first := <-firstDone
	if err := <-firstErr; err != nil {
		t.Fatal(err)
	}
	if first.Status != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Status, first.Body)
	}
	if replay := ts.do(t, chargeRequest(o.ID, "slow", "pm_card_visa")); !bytes.Equal(replay.Body, first.Body) || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after completion: %d %s; want the replay of %s", replay.Status, replay.Body, first.Body)
	}
}

// Row: same key, in progress but its lease expired (a crash) → take over and
// resume from the recovery point. For an order create that is a record an
// older version left: it claimed local operations too, and this one's
// owner died before its only phase committed. Nothing was done, so the
// retry deletes the record and creates the order.
func TestExpiredLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	doc, _ := idempotency.DecodeJSON([]byte(teaOrder))
	fp, err := idempotency.Fingerprint("POST", "/v1/orders", doc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.db.Exec(context.Background(), `
		INSERT INTO idempotency_keys (caller_id, key, operation, request_method, request_path, request_fingerprint, locked_until, created_at)
		VALUES ('acme', 'crashed', 'createOrder', 'POST', '/v1/orders', $1, now() - interval '1 second', now() - interval '1 minute')`, fp)
	if err != nil {
		t.Fatal(err)
	}

	res := ts.createOrder(t, "crashed", teaOrder)
	if res.Status != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the crash: %d %v %s; want a fresh 201", res.Status, res.Header, res.Body)
	}
	var rec struct {
		Status        string `json:"status"`
		RecoveryPoint string `json:"recovery_point"`
	}
	ts.get(t, "/v1/idempotency-keys/crashed").decode(t, &rec)
	if rec.Status != "completed" || rec.RecoveryPoint != "finished" {
		t.Errorf("record %+v; want completed at finished", rec)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want exactly 1", n)
	}
	if replay := ts.createOrder(t, "crashed", teaOrder); !bytes.Equal(replay.Body, res.Body) {
		t.Errorf("replay after takeover differs: %s vs %s", replay.Body, res.Body)
	}
}

// Row: an error after execution began is a final outcome: stored and
// replayed. A trigger makes the order insert fail with a non-transient
// error, as a bug or a violated invariant would.
func TestFinalErrorIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	_, err := ts.db.Exec(context.Background(), `
		CREATE FUNCTION explode() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.description = 'explode' THEN RAISE EXCEPTION 'boom'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER explode BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION explode();`)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount":5,"currency":"usd","description":"explode"}`
	first := ts.createOrder(t, "final", body)
	p := first.wantProblem(t, http.StatusInternalServerError, "internal_error")
	if strings.Contains(string(first.Body), "boom") {
		t.Errorf("the 500 leaks internals: %v", p)
	}
	again := ts.createOrder(t, "final", body)
	if again.Status != 500 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of a final error: %d %s; want the stored 500 replayed", again.Status, again.Body)
	}
	if n := ts.count(t, "orders"); n != 0 {
		t.Errorf("%d orders; want none", n)
	}
}

// A transient failure during execution is not final: 503 with Retry-After,
// nothing stored (an order create's record rolls back with its effect),
// and the retry under the same key runs it and succeeds once.
func TestTransientErrorIsNotStored(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ctx := context.Background()
	_, err := ts.db.Exec(ctx, `
		CREATE FUNCTION flaky() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'could not serialize' USING ERRCODE = 'serialization_failure';
		END $$;
		CREATE TRIGGER flaky BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION flaky();`)
	if err != nil {
		t.Fatal(err)
	}
	first := ts.createOrder(t, "transient", teaOrder)
	first.wantProblem(t, http.StatusServiceUnavailable, "service_unavailable")
	if first.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	// An order create is one transaction: it rolled back, record and all.
	if n := ts.count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("after a transient failure %d records are left; want none", n)
	}

	if _, err := ts.db.Exec(ctx, `DROP TRIGGER flaky ON orders`); err != nil {
		t.Fatal(err)
	}
	retry := ts.createOrder(t, "transient", teaOrder)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the failure cleared: %d %s; want a fresh 201", retry.Status, retry.Body)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// A connection lost in the middle of the effect (here: the database ends
// the server's session, as a failover or a restart would) is transient too:
// 503, nothing stored, and the retry creates the order once.
func TestLostDatabaseConnectionIsNotStored(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ctx := context.Background()
	release := ts.blockInserts(t, "orders")
	done := make(chan response, 1)
	sendErr := make(chan error, 1)
	go func() {
		res, err := ts.send(t, ctx, ordersRequest("blip", teaOrder))
		done <- res
		sendErr <- err
	}()
	ts.waitForBlockedInserts(t, "orders", 1)
	var terminated bool
	err := ts.db.QueryRow(ctx, `
		SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO orders%'`).Scan(&terminated)
	if err != nil || !terminated {
		t.Fatalf("terminate the server's session: %v", err)
	}
	release()
	res := <-done
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	res.wantProblem(t, http.StatusServiceUnavailable, "service_unavailable")
	if res.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if retry := ts.createOrder(t, "blip", teaOrder); retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the lost connection: %d %s; want a fresh 201", retry.Status, retry.Body)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// Row: same key after the retention window → a new operation (the old
// record is gone). The record is back-dated past the window and the real
// sweeper removes it. Back-dating moves only the database's clock, not the
// server's, so the replay cache is off here: with it, the answer would
// still be held for the hour the server believes has not passed.
// TestReplayCacheNeverOutlivesTheRecord (internal/idempotency) shows that
// a cached answer expires before its record can be swept.
func TestKeyAfterRetentionIsNewOperation(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.ReplayCacheSize = 0 }))
	first := ts.createOrder(t, "old", teaOrder)
	ts.expire(t, "old")
	second := ts.createOrder(t, "old", `{"amount":1,"currency":"eur"}`)
	if second.Status != http.StatusCreated || second.Header.Get("Idempotent-Replayed") != "" || bytes.Equal(first.Body, second.Body) {
		t.Fatalf("reused key after its record expired: %d %s", second.Status, second.Body)
	}
	if n := ts.count(t, "orders"); n != 2 {
		t.Errorf("%d orders; want 2", n)
	}
}

// expire back-dates the key's record past the retention window, and the
// real sweeper deletes it.
func (ts *testServer) expire(t *testing.T, key string) {
	t.Helper()
	if _, err := ts.db.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = now() - $2::interval WHERE key = $1`,
		key, ts.cfg.Retention+time.Hour); err != nil {
		t.Fatal(err)
	}
	sw, err := sweeper.New(sweeper.Config{KeyRetention: ts.cfg.Retention, EventRetention: ts.cfg.Retention, WebhookRetention: ts.cfg.Retention, Batch: 10}, ts.db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sw.Sweep(context.Background())
	if err != nil || r.Keys != 1 {
		t.Fatalf("sweep: %+v, %v; want the expired record deleted", r, err)
	}
}

// The same key with the same request after the retention window is a new
// operation too, with an effect of its own at the processor. Downstream
// keys are derived from the caller, the key and the request, which are
// the same here; the new operation finds the first one's key taken and
// takes the next generation (CreatePayout), so it neither
// collides with the old payout's row nor replays its transfer.
func TestSameRequestAfterRetentionIsANewEffect(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.ReplayCacheSize = 0 }))
	ts.fund(t, "sk_test_acme", 5000)
	body := `{"amount":1000,"currency":"usd","destination":"ba_test_ok"}`
	var first, second payout
	res := ts.do(t, payoutRequest("sk_test_acme", "weekly", body))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	res.decode(t, &first)
	ts.pollPayout(t, "sk_test_acme", "/v1/payouts/"+first.ID)
	ts.expire(t, "weekly")

	res = ts.do(t, payoutRequest("sk_test_acme", "weekly", body))
	if res.Status != http.StatusAccepted || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same payout after the window: %d %s; want a new 202", res.Status, res.Body)
	}
	res.decode(t, &second)
	if final, _ := ts.pollPayout(t, "sk_test_acme", "/v1/payouts/"+second.ID); second.ID == first.ID || final.Status != "paid" {
		t.Fatalf("second payout %+v, final %+v; want a new payout, paid", second, final)
	}
	firstKey, secondKey := ts.payoutDownstreamKey(t, first.ID), ts.payoutDownstreamKey(t, second.ID)
	if firstKey == secondKey {
		t.Fatalf("both payouts went to the processor under %s", firstKey)
	}
	transfers := ts.payoutTransfers(t)
	if len(transfers) != 2 || transfers[0].IdempotencyKey != firstKey || transfers[1].IdempotencyKey != secondKey {
		t.Fatalf("processor payouts %+v; want one under %s and one under %s", transfers, firstKey, secondKey)
	}
	if avail, pending := ts.usd(t, "sk_test_acme"); avail != 3000 || pending != 0 {
		t.Errorf("balance: available %d, pending %d; want 3000, 0", avail, pending)
	}
}

func TestIdempotencyKeyRecord(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withConfig(func(c *config.Server) { c.Retention = 36 * time.Hour }))
	key := `order 7/b "quoted" 100%`
	sfKey := `"order 7/b \"quoted\" 100%"`
	if res := ts.createOrder(t, sfKey, teaOrder); res.Status != http.StatusCreated {
		t.Fatal(res.Status, string(res.Body))
	}
	res := ts.get(t, "/v1/idempotency-keys/"+url.PathEscape(key))
	if res.Status != http.StatusOK {
		t.Fatalf("%d %s", res.Status, res.Body)
	}
	var rec struct {
		Key            string    `json:"key"`
		Status         string    `json:"status"`
		RecoveryPoint  string    `json:"recovery_point"`
		RequestMethod  string    `json:"request_method"`
		RequestPath    string    `json:"request_path"`
		Attempt        int       `json:"attempt"`
		ResponseStatus int       `json:"response_status"`
		CreatedAt      time.Time `json:"created_at"`
		ExpiresAt      time.Time `json:"expires_at"`
	}
	res.decode(t, &rec)
	var raw map[string]any
	res.decode(t, &raw)
	if rec.Key != key || rec.Status != "completed" || rec.RecoveryPoint != "finished" || rec.Attempt != 1 ||
		rec.RequestMethod != "POST" || rec.RequestPath != "/v1/orders" || rec.ResponseStatus != 201 {
		t.Errorf("record %+v", rec)
	}
	if raw["locked_until"] != nil {
		t.Errorf("completed record has locked_until %v", raw["locked_until"])
	}
	if got := rec.ExpiresAt.Sub(rec.CreatedAt); got != 36*time.Hour {
		t.Errorf("expires_at - created_at = %s; want the retention window, 36h", got)
	}
	for _, secret := range []string{"request_fingerprint", "response_body", "caller_id"} {
		if _, ok := raw[secret]; ok {
			t.Errorf("record exposes %s", secret)
		}
	}
	ts.get(t, "/v1/idempotency-keys/never-used").wantProblem(t, http.StatusNotFound, "not_found")
}

// A string that is not Unicode text (a lone surrogate escape, invalid
// UTF-8) is a 400 naming the member, and claims nothing: a decoder would
// read each as U+FFFD, and these four different bodies would share one
// fingerprint, the second replayed instead of refused with a 422.
func TestNotUnicodeIsRefused(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for _, description := range []string{`"\ud800"`, `"\udfff"`, `"\ud83d\u0041"`, "\"\xff\""} {
		res := ts.createOrder(t, "not-unicode", `{"amount":100,"currency":"usd","description":`+description+`}`)
		p := res.wantProblem(t, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(fmt.Sprint(p["errors"]), "/description") {
			t.Errorf("%s: %v; want the member named", description, p)
		}
	}
	if n := ts.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("%d records; want none", n)
	}
	// A surrogate pair is one character, and welcome.
	if res := ts.createOrder(t, "not-unicode", `{"amount":100,"currency":"usd","description":"\ud83d\ude00"}`); res.Status != http.StatusCreated {
		t.Errorf("a surrogate pair: %d %s", res.Status, res.Body)
	}
}

// TestLongestValidBodiesAreAccepted: a limit on the body's form never
// refuses what the contract allows. The longest description (500
// characters, four bytes each) is a valid order written raw and written
// as most JSON encoders write it by default (Python's json.dumps: an
// escaped surrogate pair per emoji, 6,000 bytes).
func TestLongestValidBodiesAreAccepted(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	for name, description := range map[string]string{
		"raw":     strings.Repeat("😀", 500),
		"escaped": strings.Repeat(`\ud83d\ude00`, 500),
	} {
		res := ts.createOrder(t, "longest-"+name, `{"amount":99999999,"currency":"usd","description":"`+description+`"}`)
		if res.Status != http.StatusCreated {
			t.Fatalf("%s: %d %s", name, res.Status, res.Body)
		}
		var o struct{ Description string }
		if err := json.Unmarshal(res.Body, &o); err != nil || o.Description != strings.Repeat("😀", 500) {
			t.Errorf("%s: description %q, %v; want 500 emoji", name, o.Description, err)
		}
	}
	// One more character is over the contract's maxLength: the schema's 400.
	res := ts.createOrder(t, "longest-over", `{"amount":100,"currency":"usd","description":"`+strings.Repeat(`\ud83d\ude00`, 501)+`"}`)
	res.wantProblem(t, http.StatusBadRequest, "invalid_request")
}
