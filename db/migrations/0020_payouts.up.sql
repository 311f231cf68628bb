-- Payouts, and the balance they are paid from.

-- What each caller holds, per currency, kept in the transactions that move
-- money: a charge that succeeds adds its amount to available; a refund or a
-- payout takes its amount from available when it is created, holding it in
-- pending until it reaches a final state, and gives it back to available
-- if it fails.
--
-- available >= 0 is the guarantee that no payout (or refund) can overdraw
-- the balance, whatever the concurrency: every debit is one UPDATE of this
-- row, so concurrent debits queue on its row lock, and the one that would
-- take available below zero fails the CHECK. No application check can be
-- forgotten or raced past.
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

-- The balances of the charges and refunds made before this migration:
-- succeeded charges, less what refunds have reserved (amount_refunded
-- counts pending and succeeded refunds); pending refunds are pending.
INSERT INTO balances (caller_id, currency, available, pending)
SELECT c.caller_id, c.currency,
       sum(c.amount - c.amount_refunded),
       coalesce((SELECT sum(r.amount) FROM refunds r JOIN charges rc ON rc.caller_id = r.caller_id AND rc.id = r.charge_id
                 WHERE r.caller_id = c.caller_id AND rc.currency = c.currency AND r.status = 'pending'), 0)
FROM charges c
WHERE c.status = 'succeeded'
GROUP BY c.caller_id, c.currency;

-- A payout: money sent from the balance to a bank account, a long-running
-- operation. POST /v1/payouts creates the row (pending), debits the balance
-- and enqueues its job in one transaction; the job (internal/payouts) asks
-- the processor for the transfer (in_transit) and follows it to paid or
-- failed.
CREATE TABLE payouts (
    caller_id           text        NOT NULL REFERENCES callers (id),
    id                  text        NOT NULL,
    -- The key record of the request that created it (not a foreign key:
    -- the sweeper deletes key records after the retention window).
    idempotency_key_id  bigint      NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL,
    destination         text        NOT NULL,
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'in_transit', 'paid', 'failed')),
    failure_code        text,
    -- The Idempotency-Key the job sends to the processor, fixed here so
    -- that every run of the job (River's retries, a rescue after a crash)
    -- asks for the same transfer.
    downstream_key      text        NOT NULL,
    processor_payout_id text,
    -- When the processor expects the transfer to arrive: the poll hint.
    arrives_at          timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id),
    UNIQUE (caller_id, idempotency_key_id),
    UNIQUE (caller_id, downstream_key),
    CONSTRAINT payout_failed_has_code CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);

-- GET /v1/payouts: newest first, keyset pagination.
CREATE INDEX payouts_created ON payouts (caller_id, created_at, id);

-- The payouts' events.
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check
    CHECK (type IN ('order.paid', 'charge.succeeded', 'charge.failed', 'refund.succeeded', 'payout.paid', 'payout.failed'));
