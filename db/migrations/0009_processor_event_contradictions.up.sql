-- A correctly signed processor event that contradicts a final state we
-- recorded (charge.succeeded for a charge we recorded as declined, say) is
-- not applied: money state never moves backwards on an event's word. It is
-- acknowledged, so the processor stops redelivering it, and kept here for
-- an operator with what it contradicted. Such rows are never swept.
ALTER TABLE processor_events ADD COLUMN contradiction text;

CREATE INDEX processor_events_contradictions
    ON processor_events (caller_id, received_at) WHERE contradiction IS NOT NULL;
