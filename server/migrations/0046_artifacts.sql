-- Files attached to messages (`relay_send {attach}`, `relay_fetch`). A file's content is stored once
-- by its SHA-256, however many messages carry it. A sender uploads each file first (`Upload`, one
-- request a file); the upload waits, an hour at most, for the send that attaches it, which links
-- it to the message under the name it was sent with (the upload is then spent). A text file's content is redacted as bodies
-- are before it is hashed, so what is stored and counted is what recipients get.
create table artifact_blobs (
    sha256  bytea primary key,
    content bytea not null,
    size    bigint not null,
    -- when it was last uploaded: the purge leaves a blob an upload under way may still attach
    used_at timestamptz not null default now()
);

create table artifact_uploads (
    id          text primary key,
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    account_id  bigint not null references accounts (id) on delete cascade,
    name        text not null,
    sha256      bytea not null references artifact_blobs (sha256),
    size        bigint not null,
    is_binary   boolean not null,
    -- credential spans taken out of a text file
    redacted    integer not null,
    created_at  timestamptz not null default now()
);

create index artifact_uploads_by_age on artifact_uploads (created_at);
-- What an account's files hold is summed from these (sizes in the index: no table reads).
create index artifact_uploads_by_account on artifact_uploads (account_id) include (size);
create index artifact_uploads_by_blob on artifact_uploads (sha256);

-- Written before the message itself (the send's writer batches messages apart from this), so a
-- link names its message by id alone; a link whose message was never written, or was purged, is
-- purged with the blobs. Recipients reach a link only through a message they may read.
create table message_artifacts (
    message_id text not null,
    name       text not null,
    account_id bigint not null references accounts (id) on delete cascade,
    sha256     bytea not null references artifact_blobs (sha256),
    size       bigint not null,
    is_binary  boolean not null,
    redacted   integer not null,
    created_at timestamptz not null default now(),
    primary key (message_id, name)
);

create index message_artifacts_by_account on message_artifacts (account_id) include (size);
create index message_artifacts_by_blob on message_artifacts (sha256);
create index message_artifacts_by_age on message_artifacts (created_at);
