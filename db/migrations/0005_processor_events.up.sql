-- Webhook deduplication: the id of every processor event applied, written
-- in the same transaction that applies it, so a redelivery is recognised
-- and changes nothing. Tenant-owned (the caller is the one whose charge or
-- refund the event is about), so it lives on the caller's shard with the
-- rows the event changes.
CREATE TABLE processor_events (
    caller_id   text        NOT NULL REFERENCES callers (id),
    event_id    text        NOT NULL,
    type        text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, event_id)
);
