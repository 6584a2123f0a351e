//! What the loop guard reads and keeps: an account's bounds, what a pair of endpoints said to each
//! other lately (read from the newest deliveries of their two inboxes, so the cost does not grow
//! with their history), and when a person last cleared the pair or the guard last tripped on it.

use deadpool_postgres::GenericClient;

use super::row::Col;
use crate::domain::ids::{AccountId, EndpointId};
use crate::domain::loops::{MAX_BOUND, Seen, Settings};
use crate::store::{Result, Tx};

/// A pair as `loop_pairs` keys it.
fn ordered(x: EndpointId, y: EndpointId) -> (EndpointId, EndpointId) {
    if x < y { (x, y) } else { (y, x) }
}

/// The bounds of `account`, and what `from` and `to` said to each other since a person last
/// cleared them: within the window, and in `thread`. One statement.
pub(crate) async fn observe(
    c: &impl GenericClient,
    account: AccountId,
    from: EndpointId,
    to: EndpointId,
    thread: &str,
) -> Result<(Settings, Seen)> {
    let (a, b) = ordered(from, to);
    let stmt = c
        .prepare_cached(
            "with cleared as (
                 select coalesce((select cleared_at from loop_pairs where a = $1 and b = $2), '-infinity') as at
             ), recent as (
                 select m.created_at, m.thread, m.sender_id = $1 as from_a
                 from endpoints e
                 join deliveries d on d.recipient_id = e.id and d.seq > e.head_seq - $5
                 join messages m on m.id = d.message_id
                 where e.id in ($1, $2) and m.sender_id in ($1, $2) and m.sender_id <> e.id
                   and m.created_at > (select at from cleared)
             )
             select x.loop_max_messages, x.loop_window_s, x.loop_max_depth,
                    count(*) filter (where r.from_a and r.created_at > now() - make_interval(secs => x.loop_window_s))
                        as window_a,
                    count(*) filter (where not r.from_a and r.created_at > now() - make_interval(secs => x.loop_window_s))
                        as window_b,
                    count(*) filter (where r.from_a and r.thread = $4) as thread_a,
                    count(*) filter (where not r.from_a and r.thread = $4) as thread_b
             from accounts x left join recent r on true where x.id = $3
             group by x.id",
        )
        .await?;
    let row = c.query_one(&stmt, &[&a, &b, &account, &thread, &i64::from(MAX_BOUND)]).await?;
    let bound = |name: &str| -> Result<u32> { Ok(u32::try_from(row.col::<i32>(name)?).unwrap_or(0)) };
    let count = |name: &str| -> Result<u32> { Ok(u32::try_from(row.col::<i64>(name)?).unwrap_or(u32::MAX)) };
    let settings = Settings {
        max_messages: bound("loop_max_messages")?,
        window_s: bound("loop_window_s")?,
        max_depth: bound("loop_max_depth")?,
    };
    let seen = Seen {
        window: (count("window_a")?, count("window_b")?),
        thread: (count("thread_a")?, count("thread_b")?),
    };
    Ok((settings, seen))
}

/// Marks the pair tripped; whether this is the first trip since a person last cleared it (its
/// notices are sent then, not for every message held after).
pub(crate) async fn trip(tx: &Tx<'_>, from: EndpointId, to: EndpointId) -> Result<bool> {
    let (a, b) = ordered(from, to);
    let stmt = tx
        .prepare_cached(
            "insert into loop_pairs as p (a, b, tripped_at) values ($1, $2, now())
             on conflict (a, b) do update set tripped_at = now()
               where p.tripped_at is null or p.tripped_at < coalesce(p.cleared_at, '-infinity')
             returning 1",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&a, &b]).await?.is_some())
}

/// A person let the pair go on: what they said before now no longer counts.
pub(crate) async fn clear(c: &impl GenericClient, from: EndpointId, to: EndpointId) -> Result<()> {
    let (a, b) = ordered(from, to);
    c.execute(
        "insert into loop_pairs (a, b, cleared_at) values ($1, $2, now())
         on conflict (a, b) do update set cleared_at = now()",
        &[&a, &b],
    )
    .await?;
    Ok(())
}

/// Sets the account's bounds; `false` when there is no such account.
pub(crate) async fn set_settings(c: &impl GenericClient, account: &str, s: Settings) -> Result<bool> {
    let max_messages = i32::try_from(s.max_messages).unwrap_or(i32::MAX);
    let window_s = i32::try_from(s.window_s).unwrap_or(i32::MAX);
    let max_depth = i32::try_from(s.max_depth).unwrap_or(i32::MAX);
    let n = c
        .execute(
            "update accounts set loop_max_messages = $2, loop_window_s = $3, loop_max_depth = $4 where name = $1",
            &[&account, &max_messages, &window_s, &max_depth],
        )
        .await?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::Target;
    use crate::store::testing;

    #[tokio::test]
    async fn a_pairs_messages_are_counted_until_a_person_clears_them_and_a_trip_is_told_once() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let bob = db.endpoint(laptop, "bob", 0).await;
        let carl = db.endpoint(laptop, "carl", 0).await;
        let to = |id, handle: &str| Target { id, address: format!("acme/laptop/{handle}"), account_id: acme };
        let first = db.send(ann, &[to(bob, "bob")], "ping", None, None).await;
        let second = db.send(bob, &[to(ann, "ann")], "pong", None, Some(&first)).await;
        db.send(ann, &[to(bob, "bob")], "ping again", None, Some(&second)).await;
        db.send(ann, &[to(bob, "bob")], "a new thread", None, None).await;
        db.send(carl, &[to(bob, "bob")], "not of the pair", None, None).await;
        let c = db.store.client().await.unwrap();
        let thread = first.to_string();
        let (settings, seen) = observe(&c, acme, bob, ann, &thread).await.unwrap();
        assert_eq!(settings, Settings::default());
        // Each way, in the order of the endpoints' ids (ann's first), the pair's messages alone.
        assert_eq!(seen, Seen { window: (3, 1), thread: (2, 1) });

        let mut client = db.store.client().await.unwrap();
        let tx = crate::store::begin(&mut client).await.unwrap();
        assert!(trip(&tx, ann, bob).await.unwrap(), "the first trip is told");
        assert!(!trip(&tx, bob, ann).await.unwrap(), "not the next ones");
        tx.commit().await.unwrap();
        clear(&c, bob, ann).await.unwrap();
        let (_, seen) = observe(&c, acme, ann, bob, &thread).await.unwrap();
        assert_eq!(seen, Seen { window: (0, 0), thread: (0, 0) }, "what they said before a person cleared them");
        let tx = crate::store::begin(&mut client).await.unwrap();
        assert!(trip(&tx, ann, bob).await.unwrap(), "a trip after a clearing is told again");
        tx.commit().await.unwrap();

        let bounds = Settings::new(5, 30, 10).unwrap();
        assert!(set_settings(&c, "acme", bounds).await.unwrap());
        assert_eq!(observe(&c, acme, ann, bob, &thread).await.unwrap().0, bounds);
        assert!(!set_settings(&c, "nobody", bounds).await.unwrap());
    }
}
