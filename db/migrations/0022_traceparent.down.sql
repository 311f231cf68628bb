ALTER TABLE events DROP COLUMN traceparent;
ALTER TABLE idempotency_keys DROP COLUMN traceparent;
