DROP TABLE refunds;
ALTER TABLE charges DROP CONSTRAINT refunds_within_charge, DROP COLUMN amount_refunded;
