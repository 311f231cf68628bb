//go:build !nofence

package idempotency

import (
	"context"

	"github.com/retrysafe/payments/internal/dbsqlc"
)

// completeRecord stores an operation's final response, fenced on the
// lease (attempt, status, a live lease; see CompleteIdempotencyKey).
//
// It is the one write that the build tag nofence replaces with an unfenced
// one (fence_nofence.go): a planted bug, for internal/soak to show that
// its history check catches a fenced-out owner that completes anyway.
func completeRecord(ctx context.Context, tx dbsqlc.DBTX, arg dbsqlc.CompleteIdempotencyKeyParams) error {
	return queries.CompleteIdempotencyKey(ctx, tx, arg)
}
