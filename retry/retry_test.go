package retry

import (
	"testing"
	"time"
)

func TestFullJitterStaysWithinBounds(t *testing.T) {
	t.Parallel()
	base, cap := 100*time.Millisecond, 5*time.Second
	for attempt := 0; attempt < 40; attempt++ {
		ceiling := cap
		if attempt < 30 && base<<attempt < cap {
			ceiling = base << attempt
		}
		var max time.Duration
		for range 2000 {
			d := FullJitter(base, cap, attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: %s outside [0, %s]", attempt, d, ceiling)
			}
			max = maxDuration(max, d)
		}
		// The draws spread over the range, not just its bottom.
		if max < ceiling/2 {
			t.Errorf("attempt %d: 2000 draws never passed %s of a %s ceiling", attempt, max, ceiling)
		}
	}
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

func TestBudgetCapsRetries(t *testing.T) {
	t.Parallel()
	b := NewBudget(0.1, 3)
	spent := 0
	for b.Spend() {
		spent++
	}
	if spent != 3 {
		t.Fatalf("a full bucket of 3 allowed %d retries", spent)
	}
	// Ten first tries earn one retry.
	for range 10 {
		b.Earn()
	}
	if !b.Spend() || b.Spend() {
		t.Error("10 first tries at ratio 0.1 should earn exactly one retry")
	}
	// Earning never overfills the bucket.
	for range 1000 {
		b.Earn()
	}
	spent = 0
	for b.Spend() {
		spent++
	}
	if spent != 3 {
		t.Errorf("after much work the bucket allowed %d retries; want its max, 3", spent)
	}
}

func TestBudgetDepositAndSpendUpTo(t *testing.T) {
	t.Parallel()
	b := NewBudget(0, 5)
	if got := b.SpendUpTo(3); got != 3 {
		t.Fatalf("SpendUpTo(3) on a full bucket of 5 = %d", got)
	}
	if got := b.SpendUpTo(10); got != 2 {
		t.Fatalf("SpendUpTo(10) with 2 left = %d", got)
	}
	b.Deposit(100)
	if got := b.SpendUpTo(10); got != 5 {
		t.Fatalf("a deposit never fills past max: spent %d, want 5", got)
	}
}

func TestFullJitterDoesNotOverflow(t *testing.T) {
	t.Parallel()
	for _, attempt := range []int{29, 40, 62, 63, 100} {
		if d := FullJitter(time.Hour, 2*time.Hour, attempt); d < 0 || d > 2*time.Hour {
			t.Errorf("FullJitter(1h, 2h, %d) = %s; want within [0, 2h]", attempt, d)
		}
	}
}
