-- A keyed request that finds its key taken costs two round trips and
-- writes nothing.
--
-- A local operation inserts its key's completed record in the transaction
-- that makes its effect, sent with the COMMIT (one round trip). A retry
-- whose record exists used to find out from the insert's unique violation:
-- its effect and the record's heap tuple written, then rolled back. Now
-- the transaction's first statement asks idempotency_key_free, which
-- raises RS003 when the key has a record: nothing after it runs, nothing
-- is written, and the retry reads the record instead (a second round trip).
-- The insert's unique index still decides between two requests that find
-- the key free at once.
CREATE FUNCTION idempotency_key_free(p_caller text, p_key text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM idempotency_keys WHERE caller_id = p_caller AND key = p_key) THEN
        RAISE EXCEPTION 'idempotency key taken: the key has a record' USING ERRCODE = 'RS003';
    END IF;
END
$$;

-- Waits until everything this session has seen is on the synchronous
-- standby, when there is one, and returns true. A transactional logical
-- message is a write (a WAL record, and an xid), so the statement's own
-- transaction waits at its commit for the standby to have the log up to
-- that commit, which is after every commit this session saw (a replay must
-- not answer with a record a failover could lose; see replayStored in
-- internal/idempotency). Nothing decodes the message. Without a
-- synchronous standby it writes nothing. A function, so that the look-up
-- that finds a record can confirm it in the same statement.
CREATE FUNCTION idempotency_confirm_replicated() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN current_setting('synchronous_standby_names') <> ''
                THEN pg_logical_emit_message(true, 'payments-confirm-replicated', '') IS NOT NULL
                ELSE true END
$$;
