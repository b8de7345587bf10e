-- A run's head (its last seq, its last event's id and time) is read from the log
-- instead of being copied into its row on every commit. That copy was an UPDATE of one
-- run row per run per commit: for single deltas streamed to many runs, one UPDATE per
-- event, a third of PostgreSQL's CPU per append (docs/benchmarks-log.md, 2026-11-29).
-- The events' primary key (tenant_id, run_id, seq) already refuses a second event at a
-- seq, which is what keeps concurrent writers of a run apart; the run row is written
-- when the run's state changes, and locked by writers that read the head.
--
-- runs loses last_seq and last_event_id; run_summary gains last_seq and last_event_at
-- (analysts read a run's head there), and runs.updated_at is the time of the row's last
-- change (creation or state).

-- One statement per EXECUTE: Citus propagates some DDL to the shards with the query
-- string it was given, and a string of several commands cannot go out as one.
DO $heads$
BEGIN
    EXECUTE $v$
CREATE OR REPLACE VIEW run_summary WITH (security_invoker = true) AS
SELECT r.tenant_id, r.run_id, r.parent_run_id, r.root_run_id, r.state,
       r.created_at,
       GREATEST(r.updated_at, (SELECT max(e.ts) FROM agent_run_events e
                               WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id)) AS updated_at,
       r.ended_at,
       r.ended_at - r.created_at AS duration,
       coalesce((SELECT max(e.seq) FROM agent_run_events e
                 WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id), 0) AS event_count,
       (SELECT count(*) FROM messages m WHERE m.tenant_id = r.tenant_id AND m.run_id = r.run_id) AS message_count,
       (SELECT count(*) FROM tool_calls t WHERE t.tenant_id = r.tenant_id AND t.run_id = r.run_id) AS tool_call_count,
       (SELECT count(*) FROM tool_calls t WHERE t.tenant_id = r.tenant_id AND t.run_id = r.run_id
                                          AND t.status = 'error') AS tool_error_count,
       (SELECT count(DISTINCT e.child_id) FROM agent_run_events e
         WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id AND e.type = 'child.spawn') AS child_count,
       coalesce((SELECT max(e.seq) FROM agent_run_events e
                 WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id), 0) AS last_seq,
       (SELECT max(e.ts) FROM agent_run_events e
         WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id) AS last_event_at
FROM runs r
$v$;
    EXECUTE 'ALTER TABLE runs DROP COLUMN last_seq';
    EXECUTE 'ALTER TABLE runs DROP COLUMN last_event_id';
    EXECUTE 'COMMENT ON VIEW run_summary IS ''One row per run: state, times, its head (last_seq, '
            'last_event_at), and counts of events, messages, tool calls, tool errors and children.''';
END
$heads$;
