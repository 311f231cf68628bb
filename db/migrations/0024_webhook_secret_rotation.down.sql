ALTER TABLE callers
    DROP COLUMN previous_webhook_secret,
    DROP COLUMN previous_webhook_secret_until;
