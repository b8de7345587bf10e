-- Every append moves its run's row (last_seq, last_event_id, updated_at). With
-- updated_at in an index (runs_tenant_state), none of those updates could be HOT: each
-- wrote a new version into every index of runs and left a dead one behind, so a run
-- appended to by single deltas piled up dead versions that the next append's lookup of
-- the run walked through (`ingest-single`: 36,405 updates, 0 HOT, 36,405 dead tuples
-- for 64 runs in 5 s). Now no index of runs holds a column an append moves, and pages
-- keep room for the new version, so those updates are HOT and pruned on the page.
--
-- Run activity (created / state changed) needs "runs whose state changed since", so
-- that moment gets its own column, stamped at creation and whenever the state changes.

-- One statement per EXECUTE: Citus propagates some DDL to the shards with the query
-- string it was given, and a string of several commands cannot go out as one.
DO $hot$
BEGIN
    EXECUTE 'ALTER TABLE runs ADD COLUMN state_changed_at timestamptz';
    EXECUTE 'UPDATE runs SET state_changed_at = updated_at';
    EXECUTE 'ALTER TABLE runs ALTER COLUMN state_changed_at SET DEFAULT now()';
    EXECUTE 'ALTER TABLE runs ALTER COLUMN state_changed_at SET NOT NULL';
    EXECUTE 'DROP INDEX runs_tenant_state';
    EXECUTE 'CREATE INDEX runs_tenant_state ON runs (tenant_id, state)';
    EXECUTE 'CREATE INDEX runs_tenant_state_changed ON runs (tenant_id, state_changed_at)';
    -- Room on each page for the next version of its rows (pages filled from now on).
    EXECUTE 'ALTER TABLE runs SET (fillfactor = 50)';
    EXECUTE 'GRANT UPDATE (state_changed_at) ON runs TO agent_stream_service';
END
$hot$;
