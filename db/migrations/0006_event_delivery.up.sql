-- Delivery of the outbox: each caller's webhook endpoint, and the state of
-- each event's delivery.

-- Where a caller's events are delivered, and the secret they are signed
-- with: random per caller (122 bits from gen_random_uuid), so no caller can
-- forge another's deliveries. A NULL URL means the server's built-in demo
-- receiver.
ALTER TABLE callers
    ADD COLUMN webhook_url    text,
    ADD COLUMN webhook_secret text NOT NULL
        DEFAULT 'whsec_' || replace(gen_random_uuid()::text, '-', '');

ALTER TABLE events
    ADD COLUMN delivered_at      timestamptz,
    ADD COLUMN delivery_attempts integer     NOT NULL DEFAULT 0,
    -- When the relay may (next) try to deliver it. Claiming an event moves
    -- this forward by the relay's lease, so two relays do not deliver it at
    -- the same moment; delivery is still at least once, not exactly once.
    ADD COLUMN next_attempt_at   timestamptz NOT NULL DEFAULT now();

-- The relay's queue: undelivered events, oldest due first.
CREATE INDEX events_undelivered ON events (next_attempt_at) WHERE delivered_at IS NULL;

-- The built-in demo receiver's record of what it received: deliveries are
-- at least once, so it deduplicates on the event id and counts repeats.
CREATE TABLE demo_received_events (
    caller_id   text        NOT NULL REFERENCES callers (id),
    event_id    text        NOT NULL,
    type        text        NOT NULL,
    deliveries  integer     NOT NULL DEFAULT 1,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, event_id)
);
