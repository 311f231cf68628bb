DROP INDEX charges_one_live_per_order;
CREATE UNIQUE INDEX charges_one_live_per_order
    ON charges (caller_id, order_id) WHERE status IN ('pending', 'succeeded');
