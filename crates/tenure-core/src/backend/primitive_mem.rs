//! The in-memory store of [`Primitives`], so that the engine runs on it in unit tests.
//! Records of an ended session stay, dead, until a write deletes them (as in stores
//! that keep rows until cleared away), so the engine's clearing is exercised too.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::lock;
use super::primitive::Primitives;
use crate::engine::{Inherited, Op, Record, Snapshot, WaitFor, Write};
use crate::error::{Error, ErrorKind, Result};
use crate::name::ElectionName;

/// An in-memory store of the engine's primitives.
#[derive(Debug)]
pub struct MemPrimitives {
    state: Mutex<State>,
    /// Moves on with every change, for [`Primitives::changed`].
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, (Duration, Instant)>,
    elections: HashMap<ElectionName, Election>,
    next_session: u64,
    last_token: u64,
    revision: u64,
}

#[derive(Debug, Default)]
struct Election {
    revision: u64,
    records: BTreeMap<String, Record>,
    left: Option<Inherited>,
}

impl Default for MemPrimitives {
    fn default() -> Self {
        MemPrimitives {
            state: Mutex::new(State::default()),
            changes: watch::Sender::new(0),
        }
    }
}

impl State {
    fn live(&self, session: &str, now: Instant) -> bool {
        self.sessions
            .get(session)
            .is_some_and(|(_, until)| *until > now)
    }

    fn snapshot(&self, election: &ElectionName, now: Instant) -> Snapshot {
        let Some(e) = self.elections.get(election) else {
            return Snapshot::default();
        };
        Snapshot {
            revision: e.revision,
            records: e
                .records
                .values()
                .map(|r| Record {
                    live: self.live(r.session(), now),
                    ..r.clone()
                })
                .collect(),
            left: e.left.clone(),
        }
    }
}

impl MemPrimitives {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn changed_now(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

#[async_trait]
impl Primitives for MemPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let mut st = lock(&self.state);
        st.next_session += 1;
        let id = format!("p{}", st.next_session);
        st.sessions.insert(id.clone(), (ttl, Instant::now() + ttl));
        Ok(id)
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let now = Instant::now();
        let mut st = lock(&self.state);
        Ok(sessions
            .iter()
            .map(|s| match st.sessions.get_mut(s) {
                Some((ttl, until)) if *until > now => {
                    *until = now + *ttl;
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        lock(&self.state).sessions.remove(session);
        self.changed_now();
        Ok(())
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        Ok(lock(&self.state).snapshot(election, Instant::now()))
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let now = Instant::now();
        let mut st = lock(&self.state);
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
                    e.records.remove(s);
                }
                Op::Touch(s) => {
                    if let Some(r) = e.records.get_mut(s) {
                        r.version = rev;
                    }
                }
                Op::Put { .. } => {
                    let session = op.session();
                    let arrival = e.records.get(session).map_or(rev, |r| r.arrival);
                    let mint = || {
                        last_token += 1;
                        last_token
                    };
                    if let Some(rec) = op.record(arrival, rev, mint) {
                        e.records.insert(session.to_string(), rec);
                    }
                }
            }
        }
        st.last_token = last_token;
        let after = st.snapshot(election, now);
        drop(st);
        self.changed_now();
        Ok((true, after))
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let (me, on, seen) = (what.me.as_deref(), what.on.as_deref(), what.seen);
        let mut rx = self.changes.subscribe();
        loop {
            let expiry = {
                let now = Instant::now();
                let st = lock(&self.state);
                let e = st.elections.get(election);
                let record = |s: &str| e.and_then(|e| e.records.get(s));
                let moved = e.map_or(0, |e| e.revision) > seen;
                let mine_changed = me.is_some_and(|me| record(me).is_none_or(|r| r.version > seen));
                let on_gone = on.is_some_and(|on| record(on).is_none() || !st.live(on, now));
                if mine_changed || on_gone || (me.is_none() && on.is_none() && moved) {
                    return Ok(());
                }
                match on {
                    Some(on) => st.sessions.get(on).map(|(_, until)| Some(*until)),
                    None => Some(None),
                }
            };
            let Some(expiry) = expiry else {
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
}
