DROP INDEX idempotency_keys_in_progress_next_attempt_at;
CREATE INDEX idempotency_keys_in_progress_locked_until
    ON idempotency_keys (locked_until) WHERE status = 'in_progress';
ALTER TABLE idempotency_keys
    DROP COLUMN reconciler_attempts,
    DROP COLUMN next_attempt_at;
