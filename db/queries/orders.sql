-- name: CreateOrder :one
-- The id is the service's (postgres.IDs, as for every table); the time
-- is the database's, as everywhere else.
INSERT INTO orders (caller_id, id, amount, currency, description)
VALUES (@caller_id, @id, @amount, @currency, @description)
RETURNING *;

-- name: GetOrder :one
SELECT * FROM orders
WHERE caller_id = @caller_id AND id = @id;

-- name: ListOrders :many
-- Newest first. Keyset pagination: the page starts strictly after the
-- (created_at, id) of the starting_after order, which the caller looked up
-- first (so an unknown cursor is an error, not an empty page).
SELECT * FROM orders
WHERE caller_id = @caller_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: CancelOrder :one
-- Only a pending order moves to canceled. The caller has locked the order
-- (LockOrder) and checked it has no live charge in the same transaction.
UPDATE orders
SET status = 'canceled', updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending'
RETURNING *;

-- name: LockOrder :exec
-- Locks the order until the end of the transaction, so that creating a
-- charge and canceling the order are ordered one after the other.
SELECT 1 FROM orders
WHERE caller_id = @caller_id AND id = @id
FOR UPDATE;

-- name: MarkOrderPaid :exec
-- Under the order's lock, by the phase that records its charge's success:
-- a live charge keeps an order pending (cancel refuses it, and no other
-- charge of it can exist), so this always moves it.
UPDATE orders
SET status = 'paid', updated_at = now()
WHERE caller_id = @caller_id AND id = @id AND status = 'pending';
