package fakeprocessor

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/retrysafe/payments/internal/config"
)

// LoadConfig reads a Config from the environment through getenv, reporting
// every invalid variable at once:
//
//	PROCESSOR_ADDR                 where cmd/processor listens (default :8081)
//	WEBHOOK_URL                    where events go (unset: no webhooks)
//	WEBHOOK_SECRET                 signing secret (default whsec_test_processor)
//	WEBHOOK_MAX_ATTEMPTS           deliveries per event (default 8)
//	PROCESSOR_FLAKY_FAILURES       503s before pm_card_flaky succeeds (default 2)
//	PROCESSOR_TIMEOUT_HOLD         longest withheld answer (default 30s)
//	PROCESSOR_PAYOUT_DELAY         how long a payout takes to arrive (default 2s)
//	PROCESSOR_KEY_RETENTION        how long a downstream key is remembered (default 24h)
//	CHAOS_LATENCY_MS               added to every /v1 call (default 0)
//	CHAOS_ERROR_RATE               0..1, 503 before any effect
//	CHAOS_TIMEOUT_RATE             0..1, answer withheld after the effect
//	CHAOS_DUPLICATE_WEBHOOK_RATE   0..1, event delivered twice
//	CHAOS_SEED                     seeds the random source (unset: random)
func LoadConfig(getenv func(string) string) (Config, error) {
	r := config.NewReader(getenv) // the server's reader: one way to read the environment
	rate := func(name string) float64 {
		v := r.Float(name, 0)
		r.Check(v <= 1, "%s=%v: want a probability from 0 to 1", name, v)
		return v
	}
	cfg := Config{Addr: r.String("PROCESSOR_ADDR", ":8081"), WebhookURL: r.String("WEBHOOK_URL", ""),
		WebhookSecret: []byte(r.String("WEBHOOK_SECRET", DefaultWebhookSecret)),
		// A zero is New's default.
		WebhookMaxAttempts: r.Int("WEBHOOK_MAX_ATTEMPTS", 0, 1), FlakyFailures: r.Int("PROCESSOR_FLAKY_FAILURES", 0, 1),
		TimeoutHold: r.Duration("PROCESSOR_TIMEOUT_HOLD", 0), PayoutDelay: r.Duration("PROCESSOR_PAYOUT_DELAY", 0),
		KeyRetention: r.Duration("PROCESSOR_KEY_RETENTION", 0),
		Chaos: Chaos{LatencyMS: r.Int("CHAOS_LATENCY_MS", 0, 0), ErrorRate: rate("CHAOS_ERROR_RATE"),
			TimeoutRate: rate("CHAOS_TIMEOUT_RATE"), DuplicateWebhookRate: rate("CHAOS_DUPLICATE_WEBHOOK_RATE")},
	}
	if v := r.String("CHAOS_SEED", ""); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		r.Check(err == nil, "CHAOS_SEED=%q: want an unsigned integer", v)
		cfg.Rand = rand.New(rand.NewPCG(seed, seed)) // #nosec G404 -- the fake's chaos draws: reproducible by design
	}
	// New checks what the reader cannot (the URL's shape, the latency bound):
	// check it here too, so it surfaces before the listener opens.
	if err := r.Err(); err != nil {
		return Config{}, err
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}
