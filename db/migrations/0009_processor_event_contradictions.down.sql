DROP INDEX processor_events_contradictions;
ALTER TABLE processor_events DROP COLUMN contradiction;
