-- agent-stream on Citus: distribute the log when the citus extension is present in this
-- database. On plain PostgreSQL this migration changes nothing.
--
-- - runs and agent_run_events are hash-distributed by tenant_id and co-located: a
--   tenant's runs and events live in shards on the same worker, so every transaction of
--   the service (which is scoped to one tenant and names tenant_id in its WHERE clauses)
--   is a router transaction on one worker, with no two-phase commit.
-- - tenants, api_keys and analyst_logins are small reference tables, copied to every node
--   (key lookup, and the analysts' tenant, are then local reads wherever they run).
-- - schema_migrations stays a local table on the coordinator.
--
-- Shard count: citus.shard_count of the migrating session (Citus's default is 32).

DO $citus$
DECLARE
    s text := current_schema();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;

    -- The coordinator opens its connections to the workers as the role running the
    -- query, and the pool runs as agent_stream_service (SET ROLE): a NOLOGIN role cannot
    -- be connected as. It gets LOGIN, and still no password: give it none, and let
    -- pg_hba.conf admit it only from the coordinator (see the README).
    IF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'agent_stream_service') THEN
        BEGIN
            ALTER ROLE agent_stream_service LOGIN;
        EXCEPTION WHEN internal_error THEN
            -- "tuple concurrently updated": another schema's migration did it just now.
            NULL;
        END;
    END IF;

    -- Writing to a reference table (the service issues and revokes keys in api_keys)
    -- makes Citus lock the reference tables it refers to (tenants) on the first worker,
    -- and Citus lets only roles that may write to those tables take that lock. The
    -- service role only reads tenants; it is allowed the lock by this setting instead,
    -- which only a superuser may give. Without it, everything works but key management
    -- over the API (POST and DELETE /v1/keys).
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_db_role_setting d JOIN pg_roles r ON r.oid = d.setrole
                       WHERE r.rolname = 'agent_stream_service' AND d.setdatabase = 0
                         AND 'citus.skip_advisory_lock_permission_checks=on' = ANY (d.setconfig)) THEN
            ALTER ROLE agent_stream_service SET citus.skip_advisory_lock_permission_checks = on;
        END IF;
    EXCEPTION WHEN unique_violation OR internal_error THEN
        -- Another schema's migration set it at the same moment.
        NULL;
    WHEN insufficient_privilege THEN
        RAISE WARNING 'agent-stream: could not let agent_stream_service take Citus''s reference-table locks (%); '
                      'issuing and revoking keys over the API will fail until a superuser runs: '
                      'ALTER ROLE agent_stream_service SET citus.skip_advisory_lock_permission_checks = on',
                      SQLERRM;
    END;

    PERFORM create_reference_table(format('%I.tenants', s));
    PERFORM create_reference_table(format('%I.api_keys', s));
    PERFORM create_reference_table(format('%I.analyst_logins', s));
    -- Citus gives the shards the tables' table-level grants, not their column-level ones
    -- (0004's, for key management): given again now, they reach the shards too.
    GRANT SELECT (key_id, tenant_id, scopes, label, created_at, revoked_at) ON api_keys TO agent_stream_service;
    -- The coordinator fills in column defaults (created_at's now()) and sends them as
    -- values, so the service must also be allowed to insert that column.
    GRANT INSERT (key_id, tenant_id, key_hash, scopes, label, created_at) ON api_keys TO agent_stream_service;
    GRANT UPDATE (revoked_at) ON api_keys TO agent_stream_service;

    -- Citus refuses subqueries in policies on distributed tables, so the analysts'
    -- policies call analyst_tenant() directly (evaluated on the workers, per shard).
    -- There the function reads analyst_logins, a reference table, from inside a query
    -- on a shard, which Citus allows only when told to: the read is of the worker's own
    -- replica, the same on every node, so the result is the one the coordinator would get.
    ALTER FUNCTION analyst_tenant() SET citus.allow_nested_distributed_execution = on;
    DROP POLICY analyst_read ON runs;
    DROP POLICY analyst_read ON agent_run_events;
    PERFORM create_distributed_table(format('%I.runs', s), 'tenant_id');
    PERFORM create_distributed_table(format('%I.agent_run_events', s), 'tenant_id',
                                     colocate_with => format('%I.runs', s));
    -- Citus sends a policy's expression to the workers as the coordinator prints it,
    -- which leaves out the schema that is on the search_path here but not there: take
    -- the schema off the path while the policies are created.
    PERFORM set_config('search_path', 'pg_catalog', true);
    EXECUTE format('CREATE POLICY analyst_read ON %1$I.runs FOR SELECT TO agent_stream_analyst
                        USING (tenant_id = %1$I.analyst_tenant())', s);
    EXECUTE format('CREATE POLICY analyst_read ON %1$I.agent_run_events FOR SELECT TO agent_stream_analyst
                        USING (tenant_id = %1$I.analyst_tenant())', s);
    PERFORM set_config('search_path', quote_ident(s), true);
END
$citus$;
