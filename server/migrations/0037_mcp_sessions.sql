-- The sessions of MCP clients of the 2025 revisions at the `/mcp` endpoint: what each said when it
-- initialized, so a request that reaches a replica which has not seen its session yet (after a
-- restart, or behind a load balancer) carries on there instead of being told to start again. A
-- session is named by the hash of its id; an unused one expires and is purged.

create table mcp_sessions (
    id_hash bytea primary key,
    state text not null,
    expires_at timestamptz not null
);

create index mcp_sessions_by_expiry on mcp_sessions (expires_at);
