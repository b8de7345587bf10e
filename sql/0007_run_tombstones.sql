-- What retention leaves of a deleted run (seed 004 §8, KAI-STREAM-CONN-0002): its ids,
-- final state, when it ended and its last seq, so a later read or resume of it answers
-- `410 RUN-EXPIRED` ("the replay window expired") instead of `404 RUN-NOT-FOUND`, which
-- would tell the client the run never existed. Written by the retention sweep (owner) in
-- the transaction that deletes the run; the service only reads it.
CREATE TABLE run_tombstones (
    tenant_id   text NOT NULL,
    run_id      text NOT NULL,
    state       text NOT NULL,
    ended_at    timestamptz,
    last_seq    bigint NOT NULL,
    deleted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id)
);

ALTER TABLE run_tombstones ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_tombstones TO agent_stream_service
    USING (tenant_id = current_setting('agent_stream.tenant_id', true));
GRANT SELECT ON run_tombstones TO agent_stream_service;

-- On Citus (see 0005): distributed by tenant_id and co-located with runs, so the lookup
-- after a missing run stays a router query on the run's worker.
DO $citus$
DECLARE
    s text := current_schema();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    PERFORM create_distributed_table(format('%I.run_tombstones', s), 'tenant_id',
                                     colocate_with => format('%I.runs', s));
END
$citus$;
