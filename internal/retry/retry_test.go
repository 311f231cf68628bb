package retry

import (
	"testing"
	"time"
)

func TestFullJitterStaysWithinBounds(t *testing.T) {
	t.Parallel()
	base, cap := 100*time.Millisecond, 5*time.Second
	for attempt := int32(0); attempt < 40; attempt++ {
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
