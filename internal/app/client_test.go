package app

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/payments/client"
	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/retry"
)

// The project's retry-safe client against the real server and its flaky
// processor: one logical charge, several attempts under one key, one
// processor effect, a succeeded charge.
func TestClientSurvivesAFlakyProcessor(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	c, err := client.New(ts.URL, "sk_test_acme", client.Policy{
		MaxAttempts: 6, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Budget: retry.NewBudget(0.1, 10),
	}, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	var attempts []client.Attempt
	c.OnAttempt = func(a client.Attempt) { attempts = append(attempts, a) }
	ctx := context.Background()
	o, _, err := c.CreateOrder(ctx, apiclient.CreateOrderRequest{Amount: 2500, Currency: "usd"})
	if err != nil {
		t.Fatal(err)
	}
	attempts = nil
	ch, res, err := c.Charge(ctx, o.Id, apiclient.PmCardFlaky)
	if err != nil {
		t.Fatalf("charge through a flaky processor: %v (attempts %+v)", err, attempts)
	}
	if ch.Status != apiclient.ChargeStatusSucceeded || res.Attempts < 3 {
		t.Errorf("charge %s after %d attempts; want succeeded after the processor's two failures", ch.Status, res.Attempts)
	}
	for _, a := range attempts {
		if a.IdempotencyKey != res.IdempotencyKey {
			t.Errorf("attempt %d used key %q, not %q", a.Number, a.IdempotencyKey, res.IdempotencyKey)
		}
	}
	if n := len(ts.effects(t)); n != 1 {
		t.Errorf("%d processor effects; want exactly 1", n)
	}
	// The same logical operation again (same key): a replay, no new effect.
	again, res2, err := c.Charge(ctx, o.Id, apiclient.PmCardFlaky, client.WithIdempotencyKey(res.IdempotencyKey))
	if err != nil || !res2.Replayed || again.Id != ch.Id {
		t.Errorf("same key again: %+v, %+v, %v; want the replay", again, res2, err)
	}
}
