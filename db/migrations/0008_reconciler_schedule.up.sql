-- The reconciler gets a schedule of its own, separate from the lease.
--
-- locked_until means one thing only: a live owner is working on this record
-- until then. Before this migration the reconciler also wrote its backoff
-- there, so a record that nobody was working on looked held: a client's own
-- retry was refused with 409 idempotency_key_in_use (and a false
-- Retry-After) for as long as the backoff lasted, minutes after the
-- processor had recovered.
--
-- next_attempt_at is when the reconciler may next take the record over; it
-- has no meaning once the record is completed or dead. A client retry
-- ignores it: a record whose lease is not live can be resumed by the client
-- at once, because the client is the freshest sign that the caller still
-- wants the operation.
--
-- reconciler_attempts counts the reconciler's own takeovers, which drive
-- its backoff and its dead-letter decision. attempt, the fencing token,
-- also counts a client's takeovers: a client retrying through an outage
-- must not use up the reconciler's patience.
ALTER TABLE idempotency_keys
    ADD COLUMN next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN reconciler_attempts integer     NOT NULL DEFAULT 0 CHECK (reconciler_attempts >= 0);

-- A record written by the old code carried its backoff in locked_until.
-- Move it to next_attempt_at, and end every lease now: the old backoffs
-- would otherwise keep clients locked out until they ran out, and the old
-- code cannot tell us which leases are live owners'. Ending a live owner's
-- lease is safe: its next write is fenced (it needs a live lease) and rolls
-- back, and whoever takes over resumes from the recovery point under the
-- same downstream key.
UPDATE idempotency_keys SET next_attempt_at = locked_until WHERE status = 'in_progress';
UPDATE idempotency_keys SET locked_until = now() WHERE status = 'in_progress' AND locked_until > now();

-- The reconciler now scans by its own schedule.
DROP INDEX idempotency_keys_in_progress_locked_until;
CREATE INDEX idempotency_keys_in_progress_next_attempt_at
    ON idempotency_keys (next_attempt_at) WHERE status = 'in_progress';
