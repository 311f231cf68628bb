DROP FUNCTION idempotency_lease_lost();
