//! Finding messages by their words among those an agent may read: what it received (not
//! withdrawn) and what it sent. Each reader's messages have entries of their own (migration 45),
//! their words prefixed with the reader's id, written off the send path by [`index_queued`]; a
//! search prefixes its words the same way, so it reads the reader's matches alone, ranks them, and
//! makes snippets for the answer's rows only. (`e.reader = $1` is checked as well: the rewrite of
//! the query can only narrow it, and the check says so where the statement is read.)

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::row::{Col, FromRow};
use crate::domain::ids::EndpointId;
use crate::domain::search::Found;
use crate::store::Result;

/// The search, as relay-bench times it: `$1` the reader, `$2` the words, `$3` a sender, `$4` a
/// recipient (of what the reader sent; the reader itself: what it received — who else received a
/// message is its sender's to know), `$5` a thread, `$6` the oldest time, `$7` the most rows. Always
/// one row more than the matches: the first says how many words the query holds (none: nothing can
/// match) and whether it only excludes (`-word`), which no index can serve.
pub const SEARCH: &str = "
    with q as (select websearch_to_tsquery('simple', $2) as q),
    mine as (select relay_search_query($1, q.q) as q from q),
    hits as (
        select e.message_id, e.thread, e.sender, e.created_at, ts_rank_cd(e.words, mine.q) as rank
        from mine, search_entries e
        where e.words @@ mine.q and e.reader = $1
          -- Constant for the statement, so checked once before the scan: a query that only leaves
          -- words out would read every entry of the index.
          and querytree(websearch_to_tsquery('simple', $2)) <> 'T'
          and ($3::bigint is null or e.sender = $3)
          and ($4::bigint is null
               or ($4 = $1 and e.sender <> $1)
               or (e.sender = $1
                   and exists (select 1 from deliveries t where t.message_id = e.message_id and t.recipient_id = $4)))
          and ($5::text is null or e.thread = $5)
          and ($6::timestamptz is null or e.created_at >= $6)
        order by rank desc, e.created_at desc, e.message_id
        limit $7
    )
    select numnode(q.q) as words, querytree(q.q) = 'T' as excluding_only, null::text as id, null::text as thread, null::text as sender,
           null::timestamptz as created_at, null::real as rank, null::text as snippet
    from q
    union all
    select null, null, h.message_id, h.thread, a.address, h.created_at, h.rank,
           ts_headline('simple', m.body, q.q,
                       'MaxFragments=2, MaxWords=14, MinWords=5, StartSel=«, StopSel=», FragmentDelimiter=\" … \"')
    from hits h cross join q
    join messages m on m.id = h.message_id
    join endpoint_addresses a on a.id = h.sender";

/// Writes the search entries of up to `$1` queued messages and takes them off the queue, in one
/// statement: each message's words computed once, an entry for its sender and for each inbox it
/// was delivered to and not withdrawn from (a held message's inboxes get theirs when it is
/// released, which queues it again). Rows are taken `skip locked`, so replicas share the queue.
/// Answers how many messages it took.
pub const INDEX_QUEUED: &str = "
    with taken as (
        delete from search_queue q
        where q.message_id in (select message_id from search_queue order by message_id limit $1
                               for update skip locked)
        returning q.message_id),
    worded as materialized (
        select m.id, m.sender_id, m.thread, m.created_at, to_tsvector('simple', m.body) as words
        from taken t join messages m on m.id = t.message_id),
    readers as (
        select w.sender_id as reader, w.id from worded w
        union
        select d.recipient_id, w.id from worded w join deliveries d on d.message_id = w.id
        where d.state <> relay_state('withdrawn')),
    written as (
        insert into search_entries (reader, message_id, sender, thread, created_at, words)
        select r.reader, w.id, w.sender_id, w.thread, w.created_at, relay_search_words(r.reader, w.words)
        from readers r join worded w on w.id = r.id
        on conflict do nothing
        returning 1)
    select (select count(*) from taken) as taken";

/// Taken by an indexing round before its statement reads the queue, until it commits: a change to
/// who may find a message (`relay_search_readers_change`) waits for the round, and the round for it.
const ROUND_LOCK: &str = "select pg_advisory_xact_lock_shared(hashtextextended('relay_search_entries', 0))";

/// Indexes up to `batch` queued messages (see [`INDEX_QUEUED`]) in a transaction of its own; how
/// many it took.
pub(crate) async fn index_queued(c: &mut deadpool_postgres::Object, batch: i64) -> Result<u64> {
    let tx = c.transaction().await?;
    let lock = tx.prepare_cached(ROUND_LOCK).await?;
    tx.execute(&lock, &[]).await?;
    let stmt = tx.prepare_cached(INDEX_QUEUED).await?;
    let row = tx.query_one(&stmt, &[&batch]).await?;
    tx.commit().await?;
    Ok(u64::try_from(row.col::<i64>("taken")?).unwrap_or(0))
}

/// What a search asks of the store, addresses resolved to endpoints.
pub struct Asked<'a> {
    pub reader: EndpointId,
    pub words: &'a str,
    pub from: Option<EndpointId>,
    pub to: Option<EndpointId>,
    pub thread: Option<&'a str>,
    pub since: Option<DateTime<Utc>>,
    pub limit: u32,
}

/// What a search found, or why it could not look.
#[derive(Debug)]
pub enum Searched {
    /// The best matches, best first.
    Found(Vec<Found>),
    /// The query holds no words (only punctuation or operators).
    NoWords,
    /// Every word in the query is one to leave out (`-word`).
    OnlyExcluded,
}

pub async fn search(c: &impl GenericClient, asked: &Asked<'_>) -> Result<Searched> {
    let stmt = c.prepare_cached(SEARCH).await?;
    let limit = i64::from(asked.limit);
    let rows = c
        .query(&stmt, &[&asked.reader, &asked.words, &asked.from, &asked.to, &asked.thread, &asked.since, &limit])
        .await?;
    let header = rows.iter().find(|r| r.col::<Option<i32>>("words").ok().flatten().is_some());
    let words: i32 = header.map_or(Ok(0), |r| r.col("words"))?;
    if words == 0 {
        return Ok(Searched::NoWords);
    }
    if header.map_or(Ok(false), |r| r.col::<bool>("excluding_only"))? {
        return Ok(Searched::OnlyExcluded);
    }
    let mut found: Vec<Found> = rows
        .iter()
        .filter(|r| r.col::<Option<String>>("id").ok().flatten().is_some())
        .map(Found::from_row)
        .collect::<Result<_>>()?;
    // `union all` keeps no order: the ranking is said again here.
    found.sort_by(|a, b| b.rank.total_cmp(&a.rank).then(b.created_at.cmp(&a.created_at)));
    Ok(Searched::Found(found))
}

impl FromRow for Found {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Found {
            id: row.col("id")?,
            thread: row.col("thread")?,
            from: row.col("sender")?,
            created_at: row.col("created_at")?,
            snippet: row.col("snippet")?,
            rank: row.col("rank")?,
        })
    }
}

/// How many messages wait to be indexed, for `/metrics`: a backlog that does not drain says the
/// rounds cannot keep up.
pub(crate) async fn queued(c: &impl GenericClient) -> Result<i64> {
    let stmt = c.prepare_cached("select count(*) from search_queue").await?;
    Ok(c.query_one(&stmt, &[]).await?.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::Target;
    use crate::store::testing;

    impl Searched {
        fn found(self) -> Vec<Found> {
            match self {
                Searched::Found(found) => found,
                other => panic!("no search: {other:?}"),
            }
        }
    }

    /// Runs the indexing rounds until the queue is empty; how many messages they took.
    async fn index_all(c: &mut deadpool_postgres::Object) -> u64 {
        let mut total = 0;
        loop {
            match index_queued(c, 2).await.unwrap() {
                0 => return total,
                n => total += n,
            }
        }
    }

    #[tokio::test]
    async fn a_reader_finds_by_words_what_it_received_or_sent_once_indexed_and_nothing_else() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let (other, box_) = db.machine("other", "box").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let bob = db.endpoint(laptop, "bob", 0).await;
        let cid = db.endpoint(laptop, "cid", 0).await;
        let eve = db.endpoint(box_, "eve", 0).await;
        let to = |id, handle: &str| Target { id, address: format!("acme/laptop/{handle}"), account_id: acme };
        let asked = db.send(bob, &[to(ann, "ann")], "the deploy of parse_config failed on staging", None, None).await;
        db.send(ann, &[to(bob, "bob")], "retrying the deploy after lunch", None, Some(&asked)).await;
        db.send(bob, &[to(cid, "cid")], "deploy secrets rotated", None, None).await;
        db.send(ann, &[to(cid, "cid")], "lunch at noon", None, None).await;
        db.send(bob, &[to(ann, "ann"), to(cid, "cid")], "standup moved to ten", None, None).await;
        let mut c = db.store.client().await.unwrap();
        let ask = |reader, words| Asked { reader, words, from: None, to: None, thread: None, since: None, limit: 10 };

        // Written off the send path: nothing is found until a round indexes the queue, in batches.
        assert!(search(&c, &ask(ann, "deploy")).await.unwrap().found().is_empty());
        assert_eq!(index_all(&mut c).await, 5);
        assert_eq!(index_queued(&mut c, 10).await.unwrap(), 0, "each message is indexed once");

        // ann received one deploy message and sent one; cid's is not hers.
        let found = search(&c, &ask(ann, "deploy")).await.unwrap().found();
        let bodies: Vec<&str> = found.iter().map(|f| f.snippet.as_str()).collect();
        assert_eq!(found.len(), 2, "{bodies:?}");
        assert!(bodies.iter().all(|s| s.contains("«deploy»")), "{bodies:?}");
        assert!(found.iter().any(|f| f.from == "acme/laptop/bob" && f.thread == asked.to_string()));
        // Identifiers match as written, phrases in order, and `-word` leaves out.
        assert_eq!(search(&c, &ask(ann, "parse_config")).await.unwrap().found().len(), 1);
        assert_eq!(search(&c, &ask(ann, "\"deploy after\"")).await.unwrap().found().len(), 1);
        assert_eq!(search(&c, &ask(ann, "deploy -lunch")).await.unwrap().found().len(), 1);
        // Filters: by sender, by recipient, by thread, by time.
        let from_bob = Asked { from: Some(bob), ..ask(ann, "deploy") };
        assert_eq!(search(&c, &from_bob).await.unwrap().found().len(), 1);
        let to_cid = Asked { to: Some(cid), ..ask(ann, "lunch") };
        assert_eq!(search(&c, &to_cid).await.unwrap().found()[0].snippet, "«lunch» at noon");
        let thread = asked.to_string();
        let in_thread = Asked { thread: Some(&thread), ..ask(cid, "deploy") };
        assert!(search(&c, &in_thread).await.unwrap().found().is_empty(), "cid's deploy is another thread");
        let later = Asked { since: Some(Utc::now() + chrono::Duration::minutes(1)), ..ask(ann, "deploy") };
        assert!(search(&c, &later).await.unwrap().found().is_empty());
        let limited = Asked { limit: 1, ..ask(ann, "deploy") };
        assert_eq!(search(&c, &limited).await.unwrap().found().len(), 1);
        // Another account's agent finds nothing of acme's; words that are no words are told apart.
        assert!(search(&c, &ask(eve, "deploy")).await.unwrap().found().is_empty());
        assert!(matches!(search(&c, &ask(ann, "!!! --")).await.unwrap(), Searched::NoWords));
        assert!(matches!(search(&c, &ask(ann, "-deploy")).await.unwrap(), Searched::OnlyExcluded));
        assert!(matches!(search(&c, &ask(ann, "-deploy or -lunch")).await.unwrap(), Searched::OnlyExcluded));
        // A recipient filter reaches what the reader sent, or (naming the reader) what it received:
        // who else received a message is its sender's to know.
        let to_ann = Asked { to: Some(ann), ..ask(ann, "deploy") };
        assert_eq!(search(&c, &to_ann).await.unwrap().found()[0].from, "acme/laptop/bob");
        assert_eq!(search(&c, &Asked { to: Some(ann), ..ask(ann, "standup") }).await.unwrap().found().len(), 1);
        let also_to_cid = Asked { to: Some(cid), ..ask(ann, "standup") };
        assert!(search(&c, &also_to_cid).await.unwrap().found().is_empty(), "bob's other recipient is bob's to know");
        // Words written as another reader's stored form still match the caller's own entries only.
        let forged = format!("{}:staging", ann.0);
        assert!(search(&c, &ask(cid, &forged)).await.unwrap().found().is_empty(), "ann's is not cid's");

        // A delivery withdrawn (the contact dropped) is no longer its reader's; the sender keeps it.
        crate::store::contacts::insert_request(&c, other, acme).await.unwrap();
        crate::store::contacts::make_contact(&c, acme, other).await.unwrap();
        let eve_to_ann = Target { id: ann, address: "acme/laptop/ann".into(), account_id: acme };
        db.send(eve, &[eve_to_ann], "a deploy from a contact", None, None).await;
        assert_eq!(index_all(&mut c).await, 1);
        assert_eq!(search(&c, &ask(ann, "contact")).await.unwrap().found().len(), 1);
        assert_eq!(crate::store::contacts::withdraw_between(&c, acme, other, "dropped").await.unwrap(), 1);
        assert!(search(&c, &ask(ann, "contact")).await.unwrap().found().is_empty());
        assert_eq!(search(&c, &ask(eve, "contact")).await.unwrap().found().len(), 1);

        // A word too long to index once prefixed (to_tsvector keeps up to 2,046 bytes) is left out,
        // and its message and the batch it is in are indexed all the same.
        let long = format!("{} heartbeat", "x".repeat(2_045));
        db.send(bob, &[to(ann, "ann")], &long, None, None).await;
        db.send(bob, &[to(ann, "ann")], "a second heartbeat", None, None).await;
        assert_eq!(index_queued(&mut c, 10).await.unwrap(), 2);
        assert_eq!(search(&c, &ask(ann, "heartbeat")).await.unwrap().found().len(), 2);

        // A message released to an inbox (as a held message is) is queued again and found there.
        let lunch = search(&c, &ask(ann, "noon")).await.unwrap().found()[0].id.clone();
        assert!(search(&c, &ask(bob, "noon")).await.unwrap().found().is_empty());
        c.execute("select relay_write_release($1, array[$2::bigint], 0)", &[&lunch, &bob]).await.unwrap();
        assert_eq!(index_all(&mut c).await, 1);
        assert_eq!(search(&c, &ask(bob, "noon")).await.unwrap().found().len(), 1);
        assert_eq!(search(&c, &ask(ann, "noon")).await.unwrap().found().len(), 1, "written once for ann");

        // A purged message takes every reader's entry with it.
        let sql = db.test.sql().await;
        sql.execute("delete from messages where id = $1", &[&asked.to_string()]).await.unwrap();
        let left: i64 = sql
            .query_one("select count(*) from search_entries where message_id = $1", &[&asked.to_string()])
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0);
        assert_eq!(search(&c, &ask(ann, "deploy")).await.unwrap().found().len(), 1, "only what ann sent");
    }
}
