DROP TRIGGER idempotency_keys_notify_delete ON idempotency_keys;
DROP TRIGGER idempotency_keys_notify_update ON idempotency_keys;
DROP FUNCTION idempotency_keys_notify_waiters();
ALTER TABLE idempotency_keys DROP COLUMN awaited;
