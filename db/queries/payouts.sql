-- name: CreatePayout :one
-- No row when an earlier payout of the caller has the downstream key: the
-- caller tries the key's next generation (cardprocessor.NewDownstreamKey).
-- Only a payout can have a payout's key, which hashes the request's path.
INSERT INTO payouts (caller_id, id, amount, currency, destination, downstream_key)
SELECT @caller_id, @id, @amount, @currency, @destination, @downstream_key
WHERE NOT EXISTS (SELECT 1 FROM payouts WHERE caller_id = @caller_id AND downstream_key = @downstream_key)
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
-- Payout jobs given up on: discarded by River (out of attempts) or
-- cancelled by the job itself (the processor rejected its key, or kept
-- telling it to wait for too long). Their payouts are stuck pending or in
-- transit, with their money held, until a person looks. The reason is the
-- last of the job's errors. The queue is not tenant data, so this reads
-- every caller's.
SELECT id, args, attempt, state::text AS state, finalized_at,
       coalesce(errors[array_upper(errors, 1)] ->> 'error', '')::text AS last_error
FROM river.river_job
WHERE kind = 'payout' AND state IN ('discarded', 'cancelled')
ORDER BY id;
