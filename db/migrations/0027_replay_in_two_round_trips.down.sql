DROP FUNCTION idempotency_confirm_replicated();
DROP FUNCTION idempotency_key_free(text, text);
