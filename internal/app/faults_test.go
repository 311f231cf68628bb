package app

import (
	"strings"
	"testing"
	"time"
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
	if _, err := parseStalls("after_claim, nowhere", time.Second); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("parseStalls: %v; want the unknown point named", err)
	}
	if stall, err := parseStalls(" after_claim ", time.Second); err != nil || stall != 2*time.Second {
		t.Errorf("parseStalls: %s, %v; want a stall of two leases", stall, err)
	}
}
