// Package retry holds the project's backoff policy, shared by every
// background retrier (the reconciler, the outbox relay).
package retry

import (
	"math/rand/v2"
	"time"
)

// FullJitter is the delay before retry number attempt:
// random(0, min(cap, base·2^attempt)). Randomizing over the whole range
// spreads the retries of many clients that failed together, so they do not
// come back together (AWS Architecture Blog, "Exponential Backoff And
// Jitter").
func FullJitter(base, cap time.Duration, attempt int32) time.Duration {
	ceiling := cap
	if attempt >= 0 && attempt < 30 {
		if d := base << attempt; d > 0 && d < ceiling {
			ceiling = d
		}
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}
