-- Back to one balances row per caller and currency, summed from the entries.
CREATE TABLE balances (
    caller_id  text        NOT NULL REFERENCES callers (id),
    currency   text        NOT NULL,
    available  bigint      NOT NULL DEFAULT 0,
    pending    bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, currency),
    CONSTRAINT balance_not_overdrawn CHECK (available >= 0),
    CONSTRAINT balance_pending_not_negative CHECK (pending >= 0)
);
INSERT INTO balances (caller_id, currency, available, pending)
SELECT caller_id, currency,
       coalesce(sum(amount) FILTER (WHERE to_account = 'available'), 0) - coalesce(sum(amount) FILTER (WHERE from_account = 'available'), 0),
       coalesce(sum(amount) FILTER (WHERE to_account = 'pending'), 0) - coalesce(sum(amount) FILTER (WHERE from_account = 'pending'), 0)
FROM ledger_entries
GROUP BY caller_id, currency;

DROP FUNCTION ledger_debit(text, text, bigint, text, text);
DROP FUNCTION ledger_roll_up(text, text);
DROP FUNCTION ledger_balance(text, text);
DROP TABLE ledger_checkpoints;
DROP TABLE ledger_entries;
