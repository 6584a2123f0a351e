//! Search at scale. `stored` messages, each delivered to one of a thousand inboxes, are written
//! into the real tables (bodies of 12 to 30 words from a vocabulary whose frequencies fall off as
//! words' do: the commonest in most messages, the rarest in a handful); the server's own indexing
//! statement (`store::search::INDEX_QUEUED`, as the scheduler's rounds run it) writes their search
//! entries, timed; then the server's search statement (`store::search::SEARCH`) is timed for one
//! reader — about a thousandth of the messages in its reach — with a rare word, a common word (in
//! about one message in ten), a very common one (in most), two words and a phrase.

use std::time::{Duration, Instant};

use relay_server::domain::search::INDEX_BATCH;
use relay_server::store::search::{INDEX_QUEUED, SEARCH};

use super::db_client;

/// Inboxes the messages are spread over; the reader is one of them.
const INBOXES: i64 = 1_000;
/// Words in the vocabulary.
const WORDS: usize = 4_000;
/// Messages written per statement while filling.
const FILL_CHUNK: i64 = 50_000;
/// Searches timed per query.
const SEARCHES: usize = 200;

/// What one kind of query cost.
pub struct Timed {
    pub what: &'static str,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub found: usize,
}

/// Word `i` of the vocabulary: syllables for its digits, so that words are words to the parser.
fn word(i: usize) -> String {
    const SYLLABLES: [&str; 10] = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "bu"];
    let mut w = String::from("w");
    for d in i.to_string().bytes() {
        w.push_str(SYLLABLES[usize::from(d - b'0')]);
    }
    w
}

/// Fills the tables with `stored` messages (a thousand inboxes, one delivery each), indexes them as
/// the server does, times the searches, and deletes what it wrote.
pub async fn measure(url: &str, stored: i64) -> Vec<Timed> {
    let db = db_client(url).await;
    let vocabulary: Vec<String> = (0..WORDS).map(word).collect();
    let base: i64 = db
        .query_one(
            "with a as (insert into accounts (name) values ('search-bench') returning id),
                  m as (insert into machines (account_id, name, token_hash)
                        select id, 'box', sha256('search-bench'::bytea) from a returning id),
                  e as (insert into endpoints (machine_id, handle)
                        select m.id, 'agent-' || g from m, generate_series(0, $1::bigint - 1) g returning id)
             select min(id) from e",
            &[&INBOXES],
        )
        .await
        .expect("make the bench's inboxes")
        .get(0);
    // Word k is drawn with a probability falling off with k (a power law): floor(W^u) - 1.
    let fill = db
        .prepare(
            "with m as (
                 insert into messages (id, sender_id, thread, kind, body, created_at)
                 select 'search' || g, $3::bigint + (g * 31 % $4::bigint), 'search' || g, 1,
                        (select string_agg(($5::text[])[floor(power($6::float8, random()))::int], ' ')
                         from generate_series(1, 12 + (g % 19) + 0 * g)),
                        now() - make_interval(secs => ($2::bigint - g)::float8 / 100)
                 from generate_series($1::bigint, $2::bigint) g
                 returning id, sender_id)
             insert into deliveries (recipient_id, seq, message_id)
             select $3::bigint + (substr(m.id, 7)::bigint % $4::bigint), substr(m.id, 7)::bigint, m.id from m",
        )
        .await
        .expect("prepare the fill");
    let started = Instant::now();
    let mut n = 0;
    while n < stored {
        let last = (n + FILL_CHUNK).min(stored);
        db.execute(&fill, &[&(n + 1), &last, &base, &INBOXES, &vocabulary, &(WORDS as f64)])
            .await
            .expect("fill the messages");
        n = last;
    }
    let filled = started.elapsed();
    // The server's own rounds take from the same queue meanwhile (`skip locked`): the time is until
    // the queue is empty, the work both processes' (on this host's cores).
    let index = db.prepare(INDEX_QUEUED).await.expect("prepare the indexing");
    let started = Instant::now();
    loop {
        let taken: i64 = db.query_one(&index, &[&INDEX_BATCH]).await.expect("index a batch").get(0);
        if taken == 0 {
            let queued: i64 = db.query_one("select count(*) from search_queue", &[]).await.expect("queue").get(0);
            if queued == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let indexing = started.elapsed();
    let entries: i64 = db.query_one("select count(*) from search_entries", &[]).await.expect("entries").get(0);
    // Alone: VACUUM cannot run in the transaction several statements of one call share.
    db.batch_execute("vacuum (analyze) messages, deliveries, search_entries, search_queue").await.expect("vacuum");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "search phase: {stored} messages written in {:.0} s; their {entries} search entries written in {:.0} s \
         by batches of {INDEX_BATCH} (this process and the server's rounds): {:.0} messages/s, at most {:.0} us \
         of the host's {cores} cores a message",
        filled.as_secs_f64(),
        indexing.as_secs_f64(),
        stored as f64 / indexing.as_secs_f64(),
        indexing.as_secs_f64() * cores * 1e6 / stored as f64
    );

    let reader = base + 500;
    let statement = db.prepare(SEARCH).await.expect("prepare the search");
    let queries = [
        ("a rare word", vocabulary[WORDS - 7].clone()),
        ("a common word", vocabulary[20].clone()),
        ("a very common word", vocabulary[1].clone()),
        ("two words", format!("{} {}", vocabulary[2], vocabulary[40])),
        ("a phrase", format!("\"{} {}\"", vocabulary[1], vocabulary[2])),
    ];
    let none: Option<i64> = None;
    let (no_text, no_time): (Option<&str>, Option<std::time::SystemTime>) = (None, None);
    let mut timed = Vec::new();
    for (what, words) in &queries {
        let mut samples = Vec::with_capacity(SEARCHES);
        let mut found = 0;
        for _ in 0..SEARCHES {
            let t = Instant::now();
            let rows = db
                .query(&statement, &[&reader, words, &none, &none, &no_text, &no_time, &10i64])
                .await
                .expect("search");
            samples.push(t.elapsed());
            found = rows.len() - 1;
        }
        samples.sort();
        let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        timed.push(Timed { what, p50_ms: ms(at(0.5)), p95_ms: ms(at(0.95)), found });
    }
    db.batch_execute(
        "delete from deliveries where message_id like 'search%';
         delete from messages where id like 'search%';
         delete from accounts where name = 'search-bench'",
    )
    .await
    .expect("remove what the search phase wrote");
    timed
}
