package cardprocessor

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"strings"

	"github.com/retrysafe/payments/internal/dbsqlc"
)

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
// the operation again, and must send the key it sent the first time, so
// that the processor replays its first answer rather than charging the
// card (or paying out) a second time. A random id stored on the row would
// be lost with the row. With 130 bits, a collision among a caller's first
// 2^40 keys has odds of about 2^-51.
//
// The caller's id in front lets a webhook, which carries the key, find the
// caller whose rows it is about (CallerOfDownstreamKey).
//
// Rows written before this rule keep the key stored on them, which every
// later attempt and webhook reads: no migration is needed.
func DownstreamKey(callerID, idempotencyKey string, fingerprint []byte, generation int) string {
	h := sha256.New()
	for _, field := range [][]byte{[]byte("downstream-key/v1"), []byte(callerID), []byte(idempotencyKey), fingerprint} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(field)))
		h.Write(field)
	}
	_ = binary.Write(h, binary.BigEndian, uint64(generation)) // #nosec G115 -- generation counts up from 0 (NewDownstreamKey)
	return callerID + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)))[:downstreamHashLen]
}

// downstreamHashLen is how many base32 characters of the hash a downstream
// key keeps: 26 × 5 = 130 bits.
const downstreamHashLen = 26

// NewDownstreamKey returns the downstream key of the operation of callerID
// under idempotencyKey with the request fingerprint, for its create phase to
// store with the new object: the first generation of DownstreamKey that no
// earlier object of the caller uses.
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
func NewDownstreamKey(ctx context.Context, tx dbsqlc.DBTX, callerID, idempotencyKey string, fingerprint []byte) (string, error) {
	for generation := 0; ; generation++ {
		key := DownstreamKey(callerID, idempotencyKey, fingerprint, generation)
		used, err := queries.DownstreamKeyInUse(ctx, tx, dbsqlc.DownstreamKeyInUseParams{CallerID: callerID, DownstreamKey: key})
		if err != nil || !used {
			return key, err
		}
	}
}

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// CallerOfDownstreamKey returns the caller a downstream key belongs to.
// The hash after the caller's id never contains a '-' (nor did the object
// ids that older keys ended with), so the caller is everything before the
// last one, whatever its own id contains.
func CallerOfDownstreamKey(downstreamKey string) (string, bool) {
	i := strings.LastIndex(downstreamKey, "-")
	if i <= 0 || i == len(downstreamKey)-1 {
		return "", false
	}
	return downstreamKey[:i], true
}
