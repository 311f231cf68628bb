// Package faults is a test facility: named crash points at which the
// server kills itself, so that tests can crash it between two phases of an
// operation with a real SIGKILL and check that a restart recovers the
// operation exactly once.
//
// It is off unless FAULT_CRASH_POINTS names points explicitly, or the demo
// (DEMO_MODE) arms one. Never set either in production.
package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
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

// CrashPoints are the crash points in force: those enabled for good (by
// FAULT_CRASH_POINTS, for tests) and one armed for a single pass (by the
// browser demo's "Crash at" control). A nil *CrashPoints has none.
type CrashPoints struct {
	mu     sync.Mutex
	always []string
	once   string
}

// Parse reads a comma-separated list of crash point names, enabled for
// good.
func Parse(list string) (*CrashPoints, error) {
	c := &CrashPoints{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if err := check(name); err != nil {
			return nil, err
		}
		c.always = append(c.always, name)
	}
	return c, nil
}

func check(point string) error {
	if !slices.Contains(Known, point) {
		return fmt.Errorf("unknown crash point %q (known: %s)", point, strings.Join(Known, ", "))
	}
	return nil
}

// Arm makes the next execution that passes point crash there, once; an
// empty point disarms. It is the demo's control: the server is restarted
// by its supervisor, and the armed point does not survive the crash.
func (c *CrashPoints) Arm(point string) error {
	if point != "" {
		if err := check(point); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.once = point
	return nil
}

// Armed is the point armed for one pass, or "".
func (c *CrashPoints) Armed() string {
	if c == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.once
}

// Crash kills the process at once, as a power cut would (no deferred
// functions, no graceful shutdown, open transactions left to the database
// to abort), if the point is enabled or armed.
func (c *CrashPoints) Crash(point string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	fire := slices.Contains(c.always, point) || c.once == point
	c.mu.Unlock()
	if fire {
		fmt.Fprintf(os.Stderr, "faults: crashing at %s\n", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; never return
	}
}
