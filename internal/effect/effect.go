// Package effect is the step that every operation with an external effect
// shares, whatever the effect: call the processor under the operation's
// downstream idempotency key, outside any transaction, then record a
// definite answer in the operation's final phase. Charges and refunds both
// run it; a new operation that moves money runs it too, and so gets the
// same rules for free:
//
//   - no definite answer (a timeout, a 5xx, a 429) is never recorded: the
//     client gets a 503 with Retry-After, the record stays at its recovery
//     point, and the next attempt calls again under the same key, which the
//     processor collapses into one effect;
//   - once the processor may have acted, no failure of ours becomes a final
//     answer (the idempotency layer keeps the record resumable);
//   - the crash points after the call and before the final commit, so that
//     tests can kill the process at both.
package effect

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/faults"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/problem"
)

// A FinishFunc is an operation's final phase: it records the processor's
// definite answer inside tx and returns the operation's final response.
// refusal is the processor's definite "no" (a *cardprocessor.DeclinedError
// or *cardprocessor.RefusedError), or nil when answer is a success.
type FinishFunc[A any] func(ctx context.Context, tx pgx.Tx, answer A, refusal error) (idempotency.Result, error)

// Call makes the external call of the operation held by l and finishes
// the operation with its answer. call makes exactly one attempt (retries
// belong to the API's client and to the reconciler: a loop here would
// multiply theirs). what names the operation for the client ("charge").
func Call[A any](ctx context.Context, l *idempotency.Lease, crash *faults.CrashPoints, what string,
	call func(context.Context) (A, error), finish FinishFunc[A]) error {
	answer, err := call(ctx)
	crash.Crash(faults.AfterProcessorCall)

	var uncertain *cardprocessor.UncertainError
	switch {
	case errors.As(err, &uncertain):
		p := problem.New(problem.ProcessorUnavailable,
			"the card processor did not give a definite answer; retry with the same Idempotency-Key and the %s resumes (it will not happen twice)", what)
		p.RetryAfter = max(1, int(math.Ceil(uncertain.RetryAfter.Seconds())))
		return errors.Join(p, err)
	case err != nil && !cardprocessor.IsDefinite(err):
		// Neither an answer nor a "no": treat it as no answer. (The
		// idempotency layer keeps any unexpected error after the first
		// phase resumable, never final; see idempotency.Handler.)
		return err
	}
	refusal := err
	return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Result, error) {
		res, err := finish(ctx, tx, answer, refusal)
		if err == nil {
			crash.Crash(faults.BeforeFinalCommit)
		}
		return res, err
	})
}

// ContradictionError is a processor report that contradicts a final state
// already recorded: a charge recorded as failed now reported succeeded, or
// the other way round. It is found before anything is written. Nothing is
// ever changed on such a report; a person must look.
type ContradictionError struct {
	Object, ID         string // "charge" or "refund", and its id
	Recorded, Reported string // the statuses
}

func (e *ContradictionError) Error() string {
	return fmt.Sprintf("%s %s is recorded as %s but the processor reports %s", e.Object, e.ID, e.Recorded, e.Reported)
}

// DownstreamKey is the Idempotency-Key sent to the processor for an
// operation: "<caller>-" and 26 characters of base32 (lower case, no
// padding: 130 bits) of a SHA-256 over the caller's id, the operation's own
// Idempotency-Key, its request fingerprint and its generation (see
// NewDownstreamKey), each prefixed with its length so that no two inputs
// run together.
//
// It is derived from what every retry of the operation carries again, and
// from nothing the database holds. A failover under asynchronous
// replication (or a restore from a backup) can lose an operation's rows
// while the processor keeps its effect; the client's retry then creates
// the operation again, and must send the processor the key it sent the
// first time, so that the processor replays its first answer rather than
// charging the card (or paying out) a second time. A random id stored on
// the row would be lost with the row. 130 bits keep two operations from
// ever sharing a key by chance: a collision among a caller's first 2^40 keys has
// odds of about 2^-51.
//
// The caller's id in front lets a webhook, which carries the key, find the
// caller whose rows it is about (CallerOf).
//
// Rows written before this rule keep the key they were created with (it is
// stored on the row, and every later attempt and every webhook reads it
// from there), so no migration is needed: only new operations get derived
// keys.
func DownstreamKey(callerID, idempotencyKey string, fingerprint []byte, generation int) string {
	h := sha256.New()
	for _, field := range [][]byte{[]byte("downstream-key/v1"), []byte(callerID), []byte(idempotencyKey), fingerprint} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(field)))
		h.Write(field)
	}
	_ = binary.Write(h, binary.BigEndian, uint64(generation))
	return callerID + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)))[:downstreamHashLen]
}

// downstreamHashLen is how many base32 characters of the hash a downstream
// key keeps: 26 × 5 = 130 bits.
const downstreamHashLen = 26

// NewDownstreamKey returns the downstream key of the operation recorded in
// rec, for its create phase to store with the new object: the first
// generation of DownstreamKey that no earlier object of the caller uses.
//
// The generation exists because a key is remembered only for the
// retention window: after it, the same Idempotency-Key with the same
// request is a new operation, and must not reuse the key of the earlier
// one (the processor would replay the earlier effect, and our rows could
// not tell the two apart). The earlier objects are as old as the window
// (24 hours), so no failover can have lost them: every retry of the new
// operation counts the same generations and sends the same key. Two
// operations never count at once for one (caller, key): the claim lets one
// run at a time.
func NewDownstreamKey(ctx context.Context, tx dbsqlc.DBTX, rec dbsqlc.IdempotencyKey) (string, error) {
	for generation := 0; ; generation++ {
		key := DownstreamKey(rec.CallerID, rec.Key, rec.RequestFingerprint, generation)
		used, err := queries.DownstreamKeyInUse(ctx, tx, dbsqlc.DownstreamKeyInUseParams{CallerID: rec.CallerID, DownstreamKey: key})
		if err != nil || !used {
			return key, err
		}
	}
}

var queries = dbsqlc.New()

// CallerOf returns the caller a downstream key belongs to. The hash after
// the caller's id never contains a '-' (nor did the object ids that keys
// made before it ended with), so the caller is everything before the last
// one, whatever its own id contains.
func CallerOf(downstreamKey string) (string, bool) {
	i := strings.LastIndex(downstreamKey, "-")
	if i <= 0 || i == len(downstreamKey)-1 {
		return "", false
	}
	return downstreamKey[:i], true
}
