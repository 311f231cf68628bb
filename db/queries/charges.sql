-- name: CreateCharge :exec
-- The unique index charges_one_live_per_order refuses a second live
-- charge of one order (a 409, declared in internal/charges).
INSERT INTO charges (caller_id, id, order_id, idempotency_key_id, amount, currency, payment_method, downstream_key)
VALUES (@caller_id, @id, @order_id, @idempotency_key_id, @amount, @currency, @payment_method, @downstream_key);

-- name: GetChargeByKeyRecord :one
SELECT * FROM charges
WHERE caller_id = @caller_id AND idempotency_key_id = @idempotency_key_id;

-- name: GetCharge :one
SELECT * FROM charges
WHERE caller_id = @caller_id AND id = @id;

-- name: SucceedCharge :one
-- Only a pending charge moves; running it twice changes nothing.
UPDATE charges
SET status = 'succeeded', processor_charge_id = @processor_charge_id, updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: FailCharge :one
UPDATE charges
SET status = 'failed', failure_code = @failure_code, processor_charge_id = @processor_charge_id, updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: OrderHasLiveCharge :one
-- Whether the order has a charge that is pending or succeeded. Run after
-- LockOrder in the same transaction: the lock waits for any charge being
-- created, and this later statement's snapshot then sees it.
SELECT EXISTS (
    SELECT 1 FROM charges
    WHERE caller_id = @caller_id AND order_id = @order_id AND status IN ('pending', 'succeeded')
);

-- name: GetChargeByDownstreamKey :one
SELECT * FROM charges
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;
