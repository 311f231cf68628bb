package fakeprocessor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

func TestChargeSameKeyIsOneEffectAndByteIdenticalReplay(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})

	first := f.post(t, "/v1/charges", "key-1", `{"amount":1999,"currency":"usd","payment_method":"pm_card_visa","metadata":{"order":"ord_1","b":"2"}}`)
	var ch fakeprocessor.Charge
	decodeInto(t, first, http.StatusCreated, &ch)
	if ch.Status != fakeprocessor.StatusSucceeded || ch.DeclineCode != nil || ch.Amount != 1999 || ch.IdempotencyKey != "key-1" || ch.Object != "charge" {
		t.Fatalf("charge: %+v", ch)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Error("a first answer is marked as a replay")
	}

	// The same request with its keys re-ordered and other whitespace is the
	// same request: the stored answer, byte for byte.
	again := f.post(t, "/v1/charges", "key-1", `{ "payment_method":"pm_card_visa", "metadata":{"b":"2","order":"ord_1"}, "currency":"usd", "amount":1999 }`)
	wantReplay(t, first, again)

	// The same key with another request is refused, never answered with
	// the first request's result.
	wantError(t, f.post(t, "/v1/charges", "key-1", chargeBody(2000, fakeprocessor.PaymentMethodVisa)), http.StatusUnprocessableEntity, fakeprocessor.CodeIdempotencyKeyReused)

	if got := f.ledger(t, "key-1"); len(got) != 1 || got[0].ID != ch.ID || got[0].PaymentMethod != fakeprocessor.PaymentMethodVisa {
		t.Fatalf("ledger for key-1: %+v; want the one charge %s", got, ch.ID)
	}

	// Keys are scoped per endpoint: a refund may use the charge's key.
	var re fakeprocessor.Refund
	decodeInto(t, f.post(t, "/v1/refunds", "key-1", fmt.Sprintf(`{"charge":%q,"amount":500}`, ch.ID)), http.StatusCreated, &re)
	if re.Charge != ch.ID || re.Amount != 500 || re.Currency != "usd" || re.Status != fakeprocessor.StatusSucceeded {
		t.Fatalf("refund: %+v", re)
	}
	if got := f.ledger(t, "key-1"); len(got) != 2 || got[1].Object != fakeprocessor.ObjectRefund || got[1].Charge != ch.ID {
		t.Fatalf("ledger for key-1 after the refund: %+v", got)
	}
	if got := f.ledger(t, ""); len(got) != 2 {
		t.Fatalf("whole ledger: %+v", got)
	}
}

// A key's answer is kept for the retention window, counted from when it
// was stored: the same request just inside it is a replay, and just after
// it a new request, with an effect of its own.
func TestKeyIsForgottenAfterTheRetentionWindow(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	f := newFake(t, fakeprocessor.Config{KeyRetention: time.Hour, Now: clock})
	body := chargeBody(1999, fakeprocessor.PaymentMethodVisa)

	first := f.post(t, "/v1/charges", "key-1", body)
	advance(time.Hour - time.Second)
	wantReplay(t, first, f.post(t, "/v1/charges", "key-1", body))
	advance(time.Second)
	later := f.post(t, "/v1/charges", "key-1", body)
	if later.status != http.StatusCreated || later.header.Get("Idempotent-Replayed") != "" || bytes.Equal(later.body, first.body) {
		t.Fatalf("after the window: %d %s (replayed %q); want a new charge", later.status, later.body, later.header.Get("Idempotent-Replayed"))
	}
	if got := f.ledger(t, "key-1"); len(got) != 2 {
		t.Fatalf("ledger for key-1: %+v; want two charges, one per window", got)
	}
	// And the new answer is the one replayed from now on.
	wantReplay(t, later, f.post(t, "/v1/charges", "key-1", body))
}

func TestInvalidRequestsStoreNothing(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	visa := chargeBody(100, fakeprocessor.PaymentMethodVisa)

	wantError(t, f.post(t, "/v1/charges", "", visa), http.StatusBadRequest, fakeprocessor.CodeIdempotencyKeyMissing)
	res, err := f.do(t, http.DefaultClient, http.MethodPost, "/v1/refunds", "", `{"charge":"pch_x","amount":1}`)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, res, http.StatusBadRequest, fakeprocessor.CodeIdempotencyKeyMissing)

	for name, body := range map[string]string{
		"zero amount":      chargeBody(0, fakeprocessor.PaymentMethodVisa),
		"negative amount":  chargeBody(-5, fakeprocessor.PaymentMethodVisa),
		"fractional":       `{"amount":1.5,"currency":"usd","payment_method":"pm_card_visa"}`,
		"currency":         `{"amount":100,"currency":"USD","payment_method":"pm_card_visa"}`,
		"unknown field":    `{"amount":100,"currency":"usd","payment_method":"pm_card_visa","card_number":"4242424242424242"}`,
		"not JSON":         `amount=100`,
		"trailing data":    visa + `{}`,
		"unknown pm":       chargeBody(100, "pm_card_amex"),
		"no payment metho": `{"amount":100,"currency":"usd"}`,
	} {
		res := f.post(t, "/v1/charges", "key-bad", body)
		if res.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400: %s", name, res.status, res.body)
		}
	}
	wantError(t, f.post(t, "/v1/charges", "key-bad", `{"amount":`+strings.Repeat("1", 70<<10)+`}`), http.StatusRequestEntityTooLarge, fakeprocessor.CodeBodyTooLarge)
	wantError(t, f.post(t, "/v1/refunds", "key-bad", `{"amount":1}`), http.StatusBadRequest, fakeprocessor.CodeParameterInvalid)

	// None of that was stored: the corrected request with the same key is
	// executed, not refused as a reuse.
	var ch fakeprocessor.Charge
	decodeInto(t, f.post(t, "/v1/charges", "key-bad", visa), http.StatusCreated, &ch)
	if n := len(f.ledger(t, "")); n != 1 {
		t.Fatalf("ledger has %d entries, want 1", n)
	}
}

func TestConcurrentSameKeyRequestsMakeOneEffect(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	body := chargeBody(4200, fakeprocessor.PaymentMethodMastercard)

	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		answers [n]response
		errs    [n]error
	)
	for i := range n {
		wg.Go(func() {
			<-start // release them together, to maximise the overlap
			answers[i], errs[i] = f.do(t, http.DefaultClient, http.MethodPost, "/v1/charges", "same-key", body)
		})
	}
	close(start)
	wg.Wait()

	// Every request waited for the one that executed and got its answer.
	replays := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if answers[i].status != http.StatusCreated || string(answers[i].body) != string(answers[0].body) {
			t.Fatalf("request %d: %d %s; want 201 %s", i, answers[i].status, answers[i].body, answers[0].body)
		}
		if answers[i].header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != n-1 {
		t.Errorf("%d replays, want %d", replays, n-1)
	}
	if got := f.ledger(t, "same-key"); len(got) != 1 {
		t.Fatalf("ledger: %d entries for one key, want 1: %+v", len(got), got)
	}
}

func TestDeclineIsAnEffectStoredAndReplayed(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	for pm, code := range map[string]string{
		fakeprocessor.PaymentMethodChargeDeclined:    fakeprocessor.DeclineGeneric,
		fakeprocessor.PaymentMethodInsufficientFunds: fakeprocessor.DeclineInsufficientFunds,
	} {
		key := "decline-" + pm
		first := f.post(t, "/v1/charges", key, chargeBody(700, pm))
		e := wantError(t, first, http.StatusPaymentRequired, fakeprocessor.CodeCardDeclined)
		if e.DeclineCode != code || e.Type != fakeprocessor.ErrorTypeCard || e.Charge == "" {
			t.Fatalf("%s: %+v", pm, e)
		}
		wantReplay(t, first, f.post(t, "/v1/charges", key, chargeBody(700, pm)))

		got := f.ledger(t, key)
		if len(got) != 1 || got[0].ID != e.Charge || got[0].Status != fakeprocessor.StatusFailed || got[0].DeclineCode != code {
			t.Fatalf("%s: ledger %+v", pm, got)
		}
		// A failed charge has nothing to refund.
		wantError(t, f.post(t, "/v1/refunds", key, fmt.Sprintf(`{"charge":%q,"amount":1}`, e.Charge)), http.StatusBadRequest, fakeprocessor.CodeChargeNotRefundable)
	}
}

func TestFlakyFailsTheFirstAttemptsThenSucceedsOnce(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{FlakyFailures: 3})
	body := chargeBody(300, fakeprocessor.PaymentMethodFlaky)
	for i := range 3 {
		wantError(t, f.post(t, "/v1/charges", "flaky", body), http.StatusServiceUnavailable, fakeprocessor.CodeProcessorUnavailable)
		if got := f.ledger(t, "flaky"); len(got) != 0 {
			t.Fatalf("after failed attempt %d the ledger has %+v", i+1, got)
		}
	}
	first := f.post(t, "/v1/charges", "flaky", body)
	var ch fakeprocessor.Charge
	decodeInto(t, first, http.StatusCreated, &ch)
	wantReplay(t, first, f.post(t, "/v1/charges", "flaky", body))
	if got := f.ledger(t, "flaky"); len(got) != 1 {
		t.Fatalf("ledger: %+v", got)
	}

	// The count is per key: another key fails from the start again, with
	// the default of 2.
	g := newFake(t, fakeprocessor.Config{})
	for range 2 {
		wantError(t, g.post(t, "/v1/charges", "flaky-2", body), http.StatusServiceUnavailable, fakeprocessor.CodeProcessorUnavailable)
	}
	decodeInto(t, g.post(t, "/v1/charges", "flaky-2", body), http.StatusCreated, &ch)
}

func TestRateLimitedAnswers429WithRetryAfterThenSucceeds(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	body := chargeBody(300, fakeprocessor.PaymentMethodRateLimited)
	res := f.post(t, "/v1/charges", "rl", body)
	wantError(t, res, http.StatusTooManyRequests, fakeprocessor.CodeRateLimited)
	if got := res.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	if got := f.ledger(t, "rl"); len(got) != 0 {
		t.Fatalf("a 429 had an effect: %+v", got)
	}
	var ch fakeprocessor.Charge
	decodeInto(t, f.post(t, "/v1/charges", "rl", body), http.StatusCreated, &ch)
	if got := f.ledger(t, "rl"); len(got) != 1 {
		t.Fatalf("ledger: %+v", got)
	}
}

func TestLostResponseChargesButDropsTheConnection(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	body := chargeBody(900, fakeprocessor.PaymentMethodLostResponse)

	// A fresh transport: Go's transport silently retries a request that
	// carries an Idempotency-Key when a *reused* connection closes before
	// any answer, which would hide the lost response from this test.
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	res, err := f.do(t, client, http.MethodPost, "/v1/charges", "lost", body)
	if err == nil {
		t.Fatalf("got an answer (%d %s); want a connection error", res.status, res.body)
	}

	got := f.ledger(t, "lost")
	if len(got) != 1 || got[0].Status != fakeprocessor.StatusSucceeded {
		t.Fatalf("ledger: %+v; want the charge made before the connection dropped", got)
	}
	retry := f.post(t, "/v1/charges", "lost", body)
	var ch fakeprocessor.Charge
	decodeInto(t, retry, http.StatusCreated, &ch)
	if ch.ID != got[0].ID || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %+v; want the replayed charge %s", ch, got[0].ID)
	}
	if n := len(f.ledger(t, "lost")); n != 1 {
		t.Fatalf("ledger has %d entries after the retry", n)
	}
}

func TestTimeoutChargesButWithholdsTheAnswer(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		pm    string
		chaos fakeprocessor.Chaos
	}{
		"pm_card_timeout":  {pm: fakeprocessor.PaymentMethodTimeout},
		"chaos timeout":    {pm: fakeprocessor.PaymentMethodVisa, chaos: fakeprocessor.Chaos{TimeoutRate: 1}},
		"chaos on decline": {pm: fakeprocessor.PaymentMethodChargeDeclined, chaos: fakeprocessor.Chaos{TimeoutRate: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// TimeoutHold stays at its 30s default: the client gives up
			// long before.
			f := newFake(t, fakeprocessor.Config{Chaos: c.chaos})
			body := chargeBody(1200, c.pm)

			client := &http.Client{Timeout: time.Second}
			_, err := f.do(t, client, http.MethodPost, "/v1/charges", "slow", body)
			var netErr net.Error
			if !errors.As(err, &netErr) || !netErr.Timeout() {
				t.Fatalf("err = %v; want a client timeout", err)
			}
			got := f.ledger(t, "slow")
			if len(got) != 1 {
				t.Fatalf("ledger: %+v; want the charge made before the answer was withheld", got)
			}
			// The retry is answered at once from the stored answer
			// (the client would time out otherwise).
			retry, err := f.do(t, client, http.MethodPost, "/v1/charges", "slow", body)
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			if retry.header.Get("Idempotent-Replayed") != "true" || retry.status >= 500 {
				t.Fatalf("retry: %d %s", retry.status, retry.body)
			}
			if n := len(f.ledger(t, "slow")); n != 1 {
				t.Fatalf("ledger has %d entries after the retry", n)
			}
		})
	}
}

func TestWithheldAnswerIsSentAfterTimeoutHold(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{TimeoutHold: time.Millisecond})
	var ch fakeprocessor.Charge
	decodeInto(t, f.post(t, "/v1/charges", "late", chargeBody(5, fakeprocessor.PaymentMethodTimeout)), http.StatusCreated, &ch)
}

func TestConcurrentRefundsNeverExceedTheCharge(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	var ch fakeprocessor.Charge
	decodeInto(t, f.post(t, "/v1/charges", "to-refund", chargeBody(1000, fakeprocessor.PaymentMethodVisa)), http.StatusCreated, &ch)
	refund := fmt.Sprintf(`{"charge":%q,"amount":300}`, ch.ID)

	const n = 10
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		status [n]int
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := f.do(t, http.DefaultClient, http.MethodPost, "/v1/refunds", fmt.Sprintf("refund-%d", i), refund)
			if err != nil {
				t.Error(err)
				return
			}
			status[i] = res.status
			if res.status != http.StatusCreated {
				wantError(t, res, http.StatusBadRequest, fakeprocessor.CodeAmountTooLarge)
			}
		})
	}
	close(start)
	wg.Wait()

	succeeded := 0
	for _, s := range status {
		if s == http.StatusCreated {
			succeeded++
		}
	}
	var refunded int64
	for _, e := range f.ledger(t, "") {
		if e.Object == fakeprocessor.ObjectRefund {
			refunded += e.Amount
		}
	}
	if succeeded != 3 || refunded != 900 {
		t.Fatalf("%d refunds of 300 succeeded, %d refunded in the ledger; want 3 and 900", succeeded, refunded)
	}

	// A refused refund stored nothing: its key works for the 100 left.
	failedKey := ""
	for i, s := range status {
		if s != http.StatusCreated {
			failedKey = fmt.Sprintf("refund-%d", i)
			break
		}
	}
	decodeInto(t, f.post(t, "/v1/refunds", failedKey, fmt.Sprintf(`{"charge":%q,"amount":100}`, ch.ID)), http.StatusCreated, new(fakeprocessor.Refund))
	wantError(t, f.post(t, "/v1/refunds", "one-more", fmt.Sprintf(`{"charge":%q,"amount":1}`, ch.ID)), http.StatusBadRequest, fakeprocessor.CodeAmountTooLarge)
	wantError(t, f.post(t, "/v1/refunds", "nothing", `{"charge":"pch_nope","amount":1}`), http.StatusNotFound, fakeprocessor.CodeResourceMissing)
}

func TestAdminChaosRoundTrips(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	get := func() fakeprocessor.Chaos {
		t.Helper()
		res, err := f.do(t, http.DefaultClient, http.MethodGet, "/admin/chaos", "", "")
		if err != nil {
			t.Fatal(err)
		}
		var c fakeprocessor.Chaos
		decodeInto(t, res, http.StatusOK, &c)
		return c
	}
	put := func(body string) response {
		t.Helper()
		res, err := f.do(t, http.DefaultClient, http.MethodPut, "/admin/chaos", "", body)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if c := get(); c != (fakeprocessor.Chaos{}) {
		t.Fatalf("initial chaos %+v, want none", c)
	}
	want := fakeprocessor.Chaos{LatencyMS: 5, ErrorRate: 0.25, TimeoutRate: 0.5, DuplicateWebhookRate: 1}
	b, _ := json.Marshal(want)
	var echoed fakeprocessor.Chaos
	decodeInto(t, put(string(b)), http.StatusOK, &echoed)
	if echoed != want || get() != want || f.Chaos() != want {
		t.Fatalf("after PUT %+v: echoed %+v, GET %+v", want, echoed, get())
	}
	for _, bad := range []string{`{"error_rate":2}`, `{"timeout_rate":-0.1}`, `{"latency_ms":-1}`, `{"error_rat":0.5}`, `nope`} {
		wantErr := put(bad)
		if wantErr.status != http.StatusBadRequest {
			t.Errorf("PUT %s: %d, want 400", bad, wantErr.status)
		}
	}
	if get() != want {
		t.Fatal("a refused PUT changed the settings")
	}

	// error_rate 1: every call is a 503 before any effect.
	decodeInto(t, put(`{"error_rate":1}`), http.StatusOK, &echoed)
	body := chargeBody(100, fakeprocessor.PaymentMethodVisa)
	wantError(t, f.post(t, "/v1/charges", "chaos", body), http.StatusServiceUnavailable, fakeprocessor.CodeProcessorUnavailable)
	if got := f.ledger(t, ""); len(got) != 0 {
		t.Fatalf("an injected 503 had an effect: %+v", got)
	}
	decodeInto(t, put(`{}`), http.StatusOK, &echoed)
	decodeInto(t, f.post(t, "/v1/charges", "chaos", body), http.StatusCreated, new(fakeprocessor.Charge))
}

func TestChaosLatencyIsAddedAndRespectsTheClient(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{Chaos: fakeprocessor.Chaos{LatencyMS: 60_000}})
	// The client gives up long before the latency passes; nothing happens.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/charges", nil)
	req.Header.Set("Idempotency-Key", "slowly")
	req.Body = http.NoBody
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the client's deadline", err)
	}
	if err := f.SetChaos(fakeprocessor.Chaos{LatencyMS: 50}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	f.ledger(t, "")
	if d := time.Since(began); d < 50*time.Millisecond {
		t.Fatalf("answered in %s with 50ms of latency", d)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []fakeprocessor.Config{
		{WebhookURL: "not a url"},
		{WebhookURL: "ftp://example.com/hook"},
		{Chaos: fakeprocessor.Chaos{ErrorRate: 1.5}},
		{FlakyFailures: -1},
		{TimeoutHold: -time.Second},
	} {
		if _, err := fakeprocessor.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := fakeprocessor.LoadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg.WebhookSecret) != fakeprocessor.DefaultWebhookSecret || cfg.WebhookURL != "" || cfg.Chaos != (fakeprocessor.Chaos{}) {
		t.Fatalf("defaults: %+v", cfg)
	}
	cfg, err = fakeprocessor.LoadConfig(env(map[string]string{
		"WEBHOOK_URL": "http://127.0.0.1:8080/webhooks/processor", "WEBHOOK_SECRET": "whsec_x",
		"PROCESSOR_FLAKY_FAILURES": "4", "PROCESSOR_TIMEOUT_HOLD": "2s", "PROCESSOR_KEY_RETENTION": "1h", "CHAOS_LATENCY_MS": "10",
		"CHAOS_ERROR_RATE": "0.1", "CHAOS_TIMEOUT_RATE": "0.2", "CHAOS_DUPLICATE_WEBHOOK_RATE": "1", "CHAOS_SEED": "7",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FlakyFailures != 4 || cfg.TimeoutHold != 2*time.Second || cfg.KeyRetention != time.Hour || cfg.Rand == nil ||
		cfg.Chaos != (fakeprocessor.Chaos{LatencyMS: 10, ErrorRate: 0.1, TimeoutRate: 0.2, DuplicateWebhookRate: 1}) {
		t.Fatalf("loaded: %+v", cfg)
	}
	_, err = fakeprocessor.LoadConfig(env(map[string]string{
		"CHAOS_ERROR_RATE": "lots", "PROCESSOR_TIMEOUT_HOLD": "forever", "CHAOS_SEED": "-1", "PROCESSOR_FLAKY_FAILURES": "0",
		"PROCESSOR_KEY_RETENTION": "0s",
	}))
	for _, name := range []string{"CHAOS_ERROR_RATE", "PROCESSOR_TIMEOUT_HOLD", "CHAOS_SEED", "PROCESSOR_FLAKY_FAILURES", "PROCESSOR_KEY_RETENTION"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
}

// The key is released before an answer is withheld, so a retry made while
// the first attempt's answer is still held is answered at once: the
// payments server's retry after its own timeout never waits for the hold.
func TestRetryDuringAWithheldAnswerIsReplayedAtOnce(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	body := chargeBody(250, fakeprocessor.PaymentMethodTimeout)

	ctx, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/charges", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "held")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		first <- err
	}()
	// Wait for the effect: from then on the answer is being withheld.
	for len(f.ledger(t, "held")) == 0 {
	}

	var ch fakeprocessor.Charge
	retry := f.post(t, "/v1/charges", "held", body)
	decodeInto(t, retry, http.StatusCreated, &ch)
	if retry.header.Get("Idempotent-Replayed") != "true" {
		t.Error("the retry was not a replay")
	}
	select {
	case err := <-first:
		t.Fatalf("the first attempt was answered (%v); its answer should still be withheld", err)
	default:
	}
	giveUp()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first attempt: %v; want the client's cancellation", err)
	}
}
