-- Each record names its operation (the contract's operationId, such as
-- createCharge), so that whoever resumes it, a client's retry or the
-- reconciler, finds the one handler registered for that operation instead
-- of guessing from the path or the recovery point.
ALTER TABLE idempotency_keys ADD COLUMN operation text;

UPDATE idempotency_keys SET operation = CASE
    WHEN request_path = '/v1/orders'                       THEN 'createOrder'
    WHEN request_path ~ '^/v1/orders/[^/]+/charges$'       THEN 'createCharge'
    WHEN request_path ~ '^/v1/charges/[^/]+/refunds$'      THEN 'createRefund'
    ELSE 'unknown'
END;

ALTER TABLE idempotency_keys
    ALTER COLUMN operation SET NOT NULL,
    ADD CONSTRAINT operation_named CHECK (operation <> '');
