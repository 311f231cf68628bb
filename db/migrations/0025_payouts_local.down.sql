-- Only possible while every payout still names its key record.
ALTER TABLE payouts ALTER COLUMN idempotency_key_id SET NOT NULL;
