-- agent-stream: documented views for analysts, and a read-only, tenant-scoped role.
--
-- The views follow the reducer's rules (src/projection/reduce.rs) and a test checks
-- that they agree with it on generated runs. They rely on agent_run_events.message_id,
-- which the append path fills with the message each event resolved to, so no view has
-- to re-implement the "current open message" rule.
--
-- Every view is security_invoker: it runs with the privileges and row-level security of
-- the analyst who queries it, never of its owner.

CREATE VIEW lifecycle_transitions WITH (security_invoker = true) AS
SELECT e.tenant_id,
       e.run_id,
       e.child_id,
       e.seq,
       e.ts,
       lag(e.payload ->> 'state') OVER (PARTITION BY e.tenant_id, e.run_id, e.child_id ORDER BY e.seq) AS from_state,
       e.payload ->> 'state' AS to_state,
       e.payload ->> 'reason' AS reason
FROM agent_run_events e
WHERE e.type = 'run.lifecycle';
COMMENT ON VIEW lifecycle_transitions IS
    'Every lifecycle change of runs and their children: from_state (NULL for the first), to_state, reason, time.';

-- The first terminal lifecycle event that closes a scope: the run's own end closes
-- everything, a child's end closes only that child.
CREATE VIEW scope_ends WITH (security_invoker = true) AS
SELECT e.tenant_id, e.run_id, e.child_id, min(e.seq) AS seq
FROM agent_run_events e
WHERE e.type = 'run.lifecycle' AND e.payload ->> 'state' IN ('done', 'aborted', 'error')
GROUP BY e.tenant_id, e.run_id, e.child_id;
COMMENT ON VIEW scope_ends IS 'Seq of the terminal lifecycle event of each run (child_id NULL) and child.';

CREATE VIEW messages WITH (security_invoker = true) AS
WITH m AS (
    SELECT e.tenant_id, e.run_id, e.child_id, e.message_id,
           min(e.seq) AS started_seq,
           min(e.ts) AS started_at,
           max(e.seq) FILTER (WHERE e.type = 'message.end') AS end_seq,
           max(e.ts) FILTER (WHERE e.type = 'message.end') AS end_ts,
           coalesce(max(e.payload ->> 'role') FILTER (WHERE e.type = 'message.start'), 'assistant') AS role,
           bool_and(e.type <> 'message.start') AS implicit,
           coalesce(string_agg(e.payload ->> 'text', '' ORDER BY e.seq) FILTER (WHERE e.type = 'text.delta'), '') AS streamed,
           coalesce(string_agg(e.payload ->> 'text', '' ORDER BY e.seq) FILTER (WHERE e.type = 'reasoning.delta'), '') AS reasoning,
           max(e.payload ->> 'text') FILTER (WHERE e.type = 'message.end') AS end_text,
           max(e.payload ->> 'stop_reason') FILTER (WHERE e.type = 'message.end') AS stop_reason,
           count(*) FILTER (WHERE e.type IN ('text.delta', 'reasoning.delta')) AS delta_count
    FROM agent_run_events e
    WHERE e.message_id IS NOT NULL
      AND e.type IN ('message.start', 'message.end', 'text.delta', 'reasoning.delta')
    GROUP BY e.tenant_id, e.run_id, e.child_id, e.message_id
), closed AS (
    SELECT m.*,
           (SELECT min(s.seq) FROM scope_ends s
             WHERE s.tenant_id = m.tenant_id AND s.run_id = m.run_id
               AND (s.child_id IS NULL OR s.child_id = m.child_id)
               AND s.seq > m.started_seq) AS interrupted_seq
    FROM m
)
SELECT c.tenant_id, c.run_id, c.child_id, c.message_id, c.role,
       CASE
           WHEN c.end_seq IS NOT NULL AND c.stop_reason = 'error' THEN 'failed'
           WHEN c.end_seq IS NOT NULL THEN 'complete'
           WHEN c.interrupted_seq IS NOT NULL THEN 'interrupted'
           ELSE 'streaming'
       END AS status,
       CASE WHEN c.streamed = '' THEN coalesce(c.end_text, '') ELSE c.streamed END AS text,
       c.reasoning,
       c.stop_reason,
       c.implicit,
       c.delta_count,
       c.started_seq,
       coalesce(c.end_seq, c.interrupted_seq) AS ended_seq,
       c.started_at,
       c.end_ts AS ended_at
FROM closed c;
COMMENT ON VIEW messages IS
    'One row per logical message (the bubble a UI shows): role, status (streaming, complete, failed, interrupted), full text and reasoning.';

CREATE VIEW tool_calls WITH (security_invoker = true) AS
WITH c AS (
    SELECT e.tenant_id, e.run_id, e.child_id, e.payload ->> 'call_id' AS call_id,
           min(e.seq) FILTER (WHERE e.type = 'tool.start') AS started_seq,
           min(e.ts) FILTER (WHERE e.type = 'tool.start') AS started_at,
           max(e.seq) FILTER (WHERE e.type = 'tool.end') AS end_seq,
           max(e.ts) FILTER (WHERE e.type = 'tool.end') AS ended_at,
           max(e.payload ->> 'tool') FILTER (WHERE e.type = 'tool.start') AS tool,
           max(e.payload ->> 'skill_id') FILTER (WHERE e.type = 'tool.start') AS skill_id,
           max(e.message_id) FILTER (WHERE e.type = 'tool.start') AS message_id,
           (array_agg(e.payload -> 'input') FILTER (WHERE e.type = 'tool.start'))[1] AS input,
           count(*) FILTER (WHERE e.type = 'tool.progress') AS progress_count,
           bool_or((e.payload ->> 'ok')::boolean) FILTER (WHERE e.type = 'tool.end') AS ok,
           max((e.payload ->> 'duration_ms')::bigint) FILTER (WHERE e.type = 'tool.end') AS duration_ms,
           (array_agg(e.payload -> 'output') FILTER (WHERE e.type = 'tool.end'))[1] AS output,
           (array_agg(e.payload -> 'error') FILTER (WHERE e.type = 'tool.end'))[1] AS error
    FROM agent_run_events e
    WHERE e.type IN ('tool.start', 'tool.progress', 'tool.end')
    GROUP BY e.tenant_id, e.run_id, e.child_id, e.payload ->> 'call_id'
), closed AS (
    SELECT c.*,
           (SELECT min(s.seq) FROM scope_ends s
             WHERE s.tenant_id = c.tenant_id AND s.run_id = c.run_id
               AND (s.child_id IS NULL OR s.child_id = c.child_id)
               AND s.seq > c.started_seq) AS interrupted_seq
    FROM c
)
SELECT c.tenant_id, c.run_id, c.child_id, c.call_id, c.tool, c.skill_id, c.message_id,
       CASE
           WHEN c.end_seq IS NOT NULL AND c.ok THEN 'success'
           WHEN c.end_seq IS NOT NULL THEN 'error'
           WHEN c.interrupted_seq IS NOT NULL THEN 'interrupted'
           ELSE 'running'
       END AS status,
       c.input, c.output, c.error, c.duration_ms, c.progress_count,
       c.started_seq,
       coalesce(c.end_seq, c.interrupted_seq) AS ended_seq,
       c.started_at, c.ended_at
FROM closed c;
COMMENT ON VIEW tool_calls IS
    'One row per tool call: tool, status (running, success, error, interrupted), input, output, error, duration_ms.';

CREATE VIEW compactions WITH (security_invoker = true) AS
SELECT e.tenant_id, e.run_id, e.child_id, e.seq, e.ts,
       (e.payload ->> 'removed')::bigint AS removed,
       (e.payload ->> 'kept')::bigint AS kept,
       (e.payload ->> 'tokens_removed')::bigint AS tokens_removed,
       (e.payload ->> 'tokens_kept')::bigint AS tokens_kept,
       e.payload ->> 'reason' AS reason
FROM agent_run_events e
WHERE e.type = 'compaction.end';
COMMENT ON VIEW compactions IS 'Statistics of every finished context compaction (seed 000).';

CREATE VIEW run_summary WITH (security_invoker = true) AS
SELECT r.tenant_id, r.run_id, r.parent_run_id, r.root_run_id, r.state,
       r.created_at, r.updated_at, r.ended_at,
       r.ended_at - r.created_at AS duration,
       r.last_seq AS event_count,
       (SELECT count(*) FROM messages m WHERE m.tenant_id = r.tenant_id AND m.run_id = r.run_id) AS message_count,
       (SELECT count(*) FROM tool_calls t WHERE t.tenant_id = r.tenant_id AND t.run_id = r.run_id) AS tool_call_count,
       (SELECT count(*) FROM tool_calls t WHERE t.tenant_id = r.tenant_id AND t.run_id = r.run_id
                                          AND t.status = 'error') AS tool_error_count,
       (SELECT count(DISTINCT e.child_id) FROM agent_run_events e
         WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id AND e.type = 'child.spawn') AS child_count
FROM runs r;
COMMENT ON VIEW run_summary IS 'One row per run: state, times, and counts of events, messages, tool calls, tool errors and children.';

-- The analyst role: read-only, and scoped to one tenant by its login, not by a setting
-- it could change. Each analyst login (see `agent-stream analyst create`) is a member of
-- agent_stream_analyst and is mapped to its tenant in analyst_logins.
DO $$
BEGIN
    BEGIN
        CREATE ROLE agent_stream_analyst NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO agent_stream_analyst', current_schema());
END
$$;

CREATE TABLE analyst_logins (
    role_name  text PRIMARY KEY,
    tenant_id  text NOT NULL REFERENCES tenants (tenant_id),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Like every table with a tenant column, under RLS: the service role may see its own
-- tenant's logins (it has no grant today); analysts read it only through the function.
ALTER TABLE analyst_logins ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON analyst_logins TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true));

CREATE FUNCTION analyst_tenant() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT tenant_id FROM analyst_logins WHERE role_name = session_user $$;
REVOKE ALL ON FUNCTION analyst_tenant() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION analyst_tenant() TO agent_stream_analyst;

CREATE POLICY analyst_read ON runs FOR SELECT TO agent_stream_analyst
    USING (tenant_id = (SELECT analyst_tenant()));
CREATE POLICY analyst_read ON agent_run_events FOR SELECT TO agent_stream_analyst
    USING (tenant_id = (SELECT analyst_tenant()));

GRANT SELECT ON runs, agent_run_events, lifecycle_transitions, scope_ends, messages, tool_calls,
    compactions, run_summary TO agent_stream_analyst;
-- The service reads the views too (for example to answer with SQL-computed summaries).
GRANT SELECT ON lifecycle_transitions, scope_ends, messages, tool_calls, compactions, run_summary
    TO agent_stream_service;
