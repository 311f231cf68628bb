// Package retry holds the project's retry policy, shared by the Go client
// (package client) and by the server's background retriers (the
// reconciler, the outbox relay): full-jitter backoff, and a retry budget.
// It is public, outside internal/, because the client's Policy names its
// Budget: a program that uses the client builds or shares one.
package retry

import (
	"math/rand/v2"
	"sync"
	"time"
)

// FullJitter is the delay before retry number attempt: random(0, min(cap,
// base·2^attempt)). Randomizing over the whole range spreads the retries of
// many clients that failed together, so they do not come back together
// (AWS Architecture Blog, "Exponential Backoff And Jitter").
func FullJitter(base, cap time.Duration, attempt int) time.Duration {
	ceiling := cap
	// base·2^attempt, without overflowing: only when it stays below cap.
	if attempt >= 0 && attempt < 63 && base > 0 && base <= cap>>attempt {
		ceiling = base << attempt
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1)) // #nosec G404 -- jitter spreads retries; nothing depends on it being unpredictable
}

// Budget is a token bucket that caps retries to a fraction of the work, so
// that an outage of a dependency does not turn every failure into a storm
// of retries against it. Each first try earns ratio of a token (up to
// max); each retry spends a whole one. While the bucket is empty, retries
// wait: the work is deferred, not dropped. Tokens are counted in
// thousandths, so ten first tries at ratio 0.1 earn exactly one retry.
type Budget struct {
	mu     sync.Mutex
	tokens int64 // thousandths of a token
	earn   int64
	max    int64
}

// NewBudget returns a full bucket of max tokens, refilled by ratio of a
// token per first try.
func NewBudget(ratio float64, max int) *Budget {
	return &Budget{tokens: int64(max) * 1000, earn: int64(ratio * 1000), max: int64(max) * 1000}
}

// Earn records a first try.
func (b *Budget) Earn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.max, b.tokens+b.earn)
}

// Spend takes a token for a retry, reporting false when none is left.
func (b *Budget) Spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1000 {
		return false
	}
	b.tokens -= 1000
	return true
}

// Deposit adds n whole tokens (up to max): a refill with time rather than
// with work, for a worker whose every try is a retry.
func (b *Budget) Deposit(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.max, b.tokens+int64(n)*1000)
}

// SpendUpTo takes as many whole tokens as it can, up to n, and returns how
// many it took.
func (b *Budget) SpendUpTo(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(int64(n), b.tokens/1000)
	b.tokens -= k * 1000
	return int(k)
}
