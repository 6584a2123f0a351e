-- What a tool call's answer stream at `/mcp` sent after its client's connection broke: kept a
-- short while, so the client reconnecting with `Last-Event-ID` (to any replica) gets the events it
-- missed, the answer among them. Nothing is written while clients stay connected. An answer is
-- read back only by the machine that asked (`machine_id`), and purged once past `kept_until`.

create table mcp_answers (
    stream bytea not null,
    seq integer not null,
    machine_id bigint not null references machines (id) on delete cascade,
    data text not null,
    kept_until timestamptz not null,
    primary key (stream, seq)
);

create index mcp_answers_by_expiry on mcp_answers (kept_until);
