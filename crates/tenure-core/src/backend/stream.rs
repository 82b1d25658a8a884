//! The streams a backend hands to readers of a leader or a member list, and the one
//! rule they all keep (the contract's stream rule): the current state first, then each
//! state that differs from the last one yielded; a failed read yields one `Err` per
//! outage (the first failure after a good read), and the state again once a read
//! succeeds, changed or not, so a reader learns that the outage is over.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::watch;

use crate::error::Result;

/// A stream of states or errors, as [`LeaderStream`](super::LeaderStream) and
/// [`MemberStream`](super::MemberStream) are.
type States<T> = Pin<Box<dyn Stream<Item = Result<T>> + Send + 'static>>;

/// The stream rule as a state machine: given each read, what (if anything) to yield.
#[derive(Debug)]
struct Changes<T> {
    last: T,
    failed: bool,
}

impl<T: PartialEq + Clone> Changes<T> {
    fn next(&mut self, read: Result<T>) -> Option<Result<T>> {
        match read {
            Ok(now) if now != self.last || self.failed => {
                self.failed = false;
                self.last = now.clone();
                Some(Ok(now))
            }
            Ok(_) => None,
            Err(e) if !self.failed => {
                self.failed = true;
                Some(Err(e))
            }
            Err(_) => None,
        }
    }
}

/// The writing side of a state a backend follows for its readers (one election's
/// leader, one namespace's members) from a task of its own: each read goes through
/// [`publish`](Self::publish), which keeps the stream rule, and every reader's stream
/// (from [`Published::new`]) sees the latest published value. The task should end when
/// [`closed`](Self::closed) resolves: every reader is gone.
#[derive(Debug)]
pub struct Published<T> {
    tx: watch::Sender<Result<T>>,
    changes: Changes<T>,
}

impl<T: PartialEq + Clone + Send + Sync + 'static> Published<T> {
    /// A publisher whose readers start from `first`, and the readers' stream.
    pub fn new(first: T) -> (Self, States<T>) {
        let (tx, rx) = watch::channel(Ok(first.clone()));
        let published = Published {
            tx,
            changes: Changes {
                last: first,
                failed: false,
            },
        };
        (published, watch_stream(rx, |v| v))
    }

    /// Pass on one read of the state: published if it changed, or if it is the first
    /// good read after a failure; an error is published only as the first of an outage.
    pub fn publish(&mut self, read: Result<T>) {
        if let Some(item) = self.changes.next(read) {
            let _ = self.tx.send_replace(item);
        }
    }

    /// The last state published (or the first one).
    pub fn last(&self) -> &T {
        &self.changes.last
    }

    /// Whether every reader is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when every reader is gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A stream over a watch channel that a backend keeps up to date: the current value
/// first, then each change (a slow reader sees the latest value, never a stale one).
/// `map` turns the channel's value into a stream item. The stream ends when the sender
/// is dropped. Serves as a [`LeaderStream`](super::LeaderStream) or a
/// [`MemberStream`](super::MemberStream).
pub fn watch_stream<T, U, F>(rx: watch::Receiver<T>, map: F) -> States<U>
where
    T: Clone + Send + Sync + 'static,
    U: Send + 'static,
    F: Fn(T) -> Result<U> + Send + Sync + 'static,
{
    let map = Arc::new(map);
    Box::pin(futures::stream::unfold(
        (rx, true),
        move |(mut rx, first)| {
            let map = map.clone();
            async move {
                if !first && rx.changed().await.is_err() {
                    return None;
                }
                let value = rx.borrow_and_update().clone();
                Some((map(value), (rx, false)))
            }
        },
    ))
}

/// A stream for a store that cannot notify: `first` at once, then `read` every
/// `interval`, yielding what the stream rule lets through. Reads happen only while the
/// stream is polled; dropping it stops them.
pub fn poll_stream<T, F, Fut>(first: T, interval: Duration, read: F) -> States<T>
where
    T: PartialEq + Clone + Send + Sync + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let read = Arc::new(read);
    let changes = Changes {
        last: first,
        failed: false,
    };
    Box::pin(futures::stream::unfold(
        (changes, true),
        move |(mut changes, first)| {
            let read = read.clone();
            async move {
                if first {
                    let item = Ok(changes.last.clone());
                    return Some((item, (changes, false)));
                }
                loop {
                    tokio::time::sleep(interval).await;
                    if let Some(item) = changes.next(read().await) {
                        return Some((item, (changes, false)));
                    }
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn poll_streams_yield_changes_and_one_error_per_outage() {
        // The store answers 1, 1, error, error, 2, 2, 3 on successive reads.
        let answers: Vec<Result<u32>> = vec![
            Ok(1),
            Ok(1),
            Err(Error::new(ErrorKind::Unavailable, "down")),
            Err(Error::new(ErrorKind::Unavailable, "still down")),
            Ok(2),
            Ok(2),
            Ok(3),
        ];
        let answers = Arc::new(std::sync::Mutex::new(answers.into_iter()));
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        let mut stream = poll_stream(1u32, Duration::from_secs(1), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let next = answers.lock().unwrap().next();
            async move { next.unwrap_or(Ok(3)) }
        });
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            0,
            "the first item needs no read"
        );
        let e = stream.next().await.unwrap().unwrap_err();
        assert_eq!(e.message(), "down");
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        assert_eq!(stream.next().await.unwrap().unwrap(), 3);
        assert_eq!(reads.load(Ordering::SeqCst), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovered_poll_stream_repeats_an_unchanged_state() {
        // After an error the consumer must learn the state is good again, even when it
        // did not change.
        let answers = Arc::new(std::sync::Mutex::new(
            vec![Err(Error::new(ErrorKind::Timeout, "slow")), Ok(5u32)].into_iter(),
        ));
        let mut stream = poll_stream(5u32, Duration::from_millis(10), move || {
            let next = answers.lock().unwrap().next();
            async move { next.unwrap_or(Ok(5)) }
        });
        assert_eq!(stream.next().await.unwrap().unwrap(), 5);
        assert!(stream.next().await.unwrap().is_err());
        assert_eq!(stream.next().await.unwrap().unwrap(), 5);
    }

    #[tokio::test]
    async fn watch_streams_start_with_the_current_value_and_end_with_the_sender() {
        let (tx, rx) = watch::channel(1u32);
        let mut stream = watch_stream(rx, |v| Ok(v * 10));
        assert_eq!(stream.next().await.unwrap().unwrap(), 10);
        tx.send_replace(2);
        tx.send_replace(3);
        assert_eq!(
            stream.next().await.unwrap().unwrap(),
            30,
            "coalesced to the latest"
        );
        drop(tx);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_publisher_keeps_the_stream_rule() {
        let (mut published, mut stream) = Published::new(1u32);
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        published.publish(Ok(1));
        published.publish(Err(Error::new(ErrorKind::Unavailable, "down")));
        let e = stream.next().await.unwrap().unwrap_err();
        assert_eq!(e.message(), "down");
        published.publish(Err(Error::new(ErrorKind::Unavailable, "still down")));
        published.publish(Ok(1));
        assert_eq!(
            stream.next().await.unwrap().unwrap(),
            1,
            "the unchanged state again after the outage"
        );
        published.publish(Ok(2));
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        assert_eq!(*published.last(), 2);
        assert!(!published.is_closed());
        drop(stream);
        assert!(published.is_closed());
    }
}
