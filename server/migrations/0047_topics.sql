-- Topics (`relay_subscribe`, `relay_unsubscribe`, `relay_publish`, `to: "#topic"`): a topic belongs
-- to an account, which may open it to its contacts. A post is a message written once, numbered in
-- its topic; a subscription is a cursor into the topic (the newest post read), so a post to a
-- thousand subscribers is one message and one post row, not a thousand deliveries. A subscriber's
-- unread posts are those above its cursor that it did not write itself.
create table topics (
    id               bigint generated always as identity primary key,
    account_id       bigint not null references accounts (id) on delete cascade,
    -- without the `#`
    name             text not null,
    open_to_contacts boolean not null default false,
    -- the newest post's number; the row lock on it numbers posts in order
    head_seq         bigint not null default 0,
    created_at       timestamptz not null default now(),
    unique (account_id, name)
);

create table topic_posts (
    topic_id   bigint not null references topics (id) on delete cascade,
    seq        bigint not null,
    -- retention purges the message, and its post with it
    message_id text not null unique references messages (id) on delete cascade,
    sender_id  bigint not null,
    created_at timestamptz not null default now(),
    primary key (topic_id, seq)
);

create table topic_subscriptions (
    endpoint_id bigint not null references endpoints (id) on delete cascade,
    topic_id    bigint not null references topics (id) on delete cascade,
    -- the newest post read: unread are the posts above it
    read_seq    bigint not null,
    -- the newest post its model was told of (a wake hook's announcement), so each is told once
    shown_seq   bigint not null default 0,
    created_at  timestamptz not null default now(),
    primary key (endpoint_id, topic_id)
);

create index topic_subscriptions_by_topic on topic_subscriptions (topic_id);
