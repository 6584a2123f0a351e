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
                 select m.created_at, m.thread
                 from endpoints e
                 join deliveries d on d.recipient_id = e.id and d.seq > e.head_seq - $5
                 join messages m on m.id = d.message_id
                 where e.id in ($1, $2) and m.sender_id in ($1, $2) and m.sender_id <> e.id
                   and m.created_at > (select at from cleared)
             )
             select x.loop_max_messages, x.loop_window_s, x.loop_max_depth,
                    (select count(*) from recent
                      where created_at > now() - make_interval(secs => x.loop_window_s)) as in_window,
                    (select count(*) from recent where thread = $4) as in_thread
             from accounts x where x.id = $3",
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
    Ok((settings, Seen { in_window: count("in_window")?, in_thread: count("in_thread")? }))
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
