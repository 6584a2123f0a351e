//! The one mechanism behind every server stream (an endpoint's push stream, a waiting
//! announcement): a task that feeds a buffer, beating every [`HEARTBEAT_EVERY`] while it waits, and
//! the call that reads the buffer — the events the task sends, then the error that ended it, if any.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use relay_proto::timing::HEARTBEAT_EVERY;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, interval_at};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use crate::domain::{Error, Result};

/// What a stream's buffer holds. The buffer allocates a block of 32 slots when it opens and keeps it
/// while the stream lives, idle or not, so a slot is kept to 16 bytes: events are a box or a couple
/// of words, and the error that ends the stream is boxed (a `Result` slot took 48 bytes, 1 KiB more
/// for every open stream).
pub(super) enum Slot<E> {
    Event(E),
    Failed(Box<Error>),
}

/// The events of one stream, as its call reads them; an error ends it.
pub struct Events<E>(ReceiverStream<Slot<E>>);

impl<E> Stream for Events<E> {
    type Item = Result<E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0).poll_next(cx).map(|slot| {
            slot.map(|slot| match slot {
                Slot::Event(event) => Ok(event),
                Slot::Failed(error) => Err(*error),
            })
        })
    }
}

/// A buffer of `capacity` events: the feeding task's end, and the call's.
pub(super) fn channel<E>(capacity: usize) -> (Sender<E>, Events<E>) {
    let (tx, rx) = mpsc::channel(capacity);
    (Sender(tx), Events(ReceiverStream::new(rx)))
}

/// Opens a stream of `capacity` events fed by `feed`, run as a task in the call's span (so what it
/// logs names its caller). The stream ends when `feed` does; an error it returns is the stream's
/// last item.
pub(super) fn open<E, F>(
    capacity: usize,
    what: &'static str,
    feed: impl FnOnce(Sender<E>) -> F + Send + 'static,
) -> Events<E>
where
    E: Send + 'static,
    F: Future<Output = crate::domain::Result<()>> + Send + 'static,
{
    let (tx, events) = channel(capacity);
    // The feed's future is made inside the task, not moved into it: a future moved into an async
    // block and awaited there takes its room twice, and thousands of streams sit idle at once.
    let task = async move {
        if let Err(err) = feed(tx.clone()).await {
            tracing::debug!(error = %err, "{what} ended");
            tx.fail(err).await;
        }
    };
    tokio::spawn(task.instrument(tracing::Span::current()));
    events
}

/// The beats of a stream that waits, the first one period from now.
pub(super) fn heartbeats() -> Interval {
    interval_at(Instant::now() + HEARTBEAT_EVERY, HEARTBEAT_EVERY)
}

/// A client that stops reading for this long is treated as gone rather than holding the task forever.
const STALLED: Duration = Duration::from_secs(60);

/// The feeding task's end of the buffer. Every wait on the client has a deadline: a client that is
/// connected but does not read holds a task for [`STALLED`] at most.
pub(super) struct Sender<E>(mpsc::Sender<Slot<E>>);

impl<E> Clone for Sender<E> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<E> Sender<E> {
    /// Hands the call `event`; `false` when the client is gone or stopped reading.
    pub(super) async fn send(&self, event: E) -> bool {
        matches!(tokio::time::timeout(STALLED, self.0.send(Slot::Event(event))).await, Ok(Ok(())))
    }

    /// Ends the stream with `error`, if the client is there to read it.
    pub(super) async fn fail(&self, error: Error) {
        let _ = tokio::time::timeout(STALLED, self.0.send(Slot::Failed(Box::new(error)))).await;
    }

    /// Resolves when the call is gone.
    pub(super) async fn closed(&self) {
        self.0.closed().await;
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_call_reads_the_events_in_order_then_the_error_that_ended_them() {
        let (tx, mut events) = channel::<u32>(2);
        tokio::spawn(async move {
            assert!(tx.send(1).await && tx.send(2).await, "the call is there to read");
            tx.fail(Error::Unavailable("gone".into())).await;
        });
        assert_eq!(events.next().await.unwrap().unwrap(), 1);
        assert_eq!(events.next().await.unwrap().unwrap(), 2);
        assert!(matches!(events.next().await, Some(Err(Error::Unavailable(m))) if m == "gone"));
        assert!(events.next().await.is_none(), "the stream ends with its task");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_holds_the_task_no_longer_than_the_deadline() {
        let (tx, _events) = channel::<u32>(1);
        assert!(tx.send(1).await, "room for one");
        let started = tokio::time::Instant::now();
        assert!(!tx.send(2).await, "a full buffer nobody reads is a client gone");
        tx.fail(Error::Unavailable("gone".into())).await;
        assert_eq!(started.elapsed(), 2 * STALLED, "each wait ends at its deadline");
    }
}
