package app

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/idempotency"
)

// FAULT_CRASH_POINTS names only points that exist: a misspelt one would
// silently never crash, and the test relying on it would prove nothing.
func TestUnknownCrashPointIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := ParseCrashPoints("after_processor_call, nowhere"); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("ParseCrashPoints: %v; want the unknown point named", err)
	}
	c, err := ParseCrashPoints(" after_processor_call ,before_final_commit")
	if err != nil || len(c.always) != 2 {
		t.Errorf("ParseCrashPoints: %+v, %v; want both points", c, err)
	}
}

// FAULT_STALL_POINTS, likewise, names only points that exist.
func TestUnknownStallPointIsRefused(t *testing.T) {
	t.Parallel()
	if err := installStalls(&idempotency.Store{}, "after_claim, nowhere", time.Second, slog.Default()); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("installStalls: %v; want the unknown point named", err)
	}
	keys := &idempotency.Store{}
	if err := installStalls(keys, " after_claim ", time.Second, slog.Default()); err != nil || keys.Hooks.AfterClaim == nil {
		t.Errorf("installStalls: %v; want the after_claim hook set", err)
	}
}
