-- Charges: an external effect (a card charge at the processor) made
-- exactly-once in effect by atomic phases on the key record (see
-- internal/charges).
CREATE TABLE charges (
    caller_id           text        NOT NULL REFERENCES callers (id),
    id                  text        NOT NULL,
    order_id            text        NOT NULL,
    -- The key record whose operation created this charge. A request that
    -- takes the record over finds its charge again through it. Not a
    -- foreign key: the sweeper deletes key records after the retention
    -- window, and the charge outlives its key.
    idempotency_key_id  bigint      NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL,
    payment_method      text        NOT NULL,
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed')),
    -- The decline code of a failed charge.
    failure_code        text,
    -- The Idempotency-Key sent to the processor: fixed when the charge row
    -- is created, so every attempt (the first, a client's retry after a
    -- crash, the reconciler) sends the same one and the processor collapses
    -- them into one effect.
    downstream_key      text        NOT NULL,
    processor_charge_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id),
    UNIQUE (caller_id, idempotency_key_id),
    UNIQUE (caller_id, downstream_key),
    FOREIGN KEY (caller_id, order_id) REFERENCES orders (caller_id, id),
    CONSTRAINT failed_has_code CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);

-- An order has at most one charge that is pending or succeeded, whatever
-- the keys. A second charge cannot even be created while one is live, so
-- the processor is never asked to charge one order twice; a declined
-- (failed) charge frees the order for another attempt.
CREATE UNIQUE INDEX charges_one_live_per_order
    ON charges (caller_id, order_id) WHERE status IN ('pending', 'succeeded');
