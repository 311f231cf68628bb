-- Indexes for the sweeper, so each of its batches starts at the oldest
-- expired row instead of scanning the table (idempotency_keys already has
-- idempotency_keys_completed_created_at).
CREATE INDEX events_delivered_at ON events (delivered_at) WHERE delivered_at IS NOT NULL;
CREATE INDEX processor_events_received_at ON processor_events (received_at);
