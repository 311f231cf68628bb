-- name: CreditBalance :exec
-- Add a succeeded charge's amount to what the caller can pay out.
INSERT INTO balances (caller_id, currency, available)
VALUES (@caller_id, @currency, @amount::bigint)
ON CONFLICT (caller_id, currency)
DO UPDATE SET available = balances.available + EXCLUDED.available, updated_at = now();

-- name: DebitBalance :execrows
-- Take amount from available and hold it in pending, for a refund or a
-- payout being created. The CHECK balance_not_overdrawn refuses a debit
-- past zero; no row (a currency never charged in) debits nothing: the
-- caller reads 0 rows as "not enough".
UPDATE balances
SET available = available - @amount::bigint, pending = pending + @amount::bigint, updated_at = now()
WHERE caller_id = @caller_id AND currency = @currency;

-- name: SettleBalance :exec
-- A refund or payout that held amount in pending succeeded: the money has
-- left.
UPDATE balances
SET pending = pending - @amount::bigint, updated_at = now()
WHERE caller_id = @caller_id AND currency = @currency;

-- name: RestoreBalance :exec
-- A refund or payout that held amount in pending failed: the money is
-- available again.
UPDATE balances
SET available = available + @amount::bigint, pending = pending - @amount::bigint, updated_at = now()
WHERE caller_id = @caller_id AND currency = @currency;

-- name: ListBalances :many
SELECT * FROM balances
WHERE caller_id = @caller_id
ORDER BY currency;
