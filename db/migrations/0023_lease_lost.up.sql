-- A fenced write that has lost its fence fails instead of matching no row.
--
-- The idempotency layer's phase writes (SetRecoveryPoint and
-- CompleteIdempotencyKey) are fenced: they name the attempt they were made
-- under, and need a lease that is live at the moment of the write. Until
-- now a lost fence showed as zero rows updated, and the owner then rolled
-- its transaction back. A phase now sends its fenced write and COMMIT in
-- one round trip (internal/postgres, TransactPipelined), so the COMMIT
-- would arrive before the owner could look at the row count: zero rows
-- would commit the phase's work without its record. The write must fail
-- instead. PostgreSQL ignores the rest of a pipeline after an error, so the
-- COMMIT never runs and the transaction is rolled back, exactly as before.
--
-- The queries call this function when their UPDATE matched no row. Its
-- SQLSTATE, RS001 (a class of our own), is what internal/idempotency turns
-- back into ErrLeaseLost.
CREATE FUNCTION idempotency_lease_lost() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idempotency key lease lost: another attempt took the record over, or this one''s lease ran out'
        USING ERRCODE = 'RS001';
END
$$;
