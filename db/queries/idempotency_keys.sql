-- name: TakeOverIdempotencyKey :one
-- A client's retry takes over an in-progress record that no live owner
-- holds (its owner crashed, stalled past its lease, or gave up after a
-- transient failure). The reconciler's schedule (next_attempt_at) does not
-- matter here: a client asking again is the best reason to try now.
-- Incrementing attempt is what fences the previous owner out: every later
-- write of that owner names its old attempt and matches no row. The WHERE
-- repeats every condition, so of several requests racing to take over one
-- record exactly one UPDATE matches; the others see zero rows.
UPDATE idempotency_keys
SET attempt         = attempt + 1,
    locked_until    = now() + make_interval(secs => @lease_seconds::float8),
    next_attempt_at = now() + make_interval(secs => @lease_seconds::float8),
    updated_at      = now()
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress'
  AND locked_until <= now()
RETURNING *;

-- name: SetRecoveryPoint :exec
-- Record that a phase finished. Fenced: if this owner no longer holds the
-- lease (a newer attempt took over, or the lease ran out and anyone may),
-- the statement fails with SQLSTATE RS001 (migration 0023) and the phase
-- rolls back: it is sent with the phase's COMMIT, so matching no row would
-- not be enough to stop it. The lease is checked against clock_timestamp(),
-- the time of this write, not now(), which inside a transaction is the time
-- the transaction began.
WITH moved AS (
    UPDATE idempotency_keys
    SET recovery_point = @recovery_point,
        updated_at     = now()
    WHERE caller_id = @caller_id
      AND id = @id
      AND attempt = @attempt
      AND status = 'in_progress'
      AND locked_until > clock_timestamp()
    RETURNING id
)
SELECT idempotency_lease_lost() WHERE NOT EXISTS (SELECT 1 FROM moved);

-- name: CompleteIdempotencyKey :exec
-- Store the final response and release the lease. Fenced like
-- SetRecoveryPoint, failing with RS001 when the fence is lost. An owner
-- that finishes after its lease ran out is refused even if nobody took over
-- yet: its work rolls back, and the next owner redoes it from the recovery
-- point. Only a live lease may write.
WITH completed AS (
    UPDATE idempotency_keys
    SET status           = 'completed',
        recovery_point   = 'finished',
        response_status  = @response_status,
        response_headers = @response_headers,
        response_body    = @response_body,
        locked_until     = NULL,
        completed_at     = now(),
        updated_at       = now()
    WHERE caller_id = @caller_id
      AND id = @id
      AND attempt = @attempt
      AND status = 'in_progress'
      AND locked_until > clock_timestamp()
    RETURNING id
)
SELECT idempotency_lease_lost() WHERE NOT EXISTS (SELECT 1 FROM completed);

-- name: RenewIdempotencyKeyLease :execrows
-- The owner's heartbeat: the lease runs for another lease from now. Fenced
-- like the phase writes: zero rows means this owner no longer holds the
-- lease (a newer attempt took over, or it lapsed before this renewal came),
-- and it must stop before its next write. updated_at is left alone: it
-- stamps the record's last real change, and a lease that ends later than
-- it is one that ran out rather than one given up (see the claim).
UPDATE idempotency_keys
SET locked_until    = now() + make_interval(secs => @lease_seconds::float8),
    next_attempt_at = now() + make_interval(secs => @lease_seconds::float8)
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress'
  AND locked_until > clock_timestamp();

-- name: AwaitIdempotencyKey :exec
-- A duplicate is about to wait for this record: from now on the record
-- notifies when it completes, dies, is released or is deleted (migration
-- 0021). No fence: any request may wait, and the flag changes nothing else.
UPDATE idempotency_keys
SET awaited = true
WHERE caller_id = @caller_id AND id = @id AND status = 'in_progress' AND NOT awaited;

-- name: GetIdempotencyKey :one
SELECT * FROM idempotency_keys
WHERE caller_id = @caller_id AND key = @key;

-- name: ClaimStaleIdempotencyKeys :many
-- The reconciler's takeover, in a batch: in-progress records that are due
-- on its own schedule (next_attempt_at) and that no live owner holds (their
-- owner crashed, or gave up after a transient failure and no client came
-- back). SKIP LOCKED lets several reconcilers (one per server replica)
-- share the work without waiting on each other, and each claimed record
-- gets a new attempt number, fencing out its old owner exactly as a
-- client's takeover does.
--
-- Only records this reconciler can handle: any that never passed 'started'
-- (it abandons those, whatever the operation), and those of the operations
-- it has a handler for. During a rolling deploy an older replica leaves a
-- newer operation to the replicas that know it, instead of giving up on it.
-- Every caller's first record comes before anyone's second, so one caller's
-- pile of stalled operations does not hold up another's recovery.
WITH ranked AS (
    SELECT caller_id, id, next_attempt_at,
           row_number() OVER (PARTITION BY caller_id ORDER BY next_attempt_at, id) AS place
    FROM idempotency_keys
    WHERE status = 'in_progress' AND next_attempt_at <= now() AND locked_until <= now()
      AND (recovery_point = 'started' OR operation = ANY(@operations::text[]))
), stale AS (
    SELECT k.caller_id, k.id FROM idempotency_keys k JOIN ranked r ON r.caller_id = k.caller_id AND r.id = k.id
    WHERE k.status = 'in_progress' AND k.next_attempt_at <= now() AND k.locked_until <= now()
    ORDER BY r.place, r.next_attempt_at
    LIMIT @max_records
    FOR UPDATE OF k SKIP LOCKED
)
UPDATE idempotency_keys k
SET attempt             = k.attempt + 1,
    reconciler_attempts = k.reconciler_attempts + 1,
    locked_until        = now() + make_interval(secs => @lease_seconds::float8),
    next_attempt_at     = now() + make_interval(secs => @lease_seconds::float8),
    updated_at          = now()
FROM stale
WHERE k.caller_id = stale.caller_id AND k.id = stale.id
RETURNING k.*;

-- name: ReleaseIdempotencyKey :execrows
-- Give the lease up after a transient failure. The lease ends now, so a
-- client's retry can take over at once; the reconciler's next try is
-- scheduled reconcile_after_seconds from now (its backoff, or a grace that
-- lets the client that was just told to retry come back first). The record
-- keeps its recovery point.
UPDATE idempotency_keys
SET locked_until    = now(),
    next_attempt_at = now() + make_interval(secs => @reconcile_after_seconds::float8),
    updated_at      = now()
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress';

-- name: UnclaimIdempotencyKey :execrows
-- A reconciler that claimed the record and is stopping before it tried
-- gives it back: the lease ends now and the record is due at once (a
-- client's retry, or another reconciler, may take it), and the claim's
-- count of the reconciler's tries is undone, since nothing was tried.
-- Otherwise every restart of a replica would push a record one try
-- closer to being set aside.
UPDATE idempotency_keys
SET locked_until        = now(),
    next_attempt_at     = now(),
    reconciler_attempts = greatest(reconciler_attempts - 1, 0),
    updated_at          = now()
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress';

-- name: DeleteUnstartedIdempotencyKey :execrows
-- Forget an operation that never got past its first phase: nothing was
-- done (the phase is one transaction and did not commit), so the key can
-- be freed; a client that retries with it runs the operation afresh.
DELETE FROM idempotency_keys
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress'
  AND recovery_point = 'started';

-- name: MarkIdempotencyKeyDead :execrows
-- Set an operation aside for a person: it failed too often or for too
-- long. It is never deleted while its external effect may be unresolved.
UPDATE idempotency_keys
SET status       = 'dead',
    locked_until = NULL,
    updated_at   = now()
WHERE caller_id = @caller_id
  AND id = @id
  AND attempt = @attempt
  AND status = 'in_progress';

-- name: ListDeadIdempotencyKeys :many
-- The caller's dead-letter list, oldest first, for an operator.
SELECT * FROM idempotency_keys
WHERE caller_id = @caller_id AND status = 'dead'
ORDER BY created_at;

-- name: GetIdempotencyKeyWithLease :one
-- The record and how much of its lease is left, on the database clock: for
-- an owner that lost its lease and must tell its client what became of the
-- operation.
SELECT sqlc.embed(k), coalesce(greatest(extract(epoch FROM k.locked_until - now()), 0), 0)::float8 AS lease_remaining_seconds
FROM idempotency_keys k
WHERE k.caller_id = @caller_id AND k.id = @id;

-- name: FindIdempotencyKey :one
-- A local operation's look at the record its key has: how much of its
-- lease is left and how old it is (both on the database clock, as in the
-- claim). The record is answered from (replay, 422, or busy); a completed
-- one is confirmed replicated in the same statement (ConfirmReplicated), so
-- that a replay costs this one round trip.
SELECT sqlc.embed(k),
       coalesce(greatest(extract(epoch FROM k.locked_until - now()), 0), 0)::float8 AS lease_remaining_seconds,
       greatest(extract(epoch FROM now() - k.created_at), 0)::float8 AS age_seconds,
       CASE WHEN k.status = 'completed' THEN idempotency_confirm_replicated() ELSE true END::boolean AS replicated
FROM idempotency_keys k
WHERE k.caller_id = @caller_id AND k.key = @key;

-- name: InsertIdempotencyKey :one
-- An external operation's claim, in the transaction of its first phase
-- (idempotency.Store.start): the record in progress, leased to this
-- request, its attempt 1. As InsertCompletedIdempotencyKey, the key's
-- unique index is the lock: a second request under the same key waits
-- here until this transaction ends, then fails (the key is taken) or
-- goes on (this one rolled back, and nothing of it remains). A new
-- record's next_attempt_at is its lease's end: if its owner crashes, the
-- reconciler looks at it as soon as the lease runs out.
INSERT INTO idempotency_keys (
    caller_id, key, operation, request_method, request_path, request_fingerprint, locked_until, next_attempt_at,
    traceparent
) VALUES (
    @caller_id, @key, @operation, @request_method, @request_path, @request_fingerprint,
    now() + make_interval(secs => @lease_seconds::float8),
    now() + make_interval(secs => @lease_seconds::float8),
    sqlc.narg(traceparent)
)
RETURNING *;

-- name: InsertCompletedIdempotencyKey :exec
-- A local operation's record, written once, completed, in the transaction
-- that made its effect: no lease, no in-progress state, no later update.
-- The key's unique index is the only lock: a second request under the same
-- key waits here until the first one's transaction ends, and then fails
-- with unique_violation (its own effect rolls back with it) if the first
-- committed, or goes on if it rolled back. It fails rather than doing
-- nothing (no ON CONFLICT) because it is sent with the COMMIT
-- (postgres.TransactPipelined): only an error stops that COMMIT.
INSERT INTO idempotency_keys (
    caller_id, key, operation, request_method, request_path, request_fingerprint,
    status, recovery_point, locked_until, response_status, response_headers, response_body, completed_at,
    traceparent
) VALUES (
    @caller_id, @key, @operation, @request_method, @request_path, @request_fingerprint,
    'completed', 'finished', NULL, @response_status, @response_headers, @response_body, now(),
    sqlc.narg(traceparent)
);

-- name: CompleteIdempotencyKeyUnfenced :exec
-- A PLANTED BUG, never run unless a test asks for it
-- (FAULT_UNFENCED_COMPLETION, see idempotency.Faults): CompleteIdempotencyKey
-- without its fence. The record is named by its id alone; neither the
-- attempt, nor the status, nor a live lease is asked for, so an owner that
-- stalled past its lease and was taken over overwrites the answer the new
-- owner gave. internal/soak's TestHistoryCheckFindsUnfencedCompletion shows
-- that the history check catches it.
UPDATE idempotency_keys
SET status           = 'completed',
    recovery_point   = 'finished',
    response_status  = @response_status,
    response_headers = @response_headers,
    response_body    = @response_body,
    locked_until     = NULL,
    completed_at     = now(),
    updated_at       = now()
WHERE caller_id = @caller_id AND id = @id;

-- name: ConfirmReplicated :exec
-- Waits until everything this session has seen is on the synchronous
-- standby, when there is one (migration 0027).
SELECT idempotency_confirm_replicated();

-- name: CheckIdempotencyKeyFree :exec
-- Raises RS003 if the key has a record (migration 0027): the first
-- statement of a local operation's transaction, so that a retry whose key
-- is taken stops before anything is written.
SELECT idempotency_key_free(@caller_id, @key);
