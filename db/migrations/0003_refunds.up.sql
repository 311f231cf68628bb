-- Refunds of succeeded charges.

-- How much of the charge is refunded or being refunded. A refund reserves
-- its amount here in its first phase, under the row lock; the CHECK makes
-- refunding more than was charged impossible, whatever the concurrency.
ALTER TABLE charges
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT refunds_within_charge CHECK (amount_refunded BETWEEN 0 AND amount);

CREATE TABLE refunds (
    caller_id           text        NOT NULL REFERENCES callers (id),
    id                  text        NOT NULL,
    charge_id           text        NOT NULL,
    -- The key record whose operation created this refund (see charges).
    idempotency_key_id  bigint      NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed')),
    downstream_key      text        NOT NULL,
    processor_refund_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id),
    UNIQUE (caller_id, idempotency_key_id),
    UNIQUE (caller_id, downstream_key),
    FOREIGN KEY (caller_id, charge_id) REFERENCES charges (caller_id, id)
);
