DROP INDEX refunds_charge_created;
