-- name: CreatePayout :one
INSERT INTO payouts (caller_id, id, idempotency_key_id, amount, currency, destination, downstream_key)
VALUES (@caller_id, @id, @idempotency_key_id, @amount, @currency, @destination, @downstream_key)
RETURNING *;

-- name: GetPayout :one
SELECT * FROM payouts
WHERE caller_id = @caller_id AND id = @id;

-- name: LockPayout :one
-- The job and a webhook may record a payout's outcome at the same time:
-- whoever locks the row first records it, the other finds it recorded.
SELECT * FROM payouts
WHERE caller_id = @caller_id AND id = @id
FOR UPDATE;

-- name: GetPayoutByDownstreamKey :one
SELECT * FROM payouts
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;

-- name: SetPayoutInTransit :one
UPDATE payouts
SET status = 'in_transit', processor_payout_id = @processor_payout_id, arrives_at = @arrives_at, updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: SetPayoutPaid :one
UPDATE payouts
SET status = 'paid', processor_payout_id = coalesce(processor_payout_id, @processor_payout_id), updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status IN ('pending', 'in_transit')
RETURNING *;

-- name: SetPayoutFailed :one
UPDATE payouts
SET status = 'failed', failure_code = @failure_code, processor_payout_id = coalesce(processor_payout_id, @processor_payout_id), updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status IN ('pending', 'in_transit')
RETURNING *;

-- name: ListPayouts :many
-- Newest first. Keyset pagination, as for orders.
SELECT * FROM payouts
WHERE caller_id = @caller_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: ListDiscardedPayoutJobs :many
-- Payout jobs River gave up on (out of attempts): their payouts are stuck
-- pending or in transit, with their money held, until a person looks. The
-- queue is not tenant data, so this reads every caller's.
SELECT id, args, attempt, finalized_at
FROM river.river_job
WHERE kind = 'payout' AND state = 'discarded'
ORDER BY id;
