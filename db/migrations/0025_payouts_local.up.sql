-- A payout request is a local operation: the payout, its job and the key's
-- completed record commit in one transaction, the record last, so the
-- payout no longer names a record that exists before it. Old payouts keep
-- theirs; the downstream key (unique per caller) already ties a payout to
-- the request that made it.
ALTER TABLE payouts ALTER COLUMN idempotency_key_id DROP NOT NULL;
