-- The transactional outbox: every follow-on event (order.paid,
-- charge.succeeded, charge.failed, refund.succeeded) is inserted in the
-- same transaction as the change it describes, so an event exists if and
-- only if its change committed. GET /v1/events lists them; a relay
-- delivers them.
CREATE TABLE events (
    caller_id  text        NOT NULL REFERENCES callers (id),
    id         text        NOT NULL,
    type       text        NOT NULL
               CHECK (type IN ('order.paid', 'charge.succeeded', 'charge.failed', 'refund.succeeded')),
    data       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id)
);

-- Lists are newest first with keyset pagination on (created_at, id).
CREATE INDEX events_caller_created ON events (caller_id, created_at DESC, id DESC);
