DELETE FROM events WHERE type IN ('payout.paid', 'payout.failed');
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check
    CHECK (type IN ('order.paid', 'charge.succeeded', 'charge.failed', 'refund.succeeded'));
DROP TABLE payouts;
DROP TABLE balances;
