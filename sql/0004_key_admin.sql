-- Key management over the API for a tenant's own admins: the service role may list,
-- issue and revoke keys of the tenant its transaction is scoped to (the RLS policy on
-- api_keys, FOR ALL, also checks inserted rows). It never reads key hashes: the lookup
-- by hash stays behind authenticate().
GRANT SELECT (key_id, tenant_id, scopes, label, created_at, revoked_at) ON api_keys TO agent_stream_service;
GRANT INSERT (key_id, tenant_id, key_hash, scopes, label) ON api_keys TO agent_stream_service;
GRANT UPDATE (revoked_at) ON api_keys TO agent_stream_service;
