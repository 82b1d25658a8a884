//! The one follower of a `DrivenBackend` session: it follows
//! every seat the session holds, reads the elections the store wakes it for (together),
//! and tells the core when a holder is asked to step down, when a seat is gone and when
//! the store ended the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::primitive::{Primitives, Wake, Woken};
use super::{lock, SessionEvents};
use crate::engine::{Snapshot, WaitFor};
use crate::name::{ElectionName, FencingToken};

/// A seat the session holds.
#[derive(Debug)]
pub(super) struct Held {
    token: u64,
    /// The core was told that the holder is asked to step down.
    told: bool,
    /// The election as last read, so that a release is decided without a read.
    pub(super) snap: Snapshot,
    /// The seat's waiting task, where the store does not push.
    waiting: Option<CancellationToken>,
}

impl Held {
    pub(super) fn stop(&mut self) {
        if let Some(w) = self.waiting.take() {
            w.cancel();
        }
    }
}

/// What the session's follower shares with the session.
#[derive(Clone, Debug)]
pub(super) struct Follower {
    pub(super) id: String,
    /// The store, and the backend's count of election requests.
    pub(super) store: Arc<dyn Primitives>,
    pub(super) requests: Arc<AtomicU64>,
    pub(super) events: SessionEvents,
    pub(super) held: Arc<Mutex<HashMap<ElectionName, Held>>>,
    pub(super) wake: Wake,
    pub(super) ended: Arc<AtomicBool>,
    pub(super) closed: CancellationToken,
}

impl Follower {
    /// Whether the seat `held` still stands in its snapshot: tells the core when the
    /// holder is asked to step down (once), when the seat is gone, and when the store
    /// ended the session (once per session).
    fn judge(&self, election: &ElectionName, held: &mut Held) -> bool {
        let token = held.token;
        let Some(mine) = held
            .snap
            .record(&self.id)
            .filter(|r| r.token == Some(token))
        else {
            let reason = "the seat record is gone";
            self.events
                .election_lost(election, FencingToken(token), reason);
            return false;
        };
        if !mine.live {
            // The store ended the session and kept its record: the session is gone,
            // not just this seat.
            if !self.ended.swap(true, Ordering::SeqCst) {
                self.events.expired("the store ended the session");
            }
            return false;
        }
        if mine.told && !held.told {
            held.told = true;
            self.events.preempted(election, FencingToken(token));
        }
        true
    }

    /// Wait for the next change of `held`'s record in `election`: the store pushes it,
    /// or a task waits for it.
    fn arm(&self, election: &ElectionName, held: &mut Held) {
        let what = WaitFor {
            me: Some(self.id.clone()),
            on: None,
            seen: held.snap.revision,
        };
        held.stop();
        if self.store.notify(election, &what, &self.wake) {
            return;
        }
        let stop = self.closed.child_token();
        held.waiting = Some(stop.clone());
        let (store, requests) = (self.store.clone(), self.requests.clone());
        let (wake, election) = (self.wake.clone(), election.clone());
        tokio::spawn(async move {
            requests.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                r = store.changed(&election, &what) => if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                },
            }
            if !stop.is_cancelled() {
                wake.wake(&election);
            }
        });
    }

    /// Follow a new seat from the election as its grant was learnt.
    pub(super) fn start(&self, election: &ElectionName, token: u64, snap: Snapshot) {
        let held = Held {
            token,
            told: false,
            snap,
            waiting: None,
        };
        // In the map before it is armed: a wake pushed at once finds the seat.
        let mut all = lock(&self.held);
        if let Some(mut old) = all.insert(election.clone(), held) {
            old.stop();
        }
        let Some(h) = all.get_mut(election) else {
            return;
        };
        if self.judge(election, h) {
            self.arm(election, h);
        } else {
            all.remove(election);
        }
    }

    /// The session's one follower: reads the elections it is woken for, together, and
    /// judges each held seat again.
    pub(super) async fn run(self, mut woken: Woken, gate: watch::Receiver<bool>) {
        loop {
            let first = tokio::select! {
                () = self.closed.cancelled() => return,
                w = woken.recv() => match w {
                    Some(w) => w,
                    None => return,
                },
            };
            // Every wake-up queued now: the pushes that carried their election, and
            // the elections to read (together).
            let mut carried: HashMap<ElectionName, Snapshot> = HashMap::new();
            let mut due = Vec::new();
            let mut next = Some(first);
            while let Some((election, now)) = next {
                match now {
                    Some(now) => match carried.get(&election) {
                        Some(had) if had.revision >= now.revision => {}
                        _ => {
                            carried.insert(election, now);
                        }
                    },
                    None => due.push(election),
                }
                next = woken.try_recv().ok();
            }
            due.sort_unstable();
            due.dedup();
            {
                let held = lock(&self.held);
                due.retain(|e| held.contains_key(e));
                carried.retain(|e, _| held.contains_key(e));
            }
            let mut gate = gate.clone();
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            let mut fresh: Vec<(ElectionName, Snapshot)> = carried.into_iter().collect();
            if !due.is_empty() {
                self.requests.fetch_add(1, Ordering::Relaxed);
                match self.store.read_many(&due).await {
                    Ok(snaps) if snaps.len() == due.len() => {
                        fresh.extend(due.into_iter().zip(snaps))
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        for e in &due {
                            self.wake.wake(e);
                        }
                    }
                }
            }
            let mut held = lock(&self.held);
            for (election, snap) in fresh {
                let Some(h) = held.get_mut(&election) else {
                    continue;
                };
                if snap.revision < h.snap.revision {
                    // Older than what the seat was judged on: wait on from there.
                    self.arm(&election, h);
                    continue;
                }
                h.snap = snap;
                if self.judge(&election, h) {
                    self.arm(&election, h);
                } else if let Some(mut gone) = held.remove(&election) {
                    gone.stop();
                }
            }
        }
    }
}
