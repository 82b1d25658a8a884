//! The in-memory store of [`Primitives`]: what `mem://` runs on, and what the engine
//! runs on in unit tests. Records of an ended session stay, dead, until a write deletes
//! them (as in stores that keep rows until cleared away), so the engine's clearing is
//! exercised too. Time is tokio's, so tests can pause it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::lock;
use super::mem_members::Namespaces;
use super::primitive::{MemberStore, Primitives, Wake};
use crate::engine::{Inherited, Op, Record, Snapshot, WaitFor, Write};
use crate::error::{Error, ErrorKind, Result};
use crate::name::ElectionName;

/// An in-memory store of the engine's primitives. Clones share the store.
#[derive(Clone, Debug, Default)]
pub struct MemPrimitives {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    members: Namespaces,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Lease>,
    elections: HashMap<ElectionName, Election>,
    /// Moves on with every change of an election, by election; made by the first wait.
    changes: HashMap<ElectionName, watch::Sender<u64>>,
    /// The followers to push to ([`Primitives::notify`]), by election.
    pushes: HashMap<ElectionName, Vec<Wake>>,
    next_session: u64,
    last_token: u64,
    revision: u64,
}

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    until: Instant,
    /// The elections holding records of this session, to wake when it ends.
    elections: HashSet<ElectionName>,
}

#[derive(Debug, Default)]
struct Election {
    revision: u64,
    /// Few per election, so a vector (a map's smallest node is many records wide).
    records: Vec<Record>,
    left: Option<Inherited>,
}

impl Election {
    fn record(&self, session: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.session() == session)
    }

    fn remove(&mut self, session: &str) -> Option<Record> {
        let i = self.records.iter().position(|r| r.session() == session)?;
        Some(self.records.remove(i))
    }
}

impl State {
    fn live(&self, session: &str, now: Instant) -> bool {
        self.sessions
            .get(session)
            .is_some_and(|lease| lease.until > now)
    }

    fn snapshot(&self, election: &ElectionName, now: Instant) -> Snapshot {
        let Some(e) = self.elections.get(election) else {
            return Snapshot::default();
        };
        Snapshot {
            revision: e.revision,
            records: e
                .records
                .iter()
                .map(|r| Record {
                    live: self.live(r.session(), now),
                    ..r.clone()
                })
                .collect(),
            left: e.left.clone(),
        }
    }

    /// Whether what `what` names happened in `election`: `Some(expiry)` if not yet,
    /// with the instant the session waited `on` runs out, if any.
    fn pending(
        &self,
        election: &ElectionName,
        what: &WaitFor,
        now: Instant,
    ) -> Option<Option<Instant>> {
        let (me, on, seen) = (what.me.as_deref(), what.on.as_deref(), what.seen);
        let e = self.elections.get(election);
        let record = |s: &str| e.and_then(|e| e.record(s));
        let moved = e.map_or(0, |e| e.revision) > seen;
        let mine_changed =
            me.is_some_and(|me| record(me).is_none_or(|r| r.version > seen) || !self.live(me, now));
        let on_gone = on.is_some_and(|on| record(on).is_none() || !self.live(on, now));
        if mine_changed || on_gone || (me.is_none() && on.is_none() && moved) {
            return None;
        }
        match on {
            Some(on) => self.sessions.get(on).map(|lease| Some(lease.until)),
            None => Some(None),
        }
    }

    fn wake(&mut self, election: &ElectionName) {
        if let Some(tx) = self.changes.get(election) {
            tx.send_modify(|n| *n += 1);
            if tx.receiver_count() == 0 {
                self.changes.remove(election);
            }
        }
        // Every change is pushed, with the election as it stands (a push the follower
        // did not ask for is allowed, and keeps a holder's view fresh for its release).
        if let Some(pushes) = self.pushes.remove(election) {
            let now = self.snapshot(election, Instant::now());
            for to in pushes {
                to.wake_with(election, now.clone());
            }
        }
    }

    /// Remove `session`: its records read as dead from now on (or, with `delete`, are
    /// deleted, as a store that deletes a revoked lease's keys does), and waits on them
    /// wake.
    fn end(&mut self, session: &str, delete: bool) -> bool {
        let Some(lease) = self.sessions.remove(session) else {
            return false;
        };
        for e in &lease.elections {
            if delete {
                self.revision += 1;
                let rev = self.revision;
                if let Some(el) = self.elections.get_mut(e) {
                    if el.remove(session).is_some() {
                        el.revision = rev;
                    }
                }
            }
            self.wake(e);
        }
        true
    }
}

impl MemPrimitives {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    /// End `session` now, as its lease running out would: its records are dead to
    /// every reader (until a write clears them) and its members gone. False if the
    /// store has no such session.
    pub fn end_session(&self, session: &str) -> bool {
        self.finish(session, false)
    }

    /// End `session` now and delete its records, as a store revoking a lease with
    /// its keys does ([`Primitives::revoke`]). False if the store has no such session.
    pub fn revoke_session(&self, session: &str) -> bool {
        self.finish(session, true)
    }

    fn finish(&self, session: &str, delete: bool) -> bool {
        let ended = self.state().end(session, delete);
        if ended {
            self.shared.members.drop_session(session);
        }
        ended
    }

    /// The ids of the sessions the store keeps (not expired), in the order opened.
    pub fn session_ids(&self) -> Vec<String> {
        let now = Instant::now();
        let st = self.state();
        let mut ids: Vec<(u64, &String)> = st
            .sessions
            .iter()
            .filter(|(_, lease)| lease.until > now)
            .map(|(id, _)| (id.trim_start_matches("mem-").parse().unwrap_or(0), id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id.clone()).collect()
    }
}

/// The store's own expiry of session `id`: once its lease runs out unrenewed, it ends
/// (its members go, waits on it wake).
async fn expire_when_due(shared: Weak<Shared>, id: String) {
    loop {
        let until = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let st = lock(&shared.state);
            match st.sessions.get(&id) {
                Some(lease) => lease.until,
                None => return,
            }
        };
        tokio::time::sleep_until(until).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut st = lock(&shared.state);
        if st
            .sessions
            .get(&id)
            .is_some_and(|l| l.until <= Instant::now())
        {
            st.end(&id, false);
            drop(st);
            shared.members.drop_session(&id);
            return;
        }
    }
}

#[async_trait]
impl Primitives for MemPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let id = {
            let mut st = self.state();
            st.next_session += 1;
            let id = format!("mem-{}", st.next_session);
            let lease = Lease {
                ttl,
                until: Instant::now() + ttl,
                elections: HashSet::new(),
            };
            st.sessions.insert(id.clone(), lease);
            id
        };
        tokio::spawn(expire_when_due(Arc::downgrade(&self.shared), id.clone()));
        Ok(id)
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut st = self.state();
        Ok(sessions
            .iter()
            .map(|s| match st.sessions.get_mut(s) {
                Some(lease) if lease.until > now => {
                    lease.until = now + lease.ttl;
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        self.revoke_session(session);
        Ok(())
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        Ok(self.state().snapshot(election, Instant::now()))
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let now = Instant::now();
        let mut guard = self.state();
        let st = &mut *guard;
        let current = st.elections.get(election).map_or(0, |e| e.revision);
        let for_dead = write.ops.iter().any(|op| match op {
            Op::Put { candidacy, .. } => !st.live(&candidacy.session, now),
            Op::Touch(s) => !st.live(s, now),
            Op::Delete(_) => false,
        });
        if current != write.revision || for_dead {
            return Ok((false, st.snapshot(election, now)));
        }
        st.revision += 1;
        let rev = st.revision;
        let mut last_token = st.last_token;
        let e = st.elections.entry(election.clone()).or_default();
        e.revision = rev;
        if let Some(left) = &write.left {
            e.left.clone_from(left);
        }
        for op in &write.ops {
            match op {
                Op::Delete(s) => {
                    e.remove(s);
                }
                Op::Touch(s) => {
                    if let Some(r) = e.records.iter_mut().find(|r| r.session() == s) {
                        r.version = rev;
                    }
                }
                Op::Put { .. } => {
                    let session = op.session();
                    let arrival = e.record(session).map_or(rev, |r| r.arrival);
                    let mint = || {
                        last_token += 1;
                        last_token
                    };
                    if let Some(rec) = op.record(arrival, rev, mint) {
                        match e.records.iter_mut().find(|r| r.session() == session) {
                            Some(had) => *had = rec,
                            None => e.records.push(rec),
                        }
                    }
                    if let Some(lease) = st.sessions.get_mut(session) {
                        lease.elections.insert(election.clone());
                    }
                }
            }
        }
        st.last_token = last_token;
        st.wake(election);
        Ok((true, st.snapshot(election, now)))
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let mut rx = self
            .state()
            .changes
            .entry(election.clone())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        loop {
            let Some(expiry) = self.state().pending(election, what, Instant::now()) else {
                return Ok(());
            };
            let far = Instant::now() + Duration::from_secs(86_400);
            tokio::select! {
                r = rx.changed() => {
                    if r.is_err() {
                        return Err(Error::new(ErrorKind::Closed, "the store is gone"));
                    }
                }
                () = tokio::time::sleep_until(expiry.unwrap_or(far)) => {}
            }
        }
    }

    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        if what.on.is_some() {
            // The end of another session by its TTL has no push here; such a wait
            // waits in `changed`, with its timer.
            return false;
        }
        let mut st = self.state();
        let now = Instant::now();
        match st.pending(election, what, now) {
            None => {
                to.wake_with(election, st.snapshot(election, now));
            }
            Some(_) => {
                let pushes = st.pushes.entry(election.clone()).or_default();
                pushes.retain(|to| !to.is_closed());
                pushes.push(to.clone());
            }
        }
        true
    }

    fn batch(&self) -> Option<usize> {
        // A batch is one request under the store's lock.
        Some(usize::MAX)
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(self)
    }
}

#[async_trait]
impl MemberStore for MemPrimitives {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &crate::name::Member,
    ) -> Result<()> {
        // Under the store's lock, so that a session ending meanwhile leaves no member.
        let st = self.state();
        if !st.live(session, Instant::now()) {
            return Err(Error::new(
                ErrorKind::SessionExpired,
                "session is not known to the store",
            ));
        }
        self.shared.members.register(session, namespace, member);
        drop(st);
        Ok(())
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        self.shared.members.unregister(session, namespace, id);
        Ok(())
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<crate::name::Member>> {
        Ok(self.shared.members.list(namespace))
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<super::MemberStream> {
        Ok(self.shared.members.watch(namespace))
    }
}
