// Package faults is a test facility: named crash points at which the
// server kills itself, so that tests can crash it between two phases of an
// operation with a real SIGKILL and check that a restart recovers the
// operation exactly once.
//
// It is off unless FAULT_CRASH_POINTS names points explicitly. Never set it
// in production.
package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
)

// The crash points, in the order an execution passes them. The last two
// are in the step every external effect shares (package effect), so
// charges and refunds both pass them.
const (
	// AfterChargeCreated: a charge's create phase committed (charge row
	// pending, record at charge_created); the processor was not called.
	AfterChargeCreated = "after_charge_created"
	// AfterProcessorCall: the processor answered (the card is charged, or
	// refunded); nothing of its answer is recorded.
	AfterProcessorCall = "after_processor_call"
	// BeforeFinalCommit: the final phase's writes are done but not
	// committed.
	BeforeFinalCommit = "before_final_commit"
)

// Known lists every crash point.
var Known = []string{AfterChargeCreated, AfterProcessorCall, BeforeFinalCommit}

// CrashPoints is the set of enabled crash points. The zero value has none.
type CrashPoints struct{ enabled []string }

// Parse reads a comma-separated list of crash point names.
func Parse(list string) (CrashPoints, error) {
	var c CrashPoints
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(Known, name) {
			return c, fmt.Errorf("unknown crash point %q (known: %s)", name, strings.Join(Known, ", "))
		}
		c.enabled = append(c.enabled, name)
	}
	return c, nil
}

// Crash kills the process at once, as a power cut would (no deferred
// functions, no graceful shutdown, open transactions left to the database
// to abort), if the point is enabled.
func (c CrashPoints) Crash(point string) {
	if slices.Contains(c.enabled, point) {
		fmt.Fprintf(os.Stderr, "faults: crashing at %s\n", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; never return
	}
}
