package app

import (
	"strings"
	"testing"
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
