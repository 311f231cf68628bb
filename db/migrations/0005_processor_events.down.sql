DROP TABLE processor_events;
