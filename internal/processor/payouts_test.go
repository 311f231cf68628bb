package processor_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/processor"
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
	b, _ := json.Marshal(processor.CreatePayoutRequest{Amount: int64(amount), Currency: "usd", Destination: destination})
	return string(b)
}

func (f *fake) getPayout(t *testing.T, id string) processor.Payout {
	t.Helper()
	res, err := f.do(t, http.DefaultClient, http.MethodGet, "/v1/payouts/"+id, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var po processor.Payout
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
	f := newFake(t, processor.Config{Now: clk.Now, PayoutDelay: time.Hour})

	first := f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, processor.DestinationOK))
	var po processor.Payout
	decodeInto(t, first, http.StatusCreated, &po)
	if po.Status != processor.PayoutInTransit || po.ArrivalDate != clk.Now().Add(time.Hour).Unix() {
		t.Fatalf("accepted payout %+v", po)
	}
	wantReplay(t, first, f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, processor.DestinationOK)))
	if got := f.getPayout(t, po.ID); got.Status != processor.PayoutInTransit {
		t.Errorf("before arrival: %s", got.Status)
	}
	closed := f.post(t, "/v1/payouts", "po-closed", payoutBody(700, processor.DestinationClosed))
	var cpo processor.Payout
	decodeInto(t, closed, http.StatusCreated, &cpo)

	clk.Add(time.Hour)
	if got := f.getPayout(t, po.ID); got.Status != processor.PayoutPaid || got.FailureCode != nil {
		t.Errorf("after arrival: %+v; want paid", got)
	}
	if got := f.getPayout(t, cpo.ID); got.Status != processor.PayoutFailed || got.FailureCode == nil || *got.FailureCode != processor.FailureAccountClosed {
		t.Errorf("to a closed account: %+v; want failed, account_closed", got)
	}
	// The answer to the key stays the first one: the payout as accepted.
	wantReplay(t, first, f.post(t, "/v1/payouts", "po-ok", payoutBody(1500, processor.DestinationOK)))
	ledger := f.ledger(t, "po-ok")
	if len(ledger) != 1 || ledger[0].Object != processor.ObjectPayout || ledger[0].Status != processor.PayoutPaid {
		t.Fatalf("ledger for po-ok: %+v; want one paid payout", ledger)
	}
	if l := f.ledger(t, "po-closed"); len(l) != 1 || l[0].Status != processor.PayoutFailed || l[0].FailureCode != processor.FailureAccountClosed {
		t.Fatalf("ledger for po-closed: %+v", l)
	}
}

func TestFlakyDestinationRefusesTheFirstAttempts(t *testing.T) {
	t.Parallel()
	f := newFake(t, processor.Config{PayoutDelay: time.Hour})
	body := payoutBody(100, processor.DestinationFlaky)
	for range 2 {
		wantError(t, f.post(t, "/v1/payouts", "po-flaky", body), http.StatusServiceUnavailable, processor.CodeProcessorUnavailable)
	}
	if l := f.ledger(t, "po-flaky"); len(l) != 0 {
		t.Fatalf("refused attempts moved money: %+v", l)
	}
	var po processor.Payout
	decodeInto(t, f.post(t, "/v1/payouts", "po-flaky", body), http.StatusCreated, &po)
	if l := f.ledger(t, "po-flaky"); len(l) != 1 {
		t.Fatalf("ledger: %+v", l)
	}
}

func TestInvalidPayoutsStoreNothing(t *testing.T) {
	t.Parallel()
	f := newFake(t, processor.Config{})
	wantError(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(100, "ba_nowhere")), http.StatusBadRequest, processor.CodeDestinationUnknown)
	wantError(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(0, processor.DestinationOK)), http.StatusBadRequest, processor.CodeParameterInvalid)
	wantError(t, f.post(t, "/v1/payouts", "", payoutBody(100, processor.DestinationOK)), http.StatusBadRequest, processor.CodeIdempotencyKeyMissing)
	if l := f.ledger(t, ""); len(l) != 0 {
		t.Fatalf("ledger after invalid payouts: %+v", l)
	}
	// The key stored nothing: a corrected request with it is a new payout.
	decodeInto(t, f.post(t, "/v1/payouts", "po-bad", payoutBody(100, processor.DestinationOK)), http.StatusCreated, &processor.Payout{})
	res, err := f.do(t, http.DefaultClient, http.MethodGet, "/v1/payouts/ppo_nosuch", "", "")
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, res, http.StatusNotFound, processor.CodeResourceMissing)
}
