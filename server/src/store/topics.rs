//! Topics (migration 47): a topic belongs to an account; a post is a message written once and
//! numbered in its topic; a follower reads posts through its cursor. Reading a follower's posts
//! starts from its subscriptions, so it costs the same however many others follow.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::row::Col;
use crate::domain::activity::{Exchanged, TopicPosts};
use crate::domain::caller::Caller;
use crate::domain::delivery::Kind;
use crate::domain::ids::{AccountId, EndpointId, MessageId};
use crate::domain::message::{Announced, Message};
use crate::domain::topic::{Backlog, MAX_SUBSCRIPTIONS, MAX_TOPICS, Posted, TopicRef};
use crate::domain::{EntityKind, Error};
use crate::store::Result;

/// Whether the follower (machine `fm`) may still read topic `t`: its own account's, or a contact's
/// still open to contacts. A topic closed, or a contact dropped, stops the reading at once.
macro_rules! readable {
    () => {
        "(t.account_id = fm.account_id
          or (t.open_to_contacts and exists (
              select 1 from contacts k
              where (k.account_a = fm.account_id and k.account_b = t.account_id)
                 or (k.account_b = fm.account_id and k.account_a = t.account_id))))"
    };
}

/// Channel of the topics' news: `<topic id>:<seq>`, a post; `e<endpoint id>`, what an endpoint
/// follows changed; `c<topic id>`, a topic was closed to contacts.
pub const TOPIC_CHANNEL: &str = "relay_topic";

/// A notification on [`TOPIC_CHANNEL`].
#[derive(Debug, PartialEq, Eq)]
pub enum TopicNotice {
    Posted { topic: i64, seq: i64 },
    Follows(EndpointId),
    Closed(i64),
}

impl TopicNotice {
    pub fn parse(payload: &str) -> Option<Self> {
        if let Some(endpoint) = payload.strip_prefix('e') {
            return endpoint.parse().ok().map(|e| Self::Follows(EndpointId(e)));
        }
        if let Some(topic) = payload.strip_prefix('c') {
            return topic.parse().ok().map(Self::Closed);
        }
        let (topic, seq) = payload.split_once(':')?;
        Some(Self::Posted { topic: topic.parse().ok()?, seq: seq.parse().ok()? })
    }
}

/// A topic an agent named, found (and, in its own account, made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    pub id: i64,
    pub account_id: AccountId,
    /// As readers see it: `account/#name`.
    pub shown: String,
}

/// The topic `named` means to `caller`: one of its own account's (made when `make`, as following
/// or posting first does), or one a contact account opened to contacts. Anything else — a
/// stranger's topic, a contact's closed one, one that does not exist — is not found, alike.
pub(crate) async fn find(c: &impl GenericClient, caller: &Caller, named: &TopicRef, make: bool) -> Result<Topic> {
    let own = named.account.as_deref().is_none_or(|a| a == caller.account);
    if own && make {
        // Read first (a topic is made once and posted to often); made when missing; read again when
        // another call made it meanwhile (its insert, committed after this statement's snapshot,
        // is seen by the next statement only).
        let shown = TopicRef::shown(&caller.account, &named.name);
        let read = c.prepare_cached("select id from topics where account_id = $1 and name = $2").await?;
        let made = c
            .prepare_cached(&format!(
                "insert into topics (account_id, name)
                 select $1, $2 where (select count(*) from topics where account_id = $1) < {MAX_TOPICS}
                 on conflict (account_id, name) do nothing
                 returning id"
            ))
            .await?;
        for stmt in [&read, &made, &read] {
            if let Some(row) = c.query_opt(stmt, &[&caller.account_id, &named.name]).await? {
                return Ok(Topic { id: row.col("id")?, account_id: caller.account_id, shown });
            }
        }
        return Err(Error::ResourceExhausted(format!(
            "your account holds {MAX_TOPICS} topics, the most it may: post to or follow one of them"
        ))
        .into());
    }
    let stmt = c
        .prepare_cached(
            "select t.id, t.account_id, a.name as account from topics t join accounts a on a.id = t.account_id
             where a.name = $2 and t.name = $3
               and (t.account_id = $1
                    or (t.open_to_contacts and exists (
                        select 1 from contacts k
                        where (k.account_a = $1 and k.account_b = t.account_id)
                           or (k.account_b = $1 and k.account_a = t.account_id))))",
        )
        .await?;
    let account = named.account.as_deref().unwrap_or(&caller.account);
    let row = c.query_opt(&stmt, &[&caller.account_id, &account, &named.name]).await?.ok_or_else(|| {
        Error::not_found(
            EntityKind::Topic,
            format!("no topic {} you may follow", TopicRef::shown(account, &named.name)),
        )
    })?;
    let account: String = row.col("account")?;
    Ok(Topic { id: row.col("id")?, account_id: row.col("account_id")?, shown: TopicRef::shown(&account, &named.name) })
}

/// Makes `endpoint` a follower of `topic` (and tells the replicas, see [`follows_changed`]), its
/// cursor before the topic's newest posts within `backlog`: how many of those it will read first, or `None` when it followed
/// already (its cursor kept). Refused past [`MAX_SUBSCRIPTIONS`].
pub(crate) async fn follow(
    c: &impl GenericClient,
    endpoint: EndpointId,
    topic: i64,
    backlog: Backlog,
) -> Result<Option<u64>> {
    let stmt = c
        .prepare_cached(
            "with room as (select count(*) < $3 as ok from topic_subscriptions where endpoint_id = $1),
             start as (
                 select greatest(t.head_seq - $4,
                                 coalesce((select max(p.seq) from topic_posts p
                                           where p.topic_id = t.id and p.created_at < now() - make_interval(secs => $5)), 0))
                        as seq, t.head_seq
                 from topics t where t.id = $2),
             made as (
                 insert into topic_subscriptions (endpoint_id, topic_id, read_seq, shown_seq)
                 select $1, $2, start.seq, start.seq from start, room where room.ok
                 on conflict (endpoint_id, topic_id) do nothing
                 returning read_seq)
             select (select ok from room) as room,
                    (select count(*) from made) as made,
                    (select count(*) from topic_posts p, made
                     where p.topic_id = $2 and p.seq > made.read_seq and p.sender_id <> $1) as backlog,
                    exists (select 1 from topic_subscriptions where endpoint_id = $1 and topic_id = $2) as already",
        )
        .await?;
    let (posts, age_s) = (i64::from(backlog.posts), backlog.max_age_s as f64);
    let row = c.query_one(&stmt, &[&endpoint, &topic, &MAX_SUBSCRIPTIONS, &posts, &age_s]).await?;
    let (room, made, backlog, already): (bool, i64, i64, bool) =
        (row.col("room")?, row.col("made")?, row.col("backlog")?, row.col("already")?);
    if made == 1 {
        follows_changed(c, endpoint).await?;
        return Ok(Some(backlog.max(0) as u64));
    }
    if already {
        return Ok(None);
    }
    if !room {
        return Err(Error::ResourceExhausted(format!(
            "you follow {MAX_SUBSCRIPTIONS} topics, the most one agent may: unfollow one first"
        ))
        .into());
    }
    Err(Error::not_found(EntityKind::Topic, "the topic is gone").into())
}

/// Stops `endpoint` following topic `name` of `account`; whether it did.
pub(crate) async fn unfollow(c: &impl GenericClient, endpoint: EndpointId, account: &str, name: &str) -> Result<bool> {
    let stmt = c
        .prepare_cached(&format!(
            "with gone as (
                 delete from topic_subscriptions ts using topics t, accounts a
                 where ts.endpoint_id = $1 and t.id = ts.topic_id and a.id = t.account_id and a.name = $2 and t.name = $3
                 returning 1)
             select count(*) as gone, (select count(*) from (select pg_notify('{TOPIC_CHANNEL}', 'e' || $1::bigint::text) from gone) n)
             from gone"
        ))
        .await?;
    Ok(c.query_one(&stmt, &[&endpoint, &account, &name]).await?.col::<i64>("gone")? == 1)
}

/// Tells the replicas that what `endpoint` follows changed: its stream reads its topics again.
pub(crate) async fn follows_changed(c: &impl GenericClient, endpoint: EndpointId) -> Result<()> {
    let stmt = c.prepare_cached(&format!("select pg_notify('{TOPIC_CHANNEL}', 'e' || $1::bigint::text)")).await?;
    c.execute(&stmt, &[&endpoint]).await?;
    Ok(())
}

/// The topics `endpoint` follows and may still read, each with the newest post it read.
pub(crate) async fn follows_of(c: &impl GenericClient, endpoint: EndpointId) -> Result<Vec<(i64, i64)>> {
    let stmt = c
        .prepare_cached(concat!(
            "select ts.topic_id, ts.read_seq from topic_subscriptions ts
             join endpoints fe on fe.id = ts.endpoint_id
             join machines fm on fm.id = fe.machine_id
             join topics t on t.id = ts.topic_id
             where ts.endpoint_id = $1 and ",
            readable!()
        ))
        .await?;
    c.query(&stmt, &[&endpoint]).await?.iter().map(|r| Ok((r.col("topic_id")?, r.col("read_seq")?))).collect()
}

/// Post `seq` of `topic`, as its followers read it: read once by a replica that hands it to them.
pub(crate) async fn post_at(c: &impl GenericClient, topic: i64, seq: i64) -> Result<Option<Message>> {
    let stmt = c
        .prepare_cached(concat!(
            "select p.seq as topic_seq, p.topic_id, ta.name || '/#' || t.name as topic, m.id, s.address as sender,
                    m.thread, m.kind, m.body, m.created_at, ",
            super::messages::files_column!("m.id"),
            "
             from topic_posts p
             join topics t on t.id = p.topic_id
             join accounts ta on ta.id = t.account_id
             join messages m on m.id = p.message_id
             join endpoint_addresses s on s.id = m.sender_id
             where p.topic_id = $1 and p.seq = $2"
        ))
        .await?;
    c.query_opt(&stmt, &[&topic, &seq]).await?.as_ref().map(post_from_row).transpose()
}

/// A post to write: its message and where it goes.
pub(crate) struct NewPost<'a> {
    pub id: &'a MessageId,
    pub sender: EndpointId,
    pub topic: i64,
    pub thread: &'a str,
    pub body: &'a str,
    pub client_id: Option<&'a str>,
}

/// What writing a post came to.
pub(crate) enum Posting {
    /// Written: its number in the topic, and how many follow the topic besides the poster.
    Posted { seq: i64, followers: i64 },
    /// A retry of an earlier post with the same client id: nothing new was written.
    Duplicate,
}

/// Writes a post in one statement: its message, its number (the topic's head moves, in order
/// under the topic row's lock), and a notification of the topic for the replicas whose streams
/// follow it.
pub(crate) async fn publish(c: &impl GenericClient, post: &NewPost<'_>) -> Result<Posting> {
    let stmt = c
        .prepare_cached(&format!(
            "with m as (
                 insert into messages (id, sender_id, client_id, thread, kind, body)
                 values ($1, $2, $3, $4, $5, $6)
                 on conflict (sender_id, client_id) do nothing
                 returning id),
             t as (update topics set head_seq = head_seq + 1 where id = $7 and exists (select 1 from m)
                   returning id, head_seq),
             -- Stamped after the topic row's lock, so posts' times follow their numbers.
             p as (insert into topic_posts (topic_id, seq, message_id, sender_id, created_at)
                   select t.id, t.head_seq, m.id, $2, clock_timestamp() from t, m returning seq),
             -- A poster that follows the topic and had read up to here is past its own post.
             own as (update topic_subscriptions s set read_seq = p.seq, shown_seq = greatest(s.shown_seq, p.seq)
                     from p where s.endpoint_id = $2 and s.topic_id = $7 and s.read_seq = p.seq - 1),
             n as (select pg_notify('{TOPIC_CHANNEL}', $7::text || ':' || p.seq) from p)
             select (select seq from p) as seq,
                    (select count(*) from n) as notified,
                    (select count(*) from topic_subscriptions where topic_id = $7 and endpoint_id <> $2) as followers"
        ))
        .await?;
    let row = c
        .query_one(
            &stmt,
            &[post.id, &post.sender, &post.client_id, &post.thread, &Kind::Message.to_db(), &post.body, &post.topic],
        )
        .await?;
    Ok(match row.col::<Option<i64>>("seq")? {
        Some(seq) => Posting::Posted { seq, followers: row.col("followers")? },
        None => Posting::Duplicate,
    })
}

/// The first `limit` (at least one) posts `endpoint` follows and has not read (others' posts
/// above its cursors), oldest first, as messages; and how many it has not read in all. One
/// statement, an index probe for an endpoint that follows nothing.
pub(crate) async fn unread(c: &impl GenericClient, endpoint: EndpointId, limit: i64) -> Result<(Vec<Message>, u64)> {
    above(c, endpoint, &[], limit).await
}

/// As [`unread`], above `pushed` too where it names a topic (a stream's newest post pushed).
pub(crate) async fn above(
    c: &impl GenericClient,
    endpoint: EndpointId,
    pushed: &[(i64, i64)],
    limit: i64,
) -> Result<(Vec<Message>, u64)> {
    let sql = concat!(
        "select p.seq as topic_seq, p.topic_id, ta.name || '/#' || t.name as topic, m.id, s.address as sender,
                m.thread, m.kind, m.body, m.created_at, count(*) over () as unread, ",
        super::messages::files_column!("m.id"),
        "
         from topic_subscriptions ts
         join endpoints fe on fe.id = ts.endpoint_id
         join machines fm on fm.id = fe.machine_id
         left join unnest($3::bigint[], $4::bigint[]) as pu(topic_id, seq) on pu.topic_id = ts.topic_id
         join topic_posts p on p.topic_id = ts.topic_id and p.seq > greatest(ts.read_seq, coalesce(pu.seq, 0))
         join topics t on t.id = ts.topic_id
         join accounts ta on ta.id = t.account_id
         join messages m on m.id = p.message_id
         join endpoint_addresses s on s.id = m.sender_id
         where ts.endpoint_id = $1 and p.sender_id <> $1 and ",
        readable!(),
        "
         order by p.created_at, p.topic_id, p.seq
         limit $2"
    );
    let stmt = c.prepare_cached(sql).await?;
    let (topics, seqs): (Vec<i64>, Vec<i64>) = pushed.iter().copied().unzip();
    let rows = c.query(&stmt, &[&endpoint, &limit.max(1), &topics, &seqs]).await?;
    let unread = rows.first().map(|r| r.col::<i64>("unread")).transpose()?.unwrap_or(0);
    let posts = rows.iter().take(limit.max(0) as usize).map(post_from_row).collect::<Result<_>>()?;
    Ok((posts, unread.max(0) as u64))
}

fn post_from_row(row: &Row) -> Result<Message> {
    let sent_at: chrono::DateTime<chrono::Utc> = row.col("created_at")?;
    Ok(Message {
        id: row.col("id")?,
        seq: crate::domain::ids::Seq(0),
        from: row.col("sender")?,
        thread: row.col("thread")?,
        kind: Kind::from_db(row.col("kind")?)?,
        body: row.col("body")?,
        reply_to: None,
        sent_at_ms: sent_at.timestamp_millis(),
        relation: String::new(),
        require_reply: false,
        private: false,
        attachments: super::messages::files(row.col("files")?)?,
        post: Some(Posted { topic: row.col("topic")?, topic_id: row.col("topic_id")?, seq: row.col("topic_seq")? }),
    })
}

/// Moves `endpoint`'s cursors past the posts it read (never back).
pub(crate) async fn read(c: &impl GenericClient, endpoint: EndpointId, posts: &[&Posted]) -> Result<()> {
    if posts.is_empty() {
        return Ok(());
    }
    let topics: Vec<i64> = posts.iter().map(|p| p.topic_id).collect();
    let seqs: Vec<i64> = posts.iter().map(|p| p.seq).collect();
    let stmt = c
        .prepare_cached(
            "update topic_subscriptions s set read_seq = greatest(s.read_seq, r.seq)
             from (select topic_id, max(seq) as seq from unnest($2::bigint[], $3::bigint[]) as u(topic_id, seq)
                   group by topic_id) r
             where s.endpoint_id = $1 and s.topic_id = r.topic_id",
        )
        .await?;
    c.execute(&stmt, &[&endpoint, &topics, &seqs]).await?;
    Ok(())
}

/// How many posts endpoint `$1` follows and has not read, as a statement or a subquery.
pub(crate) const UNREAD_COUNT: &str = concat!(
    "select count(*) from topic_subscriptions ts
     join endpoints fe on fe.id = ts.endpoint_id
     join machines fm on fm.id = fe.machine_id
     join topics t on t.id = ts.topic_id
     join topic_posts p on p.topic_id = ts.topic_id and p.seq > ts.read_seq
     where ts.endpoint_id = $1 and p.sender_id <> $1 and ",
    readable!()
);

/// The topics of `account`, each with its followers and its newest posts (at most `per_topic`,
/// newest first): two statements.
pub(crate) async fn of_account(c: &impl GenericClient, account: AccountId, per_topic: i64) -> Result<Vec<TopicPosts>> {
    let topics = c
        .prepare_cached(
            "select t.id, a.name || '/#' || t.name as topic, t.open_to_contacts,
                    (select count(*) from topic_subscriptions s where s.topic_id = t.id) as followers
             from topics t join accounts a on a.id = t.account_id
             where t.account_id = $1 order by t.name",
        )
        .await?;
    let posts = c
        .prepare_cached(concat!(
            "select p.topic_id, m.id, m.thread, m.body, m.created_at, s.address as sender, ",
            super::messages::files_column!("m.id"),
            "
             from topics t
             cross join lateral (select * from topic_posts p where p.topic_id = t.id order by p.seq desc limit $2) p
             join messages m on m.id = p.message_id
             join endpoint_addresses s on s.id = m.sender_id
             where t.account_id = $1
             order by p.topic_id, p.seq desc"
        ))
        .await?;
    let (by_account, with_limit): (
        &[&(dyn tokio_postgres::types::ToSql + Sync)],
        &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) = (&[&account], &[&account, &per_topic]);
    let (topics, posts) = tokio::try_join!(c.query(&topics, by_account), c.query(&posts, with_limit))?;
    let mut shown: Vec<(i64, TopicPosts)> = topics
        .iter()
        .map(|r| {
            let topic = TopicPosts {
                topic: r.col("topic")?,
                open: r.col("open_to_contacts")?,
                followers: r.col("followers")?,
                posts: Vec::new(),
            };
            Ok((r.col("id")?, topic))
        })
        .collect::<Result<_>>()?;
    for row in &posts {
        let id: i64 = row.col("topic_id")?;
        if let Some((_, topic)) = shown.iter_mut().find(|(t, _)| *t == id) {
            topic.posts.push(Exchanged {
                id: row.col("id")?,
                thread: row.col("thread")?,
                from: row.col("sender")?,
                to: vec![topic.topic.clone()],
                body: row.col("body")?,
                at: row.col("created_at")?,
                files: super::messages::files(row.col("files")?)?,
            });
        }
    }
    Ok(shown.into_iter().map(|(_, t)| t).collect())
}

/// Who may read the open topics of `accounts` changed (a contact between them dropped): the
/// streams following them read their topics again, with the transaction.
pub(crate) async fn reach_changed(c: &impl GenericClient, accounts: &[AccountId]) -> Result<()> {
    let stmt = c
        .prepare_cached(&format!(
            "select count(pg_notify('{TOPIC_CHANNEL}', 'c' || id::text)) from topics
             where account_id = any($1) and open_to_contacts"
        ))
        .await?;
    c.query_one(&stmt, &[&accounts]).await?;
    Ok(())
}

/// Opens topic `name` of account `account` to its contacts, or closes it; whether there is such a
/// topic. Closed, its contacts' followers read no more of it, and none may follow it anew.
pub(crate) async fn set_open(c: &impl GenericClient, account: &str, name: &str, open: bool) -> Result<bool> {
    let stmt = c
        .prepare_cached(&format!(
            "with set as (
                 update topics t set open_to_contacts = $3 from accounts a
                 where a.id = t.account_id and a.name = $1 and t.name = $2 returning t.id)
             select count(*) as set,
                    (select count(*) from (select pg_notify('{TOPIC_CHANNEL}', 'c' || id::text) from set) n)
             from set"
        ))
        .await?;
    Ok(c.query_one(&stmt, &[&account, &name, &open]).await?.col::<i64>("set")? == 1)
}

/// Names the posts `endpoint` follows that its model was not told of (up to `limit`, oldest first)
/// and marks them told, once: under the endpoint's row lock, as the announcement of its deliveries
/// takes it, so two hooks asking at once never tell the same post twice. With how many posts it
/// has unread in all.
pub(crate) async fn announce(
    client: &mut deadpool_postgres::Object,
    endpoint: EndpointId,
    limit: i64,
) -> Result<(Vec<Announced>, u64)> {
    let tx = super::begin(client).await?;
    // Its own statement: the next one's snapshot then sees what an announcement before it told.
    tx.execute("select 1 from endpoints where id = $1 for no key update", &[&endpoint]).await?;
    let stmt = tx
        .prepare_cached(concat!(
            "with unshown as (
                 select p.topic_id, p.seq, m.id, s.address as sender, m.kind, ta.name || '/#' || t.name as topic,
                        p.created_at
                 from topic_subscriptions ts
                 join endpoints fe on fe.id = ts.endpoint_id
                 join machines fm on fm.id = fe.machine_id
                 join topics t on t.id = ts.topic_id
                 join accounts ta on ta.id = t.account_id
                 join topic_posts p on p.topic_id = ts.topic_id and p.seq > greatest(ts.read_seq, ts.shown_seq)
                 join messages m on m.id = p.message_id
                 join endpoint_addresses s on s.id = m.sender_id
                 where ts.endpoint_id = $1 and p.sender_id <> $1 and ",
            readable!(),
            "
                 order by p.created_at, p.topic_id, p.seq
                 limit $2),
             told as (
                 update topic_subscriptions ts set shown_seq = u.seq
                 from (select topic_id, max(seq) as seq from unshown group by topic_id) u
                 where ts.endpoint_id = $1 and ts.topic_id = u.topic_id)
             select u.*, (",
            "select count(*) from topic_subscriptions ts
              join endpoints fe on fe.id = ts.endpoint_id
              join machines fm on fm.id = fe.machine_id
              join topics t on t.id = ts.topic_id
              join topic_posts p on p.topic_id = ts.topic_id and p.seq > ts.read_seq
              where ts.endpoint_id = $1 and p.sender_id <> $1 and ",
            readable!(),
            ") as unread from unshown u order by u.created_at, u.topic_id, u.seq"
        ))
        .await?;
    let rows = tx.query(&stmt, &[&endpoint, &limit]).await?;
    super::commit(tx).await?;
    let unread = rows.first().map(|r| r.col::<i64>("unread")).transpose()?.unwrap_or(0).max(0) as u64;
    let told = rows
        .iter()
        .map(|r| {
            Ok(Announced {
                id: r.col("id")?,
                seq: crate::domain::ids::Seq(r.col("seq")?),
                from: r.col("sender")?,
                kind: Kind::from_db(r.col("kind")?)?,
                require_reply: false,
                topic: Some(r.col("topic")?),
            })
        })
        .collect::<Result<_>>()?;
    Ok((told, unread))
}
