-- Listing a charge's refunds (GET /v1/charges/{charge_id}/refunds) reads
-- them in (created_at, id) order; this index serves it without sorting or
-- scanning the caller's other refunds. It leads with caller_id, as every
-- index on a tenant table does, so it stays on the caller's shard.
CREATE INDEX refunds_charge_created ON refunds (caller_id, charge_id, created_at, id);
