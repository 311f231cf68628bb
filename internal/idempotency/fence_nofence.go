//go:build nofence

package idempotency

import (
	"context"

	"github.com/retrysafe/payments/internal/dbsqlc"
)

// completeRecord is CompleteIdempotencyKey without its fence: the record
// is named by its id alone, and neither the attempt, nor the status, nor a
// live lease is asked for. A PLANTED BUG, built only with -tags nofence, by
// TestHistoryCheckFindsUnfencedCompletion in internal/soak: an owner that
// stalled past its lease, and was taken over, then overwrites the answer
// the new owner already gave. Never build a server with this tag.
func completeRecord(ctx context.Context, tx dbsqlc.DBTX, arg dbsqlc.CompleteIdempotencyKeyParams) error {
	_, err := tx.Exec(ctx, `
		UPDATE idempotency_keys
		SET status = 'completed', recovery_point = 'finished',
		    response_status = $1, response_headers = $2, response_body = $3,
		    locked_until = NULL, completed_at = now(), updated_at = now()
		WHERE caller_id = $4 AND id = $5`,
		arg.ResponseStatus, arg.ResponseHeaders, arg.ResponseBody, arg.CallerID, arg.ID)
	return err
}
