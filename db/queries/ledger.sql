-- name: InsertLedgerEntry :exec
-- A movement that needs no check: a credit, a settlement, a release. An
-- INSERT, so that no two of them wait on each other.
INSERT INTO ledger_entries (caller_id, id, currency, amount, from_account, to_account, object_id)
VALUES (@caller_id, @id, @currency, @amount, @from_account, @to_account, @object_id);

-- name: DebitLedger :exec
-- Move amount from available to pending, or fail with RS002 if available
-- does not cover it (ledger_debit, migration 0026).
SELECT ledger_debit(@caller_id, @currency, @amount::bigint, @id, @object_id);

-- name: ListBalances :many
-- Every currency the caller has entries in (a skip scan of the
-- ledger_entries_since index: one probe per currency, however many
-- entries), each with its balance.
WITH RECURSIVE currencies AS (
    (SELECT e.currency FROM ledger_entries e WHERE e.caller_id = @caller_id ORDER BY e.currency LIMIT 1)
    UNION ALL
    SELECT (SELECT e.currency FROM ledger_entries e WHERE e.caller_id = @caller_id AND e.currency > c.currency
            ORDER BY e.currency LIMIT 1)
    FROM currencies c
    WHERE c.currency IS NOT NULL
)
SELECT c.currency::text AS currency, b.available::bigint AS available, b.pending::bigint AS pending,
       b.since_entries::bigint AS since_entries
FROM currencies c, ledger_balance(@caller_id, c.currency) b
WHERE c.currency IS NOT NULL
ORDER BY c.currency;

-- name: RollUpLedger :exec
SELECT ledger_roll_up(@caller_id, @currency);

-- name: GetLedgerEntry :one
SELECT id, created_at FROM ledger_entries
WHERE caller_id = @caller_id AND id = @id;

-- name: ListLedgerEntries :many
-- Newest first. Keyset pagination, as for orders.
SELECT id, currency, amount, from_account, to_account, object_id, created_at FROM ledger_entries
WHERE caller_id = @caller_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;
