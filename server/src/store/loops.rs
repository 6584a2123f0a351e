//! What the loop guard reads and keeps: an account's bounds; a thread's turns since a person last
//! spoke in it or let it go on (its newest messages, read by the thread's index: a send that starts
//! no conversation reads nothing); and the pairs it tripped on until a person clears them. A pair's
//! streak in any thread is kept by the writers themselves (`relay_write_*`, migration 44).

use deadpool_postgres::GenericClient;

use super::row::Col;
use crate::domain::ids::{AccountId, EndpointId};
use crate::domain::loops::{MAX_BOUND, Seen, Settings};
use crate::domain::names::HUMAN;
use crate::store::{Result, Tx};

/// A pair as `loop_pairs` keys it.
fn ordered(x: EndpointId, y: EndpointId) -> (EndpointId, EndpointId) {
    if x < y { (x, y) } else { (y, x) }
}

/// The bounds of `account`; the agents' turns in `thread` since a person last spoke in it or let it
/// go on, within the window and in all; and whether the guard stopped `from` and `to` already. One
/// statement, reading the thread's newest messages at most.
pub(crate) async fn observe(
    c: &impl GenericClient,
    account: AccountId,
    from: EndpointId,
    to: EndpointId,
    thread: &str,
) -> Result<(Settings, Seen, bool)> {
    let (a, b) = ordered(from, to);
    let stmt = c
        .prepare_cached(&format!(
            "with recent as (
                 select m.created_at, m.id, m.sender_id, mm.name = '{HUMAN}' as person
                 from messages m join endpoints e on e.id = m.sender_id join machines mm on mm.id = e.machine_id
                 where m.thread = $2 order by m.created_at desc, m.id desc limit $3
             ), since as (
                 select greatest(
                     coalesce((select max(created_at) from recent where person), '-infinity'),
                     coalesce((select cleared_at from loop_threads where thread = $2), '-infinity')) as at
             ), turns as (
                 select created_at,
                        sender_id is distinct from lag(sender_id) over (order by created_at, id) as turn
                 from recent where not person and created_at > (select at from since)
             )
             select x.loop_max_messages, x.loop_window_s, x.loop_max_depth,
                    count(t.*) filter (where t.turn and t.created_at > now() - make_interval(secs => x.loop_window_s))
                        as in_window,
                    count(t.*) filter (where t.turn) as in_thread,
                    exists (select 1 from loop_pairs p where p.a = $4 and p.b = $5
                              and p.tripped_at > coalesce(p.cleared_at, '-infinity')) as stopped
             from accounts x left join turns t on true where x.id = $1
             group by x.id"
        ))
        .await?;
    let row = c.query_one(&stmt, &[&account, &thread, &i64::from(MAX_BOUND + 1), &a, &b]).await?;
    let count = |name: &str| -> Result<u32> { Ok(u32::try_from(row.col::<i64>(name)?).unwrap_or(u32::MAX)) };
    let settings = settings_of(&row)?;
    let seen = Seen { in_window: count("in_window")?, in_thread: count("in_thread")? };
    Ok((settings, seen, row.col("stopped")?))
}

/// Whether the guard holds what `from` sends `to`: it tripped on them and no person has cleared
/// them since. Read where a fresh send's recipients are resolved (kept until scope changes, which a
/// trip or a clearing announces); a reply reads it with its thread (`observe`).
pub(crate) async fn tripped(c: &impl GenericClient, from: EndpointId, to: EndpointId) -> Result<bool> {
    let (a, b) = ordered(from, to);
    let stmt = c
        .prepare_cached(
            "select 1 from loop_pairs where a = $1 and b = $2
               and tripped_at > coalesce(cleared_at, '-infinity')",
        )
        .await?;
    Ok(c.query_opt(&stmt, &[&a, &b]).await?.is_some())
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

/// A person let the pair go on in `thread`: the pair is no longer held, and neither the thread's
/// turns before now nor the pair's streak the writers keep count any more.
pub(crate) async fn clear(c: &impl GenericClient, from: EndpointId, to: EndpointId, thread: &str) -> Result<()> {
    let (a, b) = ordered(from, to);
    c.execute("update endpoints set loop_turns = 0 where id in ($1, $2)", &[&a, &b]).await?;
    c.execute(
        "insert into loop_pairs (a, b, cleared_at) values ($1, $2, now())
         on conflict (a, b) do update set cleared_at = now()",
        &[&a, &b],
    )
    .await?;
    c.execute(
        "insert into loop_threads (thread, cleared_at) values ($1, now())
         on conflict (thread) do update set cleared_at = now()",
        &[&thread],
    )
    .await?;
    Ok(())
}

/// The bounds of `account`.
pub(crate) async fn settings(c: &impl GenericClient, account: AccountId) -> Result<Settings> {
    let stmt =
        c.prepare_cached("select loop_max_messages, loop_window_s, loop_max_depth from accounts where id = $1").await?;
    settings_of(&c.query_one(&stmt, &[&account]).await?)
}

/// An account's bounds from the row that reads its `loop_*` columns.
fn settings_of(row: &tokio_postgres::Row) -> Result<Settings> {
    let bound = |name: &str| -> Result<u32> { Ok(u32::try_from(row.col::<i32>(name)?).unwrap_or(0)) };
    Ok(Settings {
        max_messages: bound("loop_max_messages")?,
        window_s: bound("loop_window_s")?,
        max_depth: bound("loop_max_depth")?,
    })
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
    async fn a_threads_turns_are_counted_since_a_person_and_a_trip_holds_the_pair_until_cleared() {
        let db = testing::db().await;
        let (acme, laptop) = db.machine("acme", "laptop").await;
        let ann = db.endpoint(laptop, "ann", 0).await;
        let bob = db.endpoint(laptop, "bob", 0).await;
        let to = |id, handle: &str| Target { id, address: format!("acme/laptop/{handle}"), account_id: acme };
        let first = db.send(ann, &[to(bob, "bob")], "ping", None, None).await;
        let second = db.send(bob, &[to(ann, "ann")], "pong", None, Some(&first)).await;
        let third = db.send(ann, &[to(bob, "bob")], "ping again", None, Some(&second)).await;
        db.send(ann, &[to(bob, "bob")], "and again", None, Some(&third)).await;
        db.send(ann, &[to(bob, "bob")], "a new thread", None, None).await;
        let c = db.store.client().await.unwrap();
        let thread = first.to_string();
        let (settings, seen, stopped) = observe(&c, acme, ann, bob, &thread).await.unwrap();
        assert_eq!(settings, Settings::default());
        assert!(!stopped);
        assert_eq!(seen, Seen { in_window: 3, in_thread: 3 }, "ann, bob, ann: her second message is no new turn");
        assert_eq!(observe(&c, acme, ann, bob, "no-such-thread").await.unwrap().1, Seen { in_window: 0, in_thread: 0 });

        // A person speaking in the thread starts its count afresh.
        let me = crate::store::trust::human_caller(&c, acme).await.unwrap();
        let said = db.send(me.endpoint_id, &[to(ann, "ann")], "slow down", None, Some(&third)).await;
        db.send(ann, &[to(bob, "bob")], "ok", None, Some(&said)).await;
        assert_eq!(observe(&c, acme, ann, bob, &thread).await.unwrap().1, Seen { in_window: 1, in_thread: 1 });

        // A trip holds the pair, told once, until a person clears it.
        assert!(!tripped(&c, ann, bob).await.unwrap());
        let mut client = db.store.client().await.unwrap();
        let tx = crate::store::begin(&mut client).await.unwrap();
        assert!(trip(&tx, ann, bob).await.unwrap(), "the first trip is told");
        assert!(!trip(&tx, bob, ann).await.unwrap(), "not the next ones");
        tx.commit().await.unwrap();
        assert!(tripped(&c, bob, ann).await.unwrap(), "either way");
        assert!(observe(&c, acme, bob, ann, &thread).await.unwrap().2, "read with the thread too");
        clear(&c, bob, ann, &thread).await.unwrap();
        assert!(!tripped(&c, ann, bob).await.unwrap());
        assert_eq!(observe(&c, acme, ann, bob, &thread).await.unwrap().1, Seen { in_window: 0, in_thread: 0 });
        let tx = crate::store::begin(&mut client).await.unwrap();
        assert!(trip(&tx, ann, bob).await.unwrap(), "a trip after a clearing is told again");
        tx.commit().await.unwrap();

        let bounds = Settings::new(5, 30, 10).unwrap();
        assert!(set_settings(&c, "acme", bounds).await.unwrap());
        assert_eq!(observe(&c, acme, ann, bob, &thread).await.unwrap().0, bounds);
        assert!(!set_settings(&c, "nobody", bounds).await.unwrap());
    }
}
