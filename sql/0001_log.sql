-- agent-stream: the durable log.
--
-- Applied by `agent-stream migrate` (and at `serve` start-up) inside the target schema:
-- the runner sets search_path, so nothing here names a schema.
--
-- Citus readiness: `tenants` and `api_keys` are small reference tables; `runs` and
-- `agent_run_events` are distributed by `tenant_id`, which is part of every primary and
-- unique key of both, and of the foreign keys between them (co-located). No sequences,
-- no serial columns: ids are ULIDs made by the service, seqs are counted per run.

-- Roles are cluster-wide. Several schemas (tests) or databases may migrate at once, so
-- creation tolerates the role appearing concurrently.
DO $$
BEGIN
    BEGIN
        CREATE ROLE agent_stream_service NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    -- The migrating user must be able to SET ROLE to the service role (superusers can
    -- anyway; a plain owner needs membership).
    BEGIN
        EXECUTE format('GRANT agent_stream_service TO %I', current_user);
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
END
$$;

CREATE TABLE tenants (
    tenant_id   text PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Retention overrides in days; NULL means the service default.
    retention_done_days    integer CHECK (retention_done_days > 0),
    retention_failed_days  integer CHECK (retention_failed_days > 0)
);

CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    -- SHA-256 of the secret key. The key is 192 random bits, so a fast hash is enough
    -- and the plain key is never stored.
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    scopes      text[] NOT NULL CHECK (scopes <@ ARRAY['read', 'write', 'admin']::text[] AND cardinality(scopes) > 0),
    label       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE runs (
    tenant_id      text NOT NULL,
    run_id         text NOT NULL,
    parent_run_id  text,
    root_run_id    text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- Seq of the newest event; appends lock this row, which serialises them per run.
    last_seq       bigint NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    last_event_id  text,
    -- The run's own lifecycle state; NULL until its first run.lifecycle event.
    state          text CHECK (state IN ('planning', 'awaiting_approval', 'running', 'paused',
                                         'redirecting', 'done', 'aborted', 'error')),
    ended_at       timestamptz,
    PRIMARY KEY (tenant_id, run_id),
    FOREIGN KEY (tenant_id, parent_run_id) REFERENCES runs (tenant_id, run_id)
);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC, run_id DESC);
CREATE INDEX runs_tenant_state ON runs (tenant_id, state, updated_at);
CREATE INDEX runs_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE agent_run_events (
    tenant_id        text NOT NULL,
    run_id           text NOT NULL,
    seq              bigint NOT NULL CHECK (seq > 0),
    id               text NOT NULL,
    ts               timestamptz NOT NULL,
    type             text NOT NULL,
    child_id         text,
    payload          jsonb NOT NULL,
    idempotency_key  text,
    -- Server-derived, like seq: the message this event belongs to after the implicit
    -- rules are applied (a delta without message_id joins the current open message;
    -- tool.start refers to the message open in its scope). Lets SQL group by message.
    message_id       text,
    PRIMARY KEY (tenant_id, run_id, seq)
    -- No foreign key to runs: the append path inserts only while holding the run's row
    -- lock, so an event cannot outlive or precede its run, and a per-row key check
    -- doubled the cost of every 1,000-row insert (see BENCHMARKS.md, ingest).
);
CREATE UNIQUE INDEX agent_run_events_key
    ON agent_run_events (tenant_id, run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX agent_run_events_tenant_ts ON agent_run_events (tenant_id, ts);

COMMENT ON TABLE agent_run_events IS
    'Append-only log of agent runs. One row per event; seq is gapless per run from 1.';
COMMENT ON COLUMN agent_run_events.seq IS 'Per-run position, assigned by the service in commit order.';
COMMENT ON COLUMN agent_run_events.id IS 'ULID, monotonic per run.';
COMMENT ON COLUMN agent_run_events.child_id IS 'Set when the event comes from a sub-run announced by child.spawn.';
COMMENT ON COLUMN agent_run_events.payload IS 'Type-specific payload, validated at append.';
COMMENT ON COLUMN agent_run_events.idempotency_key IS 'Producer key; a retried append with the same key writes nothing.';
COMMENT ON COLUMN agent_run_events.message_id IS 'Resolved message of message.*, *.delta and tool.start events (server-derived).';

-- Tenant isolation. Every request of the service runs in a transaction that sets
-- agent_stream.tenant_id with set_config(..., true); an unset or empty setting matches
-- no row. The policies name the service role: other roles (analysts) cannot choose a
-- tenant by setting the variable, they get policies of their own. The owner is the
-- administrator (migrations, tenants, retention) and is not subject to RLS.
ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON runs TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('agent_stream.tenant_id', true));

ALTER TABLE agent_run_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_run_events TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('agent_stream.tenant_id', true));

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true));

ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_keys TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true));

-- Key lookup happens before the tenant is known, so it goes through this one narrow
-- SECURITY DEFINER function instead of giving the service role the key table.
CREATE FUNCTION authenticate(p_key_hash bytea)
RETURNS TABLE (tenant_id text, key_id text, scopes text[])
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT k.tenant_id, k.key_id, k.scopes
    FROM api_keys k
    WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION authenticate(bytea) FROM PUBLIC;

-- The service role: reads and appends; cannot UPDATE or DELETE events. Only the
-- retention path (run as the owner) deletes, and only whole runs.
DO $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO agent_stream_service', current_schema());
END
$$;
GRANT SELECT, INSERT ON agent_run_events TO agent_stream_service;
GRANT SELECT, INSERT, UPDATE (last_seq, last_event_id, state, updated_at, ended_at) ON runs TO agent_stream_service;
GRANT SELECT ON tenants TO agent_stream_service;
GRANT EXECUTE ON FUNCTION authenticate(bytea) TO agent_stream_service;
