-- name: SweepIdempotencyKeys :execrows
-- One bounded batch of completed records past the retention window, oldest
-- first, through the partial index on created_at. SKIP LOCKED lets several
-- sweepers run at once, each deleting different rows, and never waits on a
-- row a request holds. In-progress and dead records are never deleted
-- here: their external effect may be unresolved.
DELETE FROM idempotency_keys
WHERE (caller_id, id) IN (
    SELECT caller_id, id FROM idempotency_keys
    WHERE status = 'completed'
      AND created_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY created_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
);

-- name: CountSweepableIdempotencyKeys :one
-- What SweepIdempotencyKeys would delete, for a dry run.
SELECT count(*) FROM idempotency_keys
WHERE status = 'completed'
  AND created_at < now() - make_interval(secs => @retention_seconds::float8);

-- name: CountStaleInProgressKeys :one
-- In-progress records older than the window: left for the reconciler (and
-- its dead-letter list), counted and logged, never deleted.
SELECT count(*) FROM idempotency_keys
WHERE status = 'in_progress'
  AND created_at < now() - make_interval(secs => @retention_seconds::float8);

-- name: SweepDeliveredEvents :execrows
DELETE FROM events
WHERE (caller_id, id) IN (
    SELECT caller_id, id FROM events
    WHERE delivered_at IS NOT NULL
      AND delivered_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY delivered_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
);

-- name: SweepParkedEvents :execrows
-- The events of a caller with no webhook URL, which it pulls: kept as long
-- as delivered ones (found through events_undelivered).
DELETE FROM events
WHERE (caller_id, id) IN (
    SELECT caller_id, id FROM events
    WHERE delivered_at IS NULL AND next_attempt_at = 'infinity'
      AND created_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY created_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
);

-- name: SweepDemoReceivedEvents :execrows
-- What the demo's receiver got, kept as long as the events themselves.
DELETE FROM demo_received_events
WHERE (caller_id, event_id) IN (
    SELECT caller_id, event_id FROM demo_received_events
    WHERE received_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY received_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
);

-- name: CountSweepableEvents :one
SELECT ((SELECT count(*) FROM events
        WHERE delivered_at IS NOT NULL
          AND delivered_at < now() - make_interval(secs => @retention_seconds::float8))
     + (SELECT count(*) FROM events
        WHERE delivered_at IS NULL AND next_attempt_at = 'infinity'
          AND created_at < now() - make_interval(secs => @retention_seconds::float8))
     + (SELECT count(*) FROM demo_received_events
        WHERE received_at < now() - make_interval(secs => @retention_seconds::float8)))::bigint;

-- name: SweepProcessorEvents :execrows
DELETE FROM processor_events
WHERE (caller_id, event_id) IN (
    SELECT caller_id, event_id FROM processor_events
    WHERE received_at < now() - make_interval(secs => @retention_seconds::float8)
      AND contradiction IS NULL -- set aside for an operator: never swept
    ORDER BY received_at
    LIMIT @batch
    FOR UPDATE SKIP LOCKED
);

-- name: CountSweepableProcessorEvents :one
SELECT count(*) FROM processor_events
WHERE received_at < now() - make_interval(secs => @retention_seconds::float8)
  AND contradiction IS NULL;
