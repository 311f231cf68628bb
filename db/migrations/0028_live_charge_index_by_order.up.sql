-- charges_one_live_per_order led with caller_id, and a charge's own
-- statements (WHERE caller_id = $1 AND id = $2 AND status = 'pending')
-- imply its predicate. On a table with no statistics yet (a new database,
-- or one just emptied) the planner chose it over the primary key for them,
-- and scanned every live charge of the caller to find one: each of a
-- merchant's charges cost more than the one before. Led by order_id, the
-- index serves only a look-up by order, and enforces the same rule.
DROP INDEX charges_one_live_per_order;
CREATE UNIQUE INDEX charges_one_live_per_order
    ON charges (order_id, caller_id) WHERE status IN ('pending', 'succeeded');
