-- The ledger: money moves as immutable entries, and a balance is derived
-- from them.
--
-- Until now each caller had one balances row per currency that every
-- succeeded charge updated, so all of one merchant's charges queued on that
-- row's lock: its biggest customer's rate was one over the lock's hold
-- time. A credit is now an INSERT, which waits on nobody.
--
-- An entry moves amount from one of the caller's accounts to another, so
-- each movement sums to zero by construction (double entry, in one row):
--
--   processor -> available   a charge succeeded
--   available -> pending     a refund or payout was accepted (the debit)
--   pending   -> processor   it succeeded: the money left
--   pending   -> available   it failed: the money is back
--
-- "processor" is the world outside: its balance is minus the others'.
CREATE TABLE ledger_entries (
    caller_id    text        NOT NULL REFERENCES callers (id),
    id           text        NOT NULL,
    currency     text        NOT NULL,
    amount       bigint      NOT NULL CHECK (amount > 0),
    from_account text        NOT NULL CHECK (from_account IN ('processor', 'available', 'pending')),
    to_account   text        NOT NULL CHECK (to_account IN ('processor', 'available', 'pending')),
    -- The charge, refund or payout whose money it moves.
    object_id    text        NOT NULL,
    -- The transaction that wrote it: what a checkpoint's horizon counts in.
    tx_id        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id),
    CONSTRAINT ledger_entry_moves CHECK (from_account <> to_account)
);

-- GET /v1/ledger_entries, newest first.
CREATE INDEX ledger_entries_by_time ON ledger_entries (caller_id, created_at, id);

-- A balance's entries since its checkpoint, read from the index alone.
CREATE INDEX ledger_entries_since ON ledger_entries (caller_id, currency, tx_id)
    INCLUDE (amount, from_account, to_account);

-- A checkpoint: a caller's available and pending in one currency, summed
-- over every entry written by a transaction before horizon, and over none
-- after it. A balance is its checkpoint plus the entries since, so reading
-- one never scans the whole history.
--
-- The horizon is a transaction id, not an entry's id or time: entries
-- commit in another order than they are numbered, and a checkpoint "up to
-- entry N" could miss one that commits later. A roll-up moves the horizon
-- to the oldest transaction still running when it reads (its snapshot's
-- xmin): every transaction before that has ended, so every entry it wrote
-- is either committed and summed, or rolled back and gone.
--
-- The row is also the debit's lock: ledger_debit takes it FOR UPDATE, so
-- debits of one caller and currency run one at a time (and credits, which
-- never touch it, not at all).
CREATE TABLE ledger_checkpoints (
    caller_id text   NOT NULL REFERENCES callers (id),
    currency  text   NOT NULL,
    available bigint NOT NULL DEFAULT 0,
    pending   bigint NOT NULL DEFAULT 0,
    horizon   xid8   NOT NULL DEFAULT '0',
    -- No CHECK (available >= 0): transaction ids are not commit order, so
    -- a horizon may fall between a debit and the credit it relied on. The
    -- whole balance never goes below zero (ledger_debit); a checkpoint's
    -- part of it may.
    PRIMARY KEY (caller_id, currency)
);

-- A balance: the checkpoint (if any) plus the entries since its horizon.
-- since_entries is how many entries that was, for the reader to decide
-- whether to roll up.
CREATE FUNCTION ledger_balance(p_caller text, p_currency text,
    OUT available bigint, OUT pending bigint, OUT since_entries bigint)
LANGUAGE sql STABLE AS $$
    WITH cp AS (
        SELECT c.available, c.pending, c.horizon FROM ledger_checkpoints c
        WHERE c.caller_id = p_caller AND c.currency = p_currency
    )
    SELECT coalesce((SELECT cp.available FROM cp), 0)
             + coalesce(sum(e.amount) FILTER (WHERE e.to_account = 'available'), 0)
             - coalesce(sum(e.amount) FILTER (WHERE e.from_account = 'available'), 0),
           coalesce((SELECT cp.pending FROM cp), 0)
             + coalesce(sum(e.amount) FILTER (WHERE e.to_account = 'pending'), 0)
             - coalesce(sum(e.amount) FILTER (WHERE e.from_account = 'pending'), 0),
           count(*)
    FROM ledger_entries e
    WHERE e.caller_id = p_caller AND e.currency = p_currency
      AND e.tx_id >= coalesce((SELECT cp.horizon FROM cp), '0'::xid8)
$$;

-- Roll a checkpoint up to now: add the entries of every transaction that
-- has ended since its horizon, and move the horizon on. Under the
-- checkpoint's lock, so two roll-ups (or a roll-up and a debit) never
-- interleave; the UPDATE takes its snapshot after the lock, so it sees
-- every debit that held the lock before.
CREATE FUNCTION ledger_roll_up(p_caller text, p_currency text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_checkpoints (caller_id, currency) VALUES (p_caller, p_currency) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM ledger_checkpoints WHERE caller_id = p_caller AND currency = p_currency FOR UPDATE;
    UPDATE ledger_checkpoints c
    SET available = c.available + s.available, pending = c.pending + s.pending, horizon = s.horizon
    FROM (
        SELECT h.horizon,
               coalesce(sum(e.amount) FILTER (WHERE e.to_account = 'available'), 0)
                 - coalesce(sum(e.amount) FILTER (WHERE e.from_account = 'available'), 0) AS available,
               coalesce(sum(e.amount) FILTER (WHERE e.to_account = 'pending'), 0)
                 - coalesce(sum(e.amount) FILTER (WHERE e.from_account = 'pending'), 0) AS pending
        FROM ledger_checkpoints old
        CROSS JOIN LATERAL (SELECT greatest(old.horizon, pg_snapshot_xmin(pg_current_snapshot())) AS horizon) h
        LEFT JOIN ledger_entries e ON e.caller_id = p_caller AND e.currency = p_currency
             AND e.tx_id >= old.horizon AND e.tx_id < h.horizon
        WHERE old.caller_id = p_caller AND old.currency = p_currency
        GROUP BY h.horizon
    ) s
    WHERE c.caller_id = p_caller AND c.currency = p_currency;
END
$$;

-- The debit: move amount from available to pending for a refund or payout,
-- or refuse with SQLSTATE RS002 if available does not cover it. The check
-- and the entry are one statement under the checkpoint's lock, held to the
-- end of the transaction: a concurrent debit waits, then reads a balance
-- that includes this one. So no interleaving overdraws, and the lock is
-- held for as short a time as the caller sends this before its COMMIT.
-- Credits never wait: they only add, and a debit that misses a credit
-- still being committed refuses at worst what a moment later it would
-- allow. A long tail of entries is rolled up first, so the check stays
-- cheap.
CREATE FUNCTION ledger_debit(p_caller text, p_currency text, p_amount bigint, p_id text, p_object text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b record;
BEGIN
    INSERT INTO ledger_checkpoints (caller_id, currency) VALUES (p_caller, p_currency) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM ledger_checkpoints WHERE caller_id = p_caller AND currency = p_currency FOR UPDATE;
    SELECT * INTO b FROM ledger_balance(p_caller, p_currency); -- a snapshot taken after the lock
    IF b.since_entries > 1000 THEN
        PERFORM ledger_roll_up(p_caller, p_currency);
    END IF;
    IF b.available < p_amount THEN
        RAISE EXCEPTION 'the debit of % % is more than the available balance', p_amount, p_currency
            USING ERRCODE = 'RS002';
    END IF;
    INSERT INTO ledger_entries (caller_id, id, currency, amount, from_account, to_account, object_id)
    VALUES (p_caller, p_id, p_currency, p_amount, 'available', 'pending', p_object);
END
$$;

-- The balances kept until now become opening entries, so that every
-- balance is the sum of its entries from the start.
INSERT INTO ledger_entries (caller_id, id, currency, amount, from_account, to_account, object_id)
SELECT caller_id, 'le_opening_' || currency || '_available', currency, available + pending, 'processor', 'available', 'balances'
FROM balances WHERE available + pending > 0;
INSERT INTO ledger_entries (caller_id, id, currency, amount, from_account, to_account, object_id)
SELECT caller_id, 'le_opening_' || currency || '_pending', currency, pending, 'available', 'pending', 'balances'
FROM balances WHERE pending > 0;

DROP TABLE balances;
