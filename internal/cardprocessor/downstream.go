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
// It is derived from what every retry of the operation carries again, not
// from the database (a random id on the row would be lost with the row): a
// failover under asynchronous replication, or a restore, can lose an
// operation's rows while the processor keeps its effect, and the client's
// retry, creating the operation again, must send the first key so that the
// processor replays its answer rather than charging (or paying out) twice.
// With 130 bits, a collision among a caller's first 2^40 keys has odds of
// about 2^-51.
//
// The caller's id in front lets a webhook, which carries the key, find the
// caller whose rows it is about (CallerOfDownstreamKey). Rows written
// before this rule keep the key stored on them, which every later attempt
// and webhook reads: no migration is needed.
func DownstreamKey(callerID, idempotencyKey string, fingerprint []byte, generation int) string {
	h := sha256.New()
	for _, field := range [][]byte{[]byte("downstream-key/v1"), []byte(callerID), []byte(idempotencyKey), fingerprint} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(field)))
		h.Write(field)
	}
	_ = binary.Write(h, binary.BigEndian, uint64(generation)) // #nosec G115 -- generation counts up from 0 (NewDownstreamKey)
	return callerID + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)))[:downstreamHashLen]
}

// downstreamHashLen is how many base32 characters of the hash a key keeps.
const downstreamHashLen = 26

// NewDownstreamKey is the key a create phase stores with its new object:
// the first generation of DownstreamKey that no earlier object of the
// caller uses.
//
// The generation exists because a key is remembered only for the retention
// window: after it, the same Idempotency-Key and request are a new
// operation, which must not reuse the earlier one's key (the processor
// would replay the earlier effect, and our rows could not tell the two
// apart). The earlier objects are as old as the window (24 hours), so no
// failover can have lost them: every retry of the new operation counts the
// same generations and sends the same key. Two operations never count at
// once for one (caller, key): the claim lets one run at a time.
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
