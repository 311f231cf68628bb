package fakeprocessor_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// clock is a settable time for the fake's Config.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func payoutBody(amount int, destination string) string {
	b, _ := json.Marshal(fakeprocessor.CreatePayoutRequest{Amount: int64(amount), Currency: "usd", Destination: destination})
	return string(b)
}

func (f *fake) getPayout(t *testing.T, id string) fakeprocessor.Payout {
	t.Helper()
	res, err := f.do(t, http.DefaultClient, http.MethodGet, "/v1/payouts/"+id, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var po fakeprocessor.Payout
	decodeInto(t, res, http.StatusOK, &po)
	return po
}

// A payout is one transfer per key: in transit when accepted, then paid
// (or failed, to a closed account) once its delay has passed; replays of
// the key answer the first answer, byte for byte.
func TestPayoutIsOneTransferThatArrivesLater(t *testing.T) {
	t.Parallel()
	// The delay is an hour of the fake's clock, which the test moves: the
	// transfer arrives when the test says, not while it is looking.
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	f := newFake(t, fakeprocessor.Config{Now: clk.Now, PayoutDelay: time.Hour})

	first := f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, fakeprocessor.DestinationOK))
	var po fakeprocessor.Payout
	decodeInto(t, first, http.StatusCreated, &po)
	if po.Status != fakeprocessor.PayoutInTransit || po.ArrivalDate != clk.Now().Add(time.Hour).Unix() {
		t.Fatalf("accepted payout %+v", po)
	}
	wantReplay(t, first, f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, fakeprocessor.DestinationOK)))
	if got := f.getPayout(t, po.ID); got.Status != fakeprocessor.PayoutInTransit {
		t.Errorf("before arrival: %s", got.Status)
	}
	closed := f.post(t, "/v1/payouts", "po-closed", payoutBody(700, fakeprocessor.DestinationClosed))
	var cpo fakeprocessor.Payout
	decodeInto(t, closed, http.StatusCreated, &cpo)

	clk.Add(time.Hour)
	if got := f.getPayout(t, po.ID); got.Status != fakeprocessor.PayoutPaid || got.FailureCode != nil {
		t.Errorf("after arrival: %+v; want paid", got)
	}
	if got := f.getPayout(t, cpo.ID); got.Status != fakeprocessor.PayoutFailed || got.FailureCode == nil || *got.FailureCode != fakeprocessor.FailureAccountClosed {
		t.Errorf("to a closed account: %+v; want failed, account_closed", got)
	}
	// The answer to the key stays the first one: the payout as accepted.
	wantReplay(t, first, f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, fakeprocessor.DestinationOK)))
	ledger := f.ledger(t, "po-ok")
	if len(ledger) != 1 || ledger[0].Object != fakeprocessor.ObjectPayout || ledger[0].Status != fakeprocessor.PayoutPaid {
		t.Fatalf("ledger for po-ok: %+v; want one paid payout", ledger)
	}
	if l := f.ledger(t, "po-closed"); len(l) != 1 || l[0].Status != fakeprocessor.PayoutFailed || l[0].FailureCode != fakeprocessor.FailureAccountClosed {
		t.Fatalf("ledger for po-closed: %+v", l)
	}
}

func TestFlakyDestinationRefusesTheFirstAttempts(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{PayoutDelay: time.Hour})
	body := payoutBody(100, fakeprocessor.DestinationFlaky)
	for range 2 {
		wantError(t, f.post(t, "/v1/payouts", "po-flaky", body), http.StatusServiceUnavailable, fakeprocessor.CodeProcessorUnavailable)
	}
	if l := f.ledger(t, "po-flaky"); len(l) != 0 {
		t.Fatalf("refused attempts moved money: %+v", l)
	}
	var po fakeprocessor.Payout
	decodeInto(t, f.post(t, "/v1/payouts", "po-flaky", body), http.StatusCreated, &po)
	if l := f.ledger(t, "po-flaky"); len(l) != 1 {
		t.Fatalf("ledger: %+v", l)
	}
}

func TestInvalidPayoutsStoreNothing(t *testing.T) {
	t.Parallel()
	f := newFake(t, fakeprocessor.Config{})
	wantError(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(100, "ba_nowhere")), http.StatusBadRequest, fakeprocessor.CodeDestinationUnknown)
	wantError(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(0, fakeprocessor.DestinationOK)), http.StatusBadRequest, fakeprocessor.CodeParameterInvalid)
	wantError(t, f.post(t, "/v1/payouts", "", payoutBody(100, fakeprocessor.DestinationOK)), http.StatusBadRequest, fakeprocessor.CodeIdempotencyKeyMissing)
	if l := f.ledger(t, ""); len(l) != 0 {
		t.Fatalf("ledger after invalid payouts: %+v", l)
	}
	// The key stored nothing: a corrected request with it is a new payout.
	decodeInto(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(100, fakeprocessor.DestinationOK)), http.StatusCreated, &fakeprocessor.Payout{})
	res, err := f.do(t, http.DefaultClient, http.MethodGet, "/v1/payouts/ppo_nosuch", "", "")
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, res, http.StatusNotFound, fakeprocessor.CodeResourceMissing)
}
