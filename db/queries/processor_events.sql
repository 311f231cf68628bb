-- name: RecordProcessorEvent :execrows
-- Zero rows: the event was applied before (a redelivery).
INSERT INTO processor_events (caller_id, event_id, type)
VALUES (@caller_id, @event_id, @type)
ON CONFLICT (caller_id, event_id) DO NOTHING;

-- name: GetChargeByDownstreamKey :one
SELECT * FROM charges
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;

-- name: GetRefundByDownstreamKey :one
SELECT * FROM refunds
WHERE caller_id = @caller_id AND downstream_key = @downstream_key;
