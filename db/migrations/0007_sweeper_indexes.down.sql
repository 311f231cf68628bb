DROP INDEX processor_events_received_at;
DROP INDEX events_delivered_at;
