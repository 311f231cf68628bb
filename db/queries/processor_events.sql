-- name: RecordProcessorEvent :execrows
-- Zero rows: the event was applied before (a redelivery).
INSERT INTO processor_events (caller_id, event_id, type)
VALUES (@caller_id, @event_id, @type)
ON CONFLICT (caller_id, event_id) DO NOTHING;

-- name: SetProcessorEventContradiction :exec
-- Mark an event as not applied because it contradicts what is recorded,
-- for an operator. Written in the transaction that recorded the event id.
UPDATE processor_events
SET contradiction = @contradiction
WHERE caller_id = @caller_id AND event_id = @event_id;

-- name: ListContradictingProcessorEvents :many
-- The caller's processor events that were set aside, oldest first.
SELECT * FROM processor_events
WHERE caller_id = @caller_id AND contradiction IS NOT NULL
ORDER BY received_at;
