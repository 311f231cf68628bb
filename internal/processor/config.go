package processor

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
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
	var errs []error
	str := func(name string) string { return strings.TrimSpace(getenv(name)) }
	integer := func(name string, least int, dst *int) {
		if v := str(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < least {
				errs = append(errs, fmt.Errorf("%s=%q: want an integer >= %d", name, v, least))
				return
			}
			*dst = n
		}
	}
	rate := func(name string, dst *float64) {
		if v := str(name); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f >= 0 && f <= 1) {
				errs = append(errs, fmt.Errorf("%s=%q: want a probability from 0 to 1", name, v))
				return
			}
			*dst = f
		}
	}
	duration := func(name, example string, dst *time.Duration) {
		if v := str(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive Go duration such as %s", name, v, example))
			}
			*dst = d
		}
	}

	cfg := Config{Addr: cmp.Or(str("PROCESSOR_ADDR"), ":8081"), WebhookURL: str("WEBHOOK_URL")}
	cfg.WebhookSecret = []byte(cmp.Or(str("WEBHOOK_SECRET"), DefaultWebhookSecret))
	integer("WEBHOOK_MAX_ATTEMPTS", 1, &cfg.WebhookMaxAttempts)
	integer("PROCESSOR_FLAKY_FAILURES", 1, &cfg.FlakyFailures)
	duration("PROCESSOR_TIMEOUT_HOLD", "30s", &cfg.TimeoutHold)
	duration("PROCESSOR_PAYOUT_DELAY", "2s", &cfg.PayoutDelay)
	duration("PROCESSOR_KEY_RETENTION", "24h", &cfg.KeyRetention)
	integer("CHAOS_LATENCY_MS", 0, &cfg.Chaos.LatencyMS)
	rate("CHAOS_ERROR_RATE", &cfg.Chaos.ErrorRate)
	rate("CHAOS_TIMEOUT_RATE", &cfg.Chaos.TimeoutRate)
	rate("CHAOS_DUPLICATE_WEBHOOK_RATE", &cfg.Chaos.DuplicateWebhookRate)
	if v := str("CHAOS_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("CHAOS_SEED=%q: want an unsigned integer", v))
		}
		cfg.Rand = rand.New(rand.NewPCG(seed, seed)) // #nosec G404 -- the fake's chaos draws: reproducible by design
	}
	// New checks what the parsers cannot (the URL's shape, the latency
	// bound): check it here too, so it surfaces before the listener opens.
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}
