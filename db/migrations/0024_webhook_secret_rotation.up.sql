-- A caller's webhook secret can be rotated (server callers
-- rotate-webhook-secret): deliveries go on being signed with the previous
-- secret too, beside the new one, until previous_webhook_secret_until, so
-- a receiver can switch to the new secret without refusing a delivery.
ALTER TABLE callers
    ADD COLUMN previous_webhook_secret       text,
    ADD COLUMN previous_webhook_secret_until timestamptz;
