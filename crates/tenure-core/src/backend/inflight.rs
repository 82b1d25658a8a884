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

/// Writes in flight, by election (one session's in the driver; a store may keep its
/// own, as ZooKeeper does to learn a write's answer before it pushes a wake-up).
#[derive(Debug, Default, Clone)]
pub struct Inflight {
    inner: Arc<Mutex<HashMap<ElectionName, Busy>>>,
}

/// An election with writes in flight: how many, and what its waiters wait on (woken
/// when the count reaches zero, so a write's end wakes only the withdrawals from its
/// own elections).
#[derive(Debug)]
struct Busy {
    writes: usize,
    idle: Arc<Notify>,
}

/// Counts a write to its elections until dropped.
#[derive(Debug)]
pub struct Entered {
    inner: Arc<Mutex<HashMap<ElectionName, Busy>>>,
    elections: Vec<ElectionName>,
}

impl Inflight {
    /// A write to `elections` is about to be sent.
    pub fn enter(&self, elections: impl IntoIterator<Item = ElectionName>) -> Entered {
        let elections: Vec<ElectionName> = elections.into_iter().collect();
        let mut busy = lock(&self.inner);
        for e in &elections {
            busy.entry(e.clone())
                .or_insert_with(|| Busy {
                    writes: 0,
                    idle: Arc::default(),
                })
                .writes += 1;
        }
        Entered {
            inner: self.inner.clone(),
            elections,
        }
    }

    /// Once every write to `elections` in flight when called has ended.
    pub async fn settled(&self, elections: &[ElectionName]) {
        for e in elections {
            let idle = {
                let busy = lock(&self.inner);
                let Some(b) = busy.get(e) else { continue };
                b.idle.clone()
            };
            let done = idle.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            // Still the same spell of writes (the count may have reached zero between
            // the two locks): it ends with a notification after this registration.
            let same = lock(&self.inner)
                .get(e)
                .is_some_and(|b| Arc::ptr_eq(&b.idle, &idle));
            if same {
                done.await;
            }
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut ended = Vec::new();
        {
            let mut busy = lock(&self.inner);
            for e in &self.elections {
                if let Some(b) = busy.get_mut(e) {
                    b.writes -= 1;
                    if b.writes == 0 {
                        ended.extend(busy.remove(e).map(|b| b.idle));
                    }
                }
            }
        }
        for idle in ended {
            idle.notify_waiters();
        }
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
        assert!(lock(&inflight.inner).is_empty());
    }
}
