DROP TABLE demo_received_events;
DROP INDEX events_undelivered;
ALTER TABLE events DROP COLUMN delivered_at, DROP COLUMN delivery_attempts, DROP COLUMN next_attempt_at;
ALTER TABLE callers DROP COLUMN webhook_url, DROP COLUMN webhook_secret;
