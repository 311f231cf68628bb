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
// operation: "<caller>-" and 26 characters of base32 (130 bits) of a
// SHA-256 over the caller's id, the operation's Idempotency-Key, its
// fingerprint and its generation, each prefixed with its length so that no
// two inputs run together. It is derived from what every retry carries
// again, not read from a row a failover may lose, so that a retry after
// such a loss gets the processor's first answer back rather than a second
// effect (design.md, "The downstream key and the processor"). The caller's
// id in front lets a webhook find its caller (CallerOfDownstreamKey).
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

// NewDownstreamKey is the first generation of DownstreamKey that no earlier
// object of the caller uses: after the retention window the same key and
// request are a new operation, which must not get the earlier one's effect.
// Those objects are that old, so no failover lost them: every retry counts
// the same generations (one at a time: the claim).
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
