-- Duplicates wait for the original (IDEMPOTENCY_WAIT). A request that finds
-- its key in progress under a live lease waits, holding no connection, for
-- the record to complete; each server has one connection LISTENing on the
-- channel idempotency_keys, and wakes its waiters when a record they wait
-- for is notified there.
--
-- NOTIFY is delivered only on commit, so a waiter is never woken before the
-- answer it wakes for can be read. But a transaction that has sent a
-- NOTIFY takes a database-wide lock when it commits, which would put every
-- keyed request's commit in one queue. So only a record someone waits for
-- notifies: a waiter first sets awaited (then reads the record again, so a
-- completion that committed before it set the flag is not missed), and the
-- triggers below notify when such a record completes, dies, is given up by
-- its owner (its lease released: the waiter may take it over at once) or
-- is deleted. A notification that is lost anyway (the listening connection
-- dropped) costs latency, never correctness: waiters also read the record
-- again on a slow timer, and when its lease could lapse.
ALTER TABLE idempotency_keys ADD COLUMN awaited boolean NOT NULL DEFAULT false;

CREATE FUNCTION idempotency_keys_notify_waiters() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('idempotency_keys', OLD.caller_id || '/' || OLD.id);
        RETURN OLD;
    END IF;
    PERFORM pg_notify('idempotency_keys', NEW.caller_id || '/' || NEW.id);
    RETURN NEW;
END
$$;

-- A renewal or a takeover moves the lease's end later, and notifies no one;
-- a release moves it earlier.
CREATE TRIGGER idempotency_keys_notify_update
    AFTER UPDATE ON idempotency_keys
    FOR EACH ROW
    WHEN (NEW.awaited AND (NEW.status <> OLD.status OR NEW.locked_until < OLD.locked_until))
    EXECUTE FUNCTION idempotency_keys_notify_waiters();

CREATE TRIGGER idempotency_keys_notify_delete
    AFTER DELETE ON idempotency_keys
    FOR EACH ROW
    WHEN (OLD.awaited)
    EXECUTE FUNCTION idempotency_keys_notify_waiters();
