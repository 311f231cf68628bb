-- name: DownstreamKeyInUse :one
-- Whether an earlier charge, refund or payout of the caller was sent to the
-- processor under this key (cardprocessor.NewDownstreamKey). The key is
-- the processor's idempotency key, shared by the three kinds of object, so
-- this one question reads the three tables that store it.
SELECT (EXISTS (SELECT 1 FROM charges c WHERE c.caller_id = @caller_id AND c.downstream_key = @downstream_key)
     OR EXISTS (SELECT 1 FROM refunds r WHERE r.caller_id = @caller_id AND r.downstream_key = @downstream_key)
     OR EXISTS (SELECT 1 FROM payouts p WHERE p.caller_id = @caller_id AND p.downstream_key = @downstream_key))::boolean AS in_use;
