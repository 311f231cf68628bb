-- The first schema. It is "shard-ready" (see docs/design.md): every
-- tenant-owned table carries caller_id, every primary key and unique
-- constraint includes it, and foreign keys between tenant tables are
-- composite with it. Under Citus each tenant table would be distributed by
-- caller_id, so one caller's key record and the rows its request writes live
-- on one shard and the claim and the effect stay single-shard transactions.
-- internal/postgres/catalog_test.go reads the catalog and fails when a table
-- breaks these rules.

-- callers are the tenants. This is a small reference table (under Citus it
-- would be replicated to every node), not a tenant table: it is the thing
-- caller_id refers to.
CREATE TABLE callers (
    id           text        PRIMARY KEY,
    name         text        NOT NULL,
    -- SHA-256 of the API key. API keys are long random secrets, so a fast
    -- hash is enough (no password-style stretching needed) and lets the key
    -- be looked up by its hash. The key itself is never stored.
    api_key_hash bytea       NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per (caller, Idempotency-Key): the record of one logical operation.
CREATE TABLE idempotency_keys (
    caller_id           text        NOT NULL REFERENCES callers (id),
    -- A surrogate id, unique per row ever created, so that a key reused
    -- after the retention window (a new operation) gets a new identity.
    -- (The downstream key sent to the processor was once derived from it;
    -- it is now derived from the request: cardprocessor.DownstreamKey.)
    id                  bigint      GENERATED ALWAYS AS IDENTITY,
    key                 text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    status              text        NOT NULL DEFAULT 'in_progress'
                                    CHECK (status IN ('in_progress', 'completed', 'dead')),
    -- The last phase boundary this operation passed. A request that takes
    -- over an expired lease resumes from here.
    recovery_point      text        NOT NULL DEFAULT 'started',
    -- The fencing token: 1 for the first owner, incremented on every
    -- takeover. Every phase and give-up write is conditional on it.
    attempt             integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    -- The lease, on the database clock. Only an in-progress record has one.
    locked_until        timestamptz,
    request_method      text        NOT NULL,
    request_path        text        NOT NULL,
    -- SHA-256 over method, path and canonical body. The body itself is not stored.
    request_fingerprint bytea       NOT NULL,
    response_status     integer,
    -- Only allow-listed headers (Content-Type, Location, Content-Encoding).
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    PRIMARY KEY (caller_id, id),
    UNIQUE (caller_id, key),
    CONSTRAINT in_progress_has_lease
        CHECK ((status = 'in_progress') = (locked_until IS NOT NULL)),
    CONSTRAINT completed_has_response
        CHECK ((status = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL))
);

-- The sweeper deletes completed records past the retention window in
-- created_at order; this partial index lets each batch start at the oldest
-- without scanning the table.
CREATE INDEX idempotency_keys_completed_created_at
    ON idempotency_keys (created_at) WHERE status = 'completed';

-- The reconciler looks for in-progress records whose lease has expired.
CREATE INDEX idempotency_keys_in_progress_locked_until
    ON idempotency_keys (locked_until) WHERE status = 'in_progress';

CREATE TABLE orders (
    caller_id   text        NOT NULL REFERENCES callers (id),
    id          text        NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    description text,
    status      text        NOT NULL DEFAULT 'pending'
                            CHECK (status IN ('pending', 'paid', 'canceled')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller_id, id)
);

-- Lists are newest first with keyset pagination on (created_at, id).
CREATE INDEX orders_caller_created ON orders (caller_id, created_at DESC, id DESC);
