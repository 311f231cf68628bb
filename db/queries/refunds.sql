-- name: ReserveRefund :one
-- Reserve amount of a succeeded charge for a refund. The CHECK constraint
-- refunds_within_charge refuses a reservation past the charged amount.
UPDATE charges
SET amount_refunded = amount_refunded + @amount, updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'succeeded'
RETURNING *;

-- name: ReleaseRefund :exec
-- Give a failed refund's reservation back.
UPDATE charges
SET amount_refunded = amount_refunded - @amount, updated_at = now()
WHERE caller_id = @caller_id AND id = @id;

-- name: CreateRefund :one
INSERT INTO refunds (caller_id, id, charge_id, idempotency_key_id, amount, downstream_key)
VALUES (@caller_id, @id, @charge_id, @idempotency_key_id, @amount, @downstream_key)
RETURNING *;

-- name: GetRefundByKeyRecord :one
SELECT * FROM refunds
WHERE caller_id = @caller_id AND idempotency_key_id = @idempotency_key_id;

-- name: SucceedRefund :one
UPDATE refunds
SET status = 'succeeded', processor_refund_id = @processor_refund_id, updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: FailRefund :one
UPDATE refunds
SET status = 'failed', updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: GetRefund :one
SELECT * FROM refunds
WHERE caller_id = @caller_id AND id = @id;

-- name: ListRefundsOfCharge :many
-- A charge's refunds, oldest first. Keyset pagination: the page starts
-- strictly after the (created_at, id) of the starting_after refund, which
-- the caller looked up first. Served by refunds_charge_created.
SELECT * FROM refunds
WHERE caller_id = @caller_id AND charge_id = @charge_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) > (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at, id
LIMIT @row_limit;

-- name: GetRefundByDownstreamKey :one
SELECT * FROM refunds
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;
