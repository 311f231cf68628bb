package app

// Crash points are a test facility: named places at which the server kills
// itself with a real SIGKILL, so that tests can check that a restart recovers
// the operation exactly once. Off unless FAULT_CRASH_POINTS names points or
// the demo (DEMO_MODE) arms one, one at a time; never in production.
//
// No operation's code knows about them: they reach it through two seams every
// operation with an external effect passes, the idempotency store's Faults
// (implemented by faults below) and the card processor (wrapped here).

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
)

// The crash points, in the order an execution passes them. Charges and
// refunds pass the last two; payouts, after_processor_call.
const (
	// AfterChargeCreated: a charge's create phase committed (charge row
	// pending, record at charge_created); the processor was not called.
	AfterChargeCreated = "after_charge_created"
	// AfterProcessorCall: the processor answered (the card is charged, or
	// refunded); nothing of its answer is recorded.
	AfterProcessorCall = "after_processor_call"
	// BeforeFinalCommit: the final phase's own writes are done; neither
	// the record's completion nor the commit is sent.
	BeforeFinalCommit = "before_final_commit"
)

// CrashPointNames lists every crash point.
var CrashPointNames = []string{AfterChargeCreated, AfterProcessorCall, BeforeFinalCommit}

// CrashPoints are the crash points in force: those enabled for good
// (FAULT_CRASH_POINTS) and one armed for a single pass (the demo's "Crash
// at" control). A nil *CrashPoints has none.
type CrashPoints struct {
	always []string // set by ParseCrashPoints, then only read
	mu     sync.Mutex
	once   string
	log    *slog.Logger // the crash's one line, at warn (set by New)
}

// ParseCrashPoints reads comma-separated crash point names, enabled for good.
func ParseCrashPoints(list string) (*CrashPoints, error) {
	c := &CrashPoints{}
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if err := check(name); err != nil {
			return nil, err
		}
		c.always = append(c.always, name)
	}
	return c, nil
}

// check refuses a name that is not a crash point's ("" names none).
func check(point string) error {
	if point != "" && !slices.Contains(CrashPointNames, point) {
		return fmt.Errorf("unknown crash point %q (known: %s)", point, strings.Join(CrashPointNames, ", "))
	}
	return nil
}

// Arm makes the next execution that passes point crash there; "" disarms.
// The armed point does not survive the crash (the supervisor restarts).
func (c *CrashPoints) Arm(point string) error {
	if err := check(point); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.once = point
	return nil
}

// Points lists every crash point, for the demo page.
func (c *CrashPoints) Points() []string { return CrashPointNames }

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
	if c != nil && (slices.Contains(c.always, point) || c.Armed() == point) {
		c.log.Warn("faults: crashing the server on purpose", "point", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; never return
	}
}

// faults is the store's idempotency.Faults, as the configuration asks.
type faults struct {
	crash    *CrashPoints  // nil: none
	stall    time.Duration // how long an owner stalls after_claim; 0: never
	unfenced bool          // FAULT_UNFENCED_COMPLETION: the planted bug
	log      *slog.Logger
}

func (f *faults) AfterClaim(rec idempotency.Record) {
	// Only a new record stalls, so that the request that takes it over
	// does not stall too, and the key moves on.
	if f.stall > 0 && rec.Attempt == 1 {
		f.log.Warn("faults: stalling after the claim", "stall_point", AfterClaim, "key_id", rec.ID, "for", f.stall)
		time.Sleep(f.stall) // the fault itself: a pause that outlasts the lease
	}
}

func (f *faults) AfterPhase(rec idempotency.Record) {
	if rec.RecoveryPoint == charges.RecoveryChargeCreated {
		f.crash.Crash(AfterChargeCreated)
	}
}

func (f *faults) BeforeFinalCommit(idempotency.Record) { f.crash.Crash(BeforeFinalCommit) }

func (f *faults) Unfenced() bool { return f.unfenced }

// crashingProcessor passes after_processor_call after every call that may
// move money.
type crashingProcessor struct {
	cardprocessor.Processor
	crash *CrashPoints
}

func (p crashingProcessor) Charge(ctx context.Context, key string, req cardprocessor.ChargeRequest) (cardprocessor.ChargeResult, error) {
	defer p.crash.Crash(AfterProcessorCall)
	return p.Processor.Charge(ctx, key, req)
}

func (p crashingProcessor) Refund(ctx context.Context, key string, req cardprocessor.RefundRequest) (cardprocessor.RefundResult, error) {
	defer p.crash.Crash(AfterProcessorCall)
	return p.Processor.Refund(ctx, key, req)
}

func (p crashingProcessor) Payout(ctx context.Context, key string, req cardprocessor.PayoutRequest) (cardprocessor.PayoutResult, error) {
	defer p.crash.Crash(AfterProcessorCall)
	return p.Processor.Payout(ctx, key, req)
}

// Stall points are for the history check's planted-bug test (internal/soak):
// places at which an owner stops, renewing nothing, as if paused (a long GC
// pause, a frozen VM), so that its lease lapses and another request takes the
// record over; then it carries on, unaware. Off unless FAULT_STALL_POINTS
// names one; never in production. AfterClaim, the only one: a claim has just
// inserted a new record (attempt 1); nothing has run, nor the heartbeat.
const AfterClaim = "after_claim"

// parseStalls reads FAULT_STALL_POINTS (comma-separated) and says how long
// an owner stalls after its claim: two leases, if after_claim is named.
func parseStalls(list string, lease time.Duration) (time.Duration, error) {
	var stall time.Duration
	for name := range strings.SplitSeq(list, ",") {
		switch name = strings.TrimSpace(name); name {
		case "":
		case AfterClaim:
			stall = 2 * lease
		default:
			return 0, fmt.Errorf("unknown stall point %q (known: %s)", name, AfterClaim)
		}
	}
	return stall, nil
}
