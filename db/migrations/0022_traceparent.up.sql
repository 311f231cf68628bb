-- The W3C trace context (traceparent) of the request that claimed a key,
-- and of the work that wrote an event: the reconciler's resumption and the
-- relay's delivery run long after that request, as traces of their own,
-- and link back to it through this.
--
-- NULL when nothing was traced (tracing off, the usual case): no cost
-- beyond a null bit. Only a traceparent the service's own SDK produced is
-- stored, never a client's header; the CHECK bounds it anyway, so no
-- caller can put more than its 55 characters of version-00 form here.
--
-- NOT VALID: every row there already has NULL, which passes; not checking
-- them spares a scan of each table under the ALTER's exclusive lock. New
-- and updated rows are checked all the same.
ALTER TABLE idempotency_keys ADD COLUMN traceparent text,
    ADD CONSTRAINT idempotency_keys_traceparent_check
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
ALTER TABLE events ADD COLUMN traceparent text,
    ADD CONSTRAINT events_traceparent_check
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
