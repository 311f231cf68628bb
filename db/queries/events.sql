-- name: InsertEvent :exec
-- traceparent is the trace context of the work that wrote the event (NULL
-- when it is not traced), for the relay's deliveries to link to.
INSERT INTO events (caller_id, id, type, data, traceparent)
VALUES (@caller_id, @id, @type, @data, sqlc.narg(traceparent));

-- name: GetEvent :one
SELECT * FROM events
WHERE caller_id = @caller_id AND id = @id;

-- name: ListEvents :many
-- Newest first, keyset pagination as for orders.
SELECT * FROM events
WHERE caller_id = @caller_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: ClaimUndeliveredEvents :many
-- The relay's claim: due, undelivered events, with their caller's endpoint.
-- Every caller's first due event comes before anyone's second, so one
-- caller's backlog takes one place in the batch, not all of them; of
-- events due at once, the least tried first, so one that always fails
-- cannot hold back the rest. SKIP
-- LOCKED lets several relays share the queue; pushing next_attempt_at
-- forward by the lease keeps another relay off an event while this one
-- delivers it.
WITH ranked AS (
    SELECT caller_id, id, next_attempt_at,
           row_number() OVER (PARTITION BY caller_id ORDER BY next_attempt_at, delivery_attempts, id) AS place
    FROM events
    WHERE delivered_at IS NULL AND next_attempt_at <= now()
), due AS (
    SELECT e.caller_id, e.id FROM events e JOIN ranked r ON r.caller_id = e.caller_id AND r.id = e.id
    WHERE e.delivered_at IS NULL AND e.next_attempt_at <= now()
    ORDER BY r.place, r.next_attempt_at
    LIMIT @max_events
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE events e
SET next_attempt_at = now() + make_interval(secs => @lease_seconds::float8),
    delivery_attempts = e.delivery_attempts + 1
FROM due, callers c
WHERE e.caller_id = due.caller_id AND e.id = due.id AND c.id = e.caller_id
RETURNING e.caller_id, e.id, e.type, e.data, e.created_at, e.delivery_attempts, e.traceparent, c.webhook_url, c.webhook_secret,
    coalesce(CASE WHEN c.previous_webhook_secret_until > now() THEN c.previous_webhook_secret END, '')::text AS previous_webhook_secret;

-- name: ParkEvent :exec
-- An event of a caller with no webhook URL is not pushed: it waits, never
-- due, for the caller to pull it (GET /v1/events) or to set a URL
-- (UnparkCallerEvents). The claim's attempt is given back.
UPDATE events SET next_attempt_at = 'infinity', delivery_attempts = delivery_attempts - 1
WHERE caller_id = @caller_id AND id = @id AND delivered_at IS NULL;

-- name: UnparkCallerEvents :exec
UPDATE events SET next_attempt_at = now()
WHERE caller_id = @caller_id AND delivered_at IS NULL AND next_attempt_at = 'infinity';

-- name: MarkEventDelivered :exec
UPDATE events SET delivered_at = now()
WHERE caller_id = @caller_id AND id = @id;

-- name: RetryEventAfter :exec
-- A failed delivery puts off the event, and the caller's other due events
-- with it: an endpoint that fails or hangs is tried again after the
-- backoff, not once for each event waiting for it.
UPDATE events SET next_attempt_at = now() + make_interval(secs => @delay_seconds::float8)
WHERE caller_id = @caller_id AND delivered_at IS NULL AND (id = @id OR next_attempt_at <= now());

-- name: RecordDemoDelivery :one
-- The demo receiver's deduplication: the first delivery inserts, a repeat
-- only counts. Returns the number of deliveries so far.
INSERT INTO demo_received_events (caller_id, event_id, type)
VALUES (@caller_id, @event_id, @type)
ON CONFLICT (caller_id, event_id) DO UPDATE SET deliveries = demo_received_events.deliveries + 1
RETURNING deliveries;

-- name: ListDemoDeliveries :many
-- What the demo receiver got for the caller, newest first: each event once,
-- with how many times it was delivered (a count above one is a duplicate
-- the receiver dropped).
SELECT * FROM demo_received_events
WHERE caller_id = @caller_id
ORDER BY received_at DESC, event_id DESC
LIMIT @row_limit;

-- name: OutboxLagSeconds :one
-- The age of the oldest undelivered event, for the relay's lag gauge (0
-- when none waits). Read across callers, as the relay's claim is; the
-- undelivered events are a small set, found through events_undelivered.
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS lag
FROM events
WHERE delivered_at IS NULL AND next_attempt_at < 'infinity';

-- name: SetCallerWebhookURL :one
-- Where the caller's events are pushed; NULL: nowhere (it pulls them).
UPDATE callers SET webhook_url = sqlc.narg(webhook_url)
WHERE id = @id
RETURNING webhook_secret;

-- name: RotateCallerWebhookSecret :one
-- A new secret; the one it replaces goes on signing beside it for the
-- overlap.
UPDATE callers
SET previous_webhook_secret = webhook_secret,
    previous_webhook_secret_until = now() + make_interval(secs => @overlap_seconds::float8),
    webhook_secret = @webhook_secret
WHERE id = @id
RETURNING previous_webhook_secret_until::timestamptz;
