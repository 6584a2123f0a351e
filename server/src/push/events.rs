//! The buffer between a stream's task and its call: the events it carries, or the error that ends it.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

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
pub(super) fn channel<E>(capacity: usize) -> (mpsc::Sender<Slot<E>>, Events<E>) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, Events(ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_call_reads_the_events_in_order_then_the_error_that_ended_them() {
        let (tx, mut events) = channel::<u32>(2);
        tokio::spawn(async move {
            for slot in [Slot::Event(1), Slot::Event(2), Slot::Failed(Box::new(Error::Unavailable("gone".into())))] {
                tx.send(slot).await.unwrap();
            }
        });
        assert_eq!(events.next().await.unwrap().unwrap(), 1);
        assert_eq!(events.next().await.unwrap().unwrap(), 2);
        assert!(matches!(events.next().await, Some(Err(Error::Unavailable(m))) if m == "gone"));
        assert!(events.next().await.is_none(), "the stream ends with its task");
    }
}
