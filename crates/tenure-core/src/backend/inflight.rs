//! A session's writes in flight, by election, so that a withdrawal comes after them.
//!
//! A campaign whose future is dropped (the caller gave up on it) may have a write on
//! its way to the store. Dropping the future does not stop the store from applying the
//! write: a withdrawal that read the election before the write landed found nothing to
//! withdraw, and the write then left a record (a waiter, or a grant nobody knew it
//! held) under a session that lives on, which kept every later candidate waiting
//! behind it. So every write of a session runs to its answer in a task of its own,
//! counted here by election, and a withdrawal waits until the elections it withdraws
//! from have none in flight.
//!
//! A write the store answers only after the client gave up on it (a timeout) can still
//! land after the withdrawal; the store's own request deadline bounds that window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::lock;
use crate::name::ElectionName;

/// The writes in flight of one session, by election.
#[derive(Debug, Default, Clone)]
pub(super) struct Inflight {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    counts: Mutex<HashMap<ElectionName, usize>>,
    done: Notify,
}

/// Counts a write to its elections until dropped.
#[derive(Debug)]
pub(super) struct Entered {
    inner: Arc<Shared>,
    elections: Vec<ElectionName>,
}

impl Inflight {
    /// A write to `elections` is about to be sent.
    pub(super) fn enter(&self, elections: impl IntoIterator<Item = ElectionName>) -> Entered {
        let elections: Vec<ElectionName> = elections.into_iter().collect();
        let mut counts = lock(&self.inner.counts);
        for e in &elections {
            *counts.entry(e.clone()).or_default() += 1;
        }
        Entered {
            inner: self.inner.clone(),
            elections,
        }
    }

    /// Once no write to any of `elections` is in flight.
    pub(super) async fn settled(&self, elections: &[ElectionName]) {
        loop {
            let done = self.inner.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let busy = {
                let counts = lock(&self.inner.counts);
                elections.iter().any(|e| counts.contains_key(e))
            };
            if !busy {
                return;
            }
            done.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        {
            let mut counts = lock(&self.inner.counts);
            for e in &self.elections {
                if let Some(n) = counts.get_mut(e) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(e);
                    }
                }
            }
        }
        self.inner.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn name(n: &str) -> ElectionName {
        ElectionName::new(n).expect("name")
    }

    #[tokio::test]
    async fn a_withdrawal_waits_for_the_writes_to_its_elections() {
        let inflight = Inflight::default();
        let a = inflight.enter([name("a"), name("b")]);
        let other = inflight.enter([name("c")]);
        // Nothing in flight for "d"; "c" is someone else's.
        inflight.settled(&[name("d")]).await;
        let waiting = {
            let inflight = inflight.clone();
            tokio::spawn(async move { inflight.settled(&[name("b"), name("d")]).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "settled while a write to b was in flight"
        );
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("settled once the write ended")
            .expect("task");
        drop(other);
        assert!(lock(&inflight.inner.counts).is_empty());
    }
}
