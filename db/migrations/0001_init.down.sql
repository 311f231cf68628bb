DROP TABLE orders;
DROP TABLE idempotency_keys;
DROP TABLE callers;
