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

-- name: GetChargeByDownstreamKey :one
SELECT * FROM charges
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;

-- name: GetRefundByDownstreamKey :one
SELECT * FROM refunds
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;

-- name: DownstreamKeyInUse :one
-- Whether an earlier charge, refund or payout of the caller was sent to the
-- processor under this key (effect.NewDownstreamKey).
SELECT (EXISTS (SELECT 1 FROM charges c WHERE c.caller_id = @caller_id AND c.downstream_key = @downstream_key)
     OR EXISTS (SELECT 1 FROM refunds r WHERE r.caller_id = @caller_id AND r.downstream_key = @downstream_key)
     OR EXISTS (SELECT 1 FROM payouts p WHERE p.caller_id = @caller_id AND p.downstream_key = @downstream_key))::boolean AS in_use;
