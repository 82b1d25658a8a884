//! The election engine's primitives over ZooKeeper (the default layout).
//!
//! - **Sessions.** A primitive session is one ZooKeeper session (its own connection,
//!   timeout = the TTL) holding one ephemeral node `/:sessions/<id>`: the session lives
//!   while that node exists. A renewal is a write through the session's own connection
//!   (a `multi` holding one check of that node), so it is answered only once the
//!   ensemble's leader committed it. Renewals that stop for half the TTL drop the
//!   connection (the core abandoned the session), and the server expires the session
//!   after its timeout, deleting the node. A revoke deletes the node and closes the
//!   session.
//! - **Elections.** An election is the data of its node `/<election>`: its records
//!   (session, arrival, version, token, the engine's opaque body) and the bytes it keeps
//!   for the next grant. Its revision is the node's data version (a node that does not
//!   exist or holds no data: 0). A record counts as live while its session's node
//!   exists; a dead session's records stay until an engine write deletes them.
//! - **Writes.** One `multi`: a check that the session node of every put or touched
//!   record exists, then `setData` of the election node at the version the write was
//!   decided on (after a `create` of the node if it did not exist). The `setData`'s stat
//!   is the election after: no read follows a write that commits.
//! - **Tokens.** A minted token is the zxid of the write that minted it (the node's
//!   `mzxid` while the record is marked as minted by the last write; the next write
//!   writes the number out), so tokens grow across the whole ensemble.
//! - **Changes.** An exists watch on the election node (any write changes its version)
//!   and, for a waiter, one on the session node of the record ahead, each set and then
//!   checked against what the caller saw, so nothing is missed; the client re-registers
//!   its watches when it reconnects.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tenure_core::backend::primitive::MemberStore;
use tenure_core::backend::{Primitives, Purpose};
use tenure_core::engine::{Op, Record, Snapshot, Token, WaitFor, Write};
use tenure_core::{ElectionName, Error, ErrorKind, Member, MemberStream, Result};
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiReadResult, MultiWriteError, MultiWriteResult,
    SessionInfo, Stat,
};

use crate::error::{map, TAG};
use crate::members::{self, Registrations};
use crate::nodes::{election_dir, sequence_of};
use crate::shared::{close_session, connect_client, is_node_exists, ClientSlot, Shared};

/// The directory of the session nodes.
pub(crate) const SESSIONS: &str = "/:sessions";

/// The node that says session `id` lives.
pub(crate) fn session_path(id: &str) -> String {
    format!("{SESSIONS}/{id}")
}

/// Writes per `multi` of a batch, and elections per multi-read.
pub(crate) const BATCH: usize = 64;

/// The most data one batched `multi` carries (ZooKeeper refuses requests over
/// `jute.maxbuffer`, 1 MiB by default).
const BATCH_BYTES: usize = 512 * 1024;

/// An election node's data.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Stored {
    /// Arrivals handed out so far.
    #[serde(rename = "n", default)]
    next: u64,
    /// The bytes kept for the next grant (`Write::left_body`, UTF-8 JSON).
    #[serde(rename = "l", default, skip_serializing_if = "String::is_empty")]
    left: String,
    #[serde(rename = "r", default)]
    records: Vec<Rec>,
}

/// One record of an election node.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Rec {
    #[serde(rename = "s")]
    session: String,
    #[serde(rename = "a")]
    arrival: u64,
    #[serde(rename = "v")]
    version: u64,
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    /// Minted by the write that last set the node: the token is its `mzxid`.
    #[serde(rename = "m", default, skip_serializing_if = "is_false")]
    minted: bool,
    /// The engine's opaque body (JSON text).
    #[serde(rename = "b")]
    body: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An election node as last read or written.
#[derive(Clone, Debug, Default)]
struct Known {
    /// The node's data version; `None`: no node.
    version: Option<i32>,
    /// Whether the node held data (an empty node is an election never written).
    written: bool,
    mzxid: i64,
    stored: Stored,
    /// Whether each record's session lives.
    live: HashMap<String, bool>,
    /// The node's children as last read.
    children: i32,
    /// Whether its children include Curator `LeaderLatch` nodes (`layout=curator`).
    curator: bool,
}

impl Known {
    fn from_node(data: &[u8], stat: &Stat) -> Known {
        let stored = serde_json::from_slice::<Stored>(data).unwrap_or_default();
        Known {
            version: Some(stat.version),
            written: !data.is_empty(),
            mzxid: stat.mzxid,
            stored,
            live: HashMap::new(),
            children: stat.num_children,
            curator: false,
        }
    }

    /// Whether the node has children besides its records' two each (sub-elections,
    /// another layout's nodes).
    fn foreign_children(&self) -> bool {
        let own = self.stored.records.len().saturating_mul(2);
        usize::try_from(self.children).is_ok_and(|n| n > own)
    }

    /// Whether `write` adds a record to an election Curator's recipe uses.
    fn refuses(&self, write: &Write) -> bool {
        self.curator
            && write.ops.iter().any(|op| {
                matches!(op, Op::Put { .. })
                    && !self
                        .stored
                        .records
                        .iter()
                        .any(|r| r.session == op.session())
            })
    }

    fn revision(&self) -> u64 {
        match self.version {
            Some(v) if self.written => u64::try_from(v).unwrap_or(0),
            _ => 0,
        }
    }

    fn token(&self, r: &Rec) -> Option<u64> {
        match r.minted {
            true => u64::try_from(self.mzxid).ok(),
            false => r.token,
        }
    }

    fn snapshot(&self) -> Snapshot {
        let records = self
            .stored
            .records
            .iter()
            .map(|r| {
                let live = self.live.get(&r.session).copied().unwrap_or(false);
                Record::from_store(
                    r.session.clone(),
                    r.arrival,
                    r.version,
                    self.token(r),
                    live,
                    r.body.as_bytes(),
                )
            })
            .collect();
        Snapshot::from_store(self.revision(), self.stored.left.as_bytes(), records)
    }

    fn sessions(&self) -> Vec<String> {
        self.stored
            .records
            .iter()
            .map(|r| r.session.clone())
            .collect()
    }
}

/// A session's renewals as its watchdog sees them.
#[derive(Debug)]
struct Beat {
    /// When the last renewal that was answered was sent (at first: the open).
    confirmed: Instant,
    /// Set once the watchdog ended the session: later renewals are refused.
    ended: bool,
}

/// A session opened through this backend.
struct Own {
    client: ClientSlot,
    info: SessionInfo,
    /// The ZooKeeper session id, the `ephemeralOwner` of its member nodes.
    owner: i64,
    /// Its member registrations, held across requests (made one at a time).
    registrations: tokio::sync::Mutex<Registrations>,
    beat: Mutex<Beat>,
    watchdog: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Own {
    fn stop(&self) {
        if let Some(w) = self.watchdog.lock().ok().and_then(|mut w| w.take()) {
            w.abort();
        }
    }

    fn client(&self) -> Option<Client> {
        self.client
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|c| !c.state().is_terminated())
    }
}

/// The engine's primitives over one ZooKeeper ensemble.
pub(crate) struct ZkPrimitives {
    shared: Arc<Shared>,
    own: Mutex<HashMap<String, Arc<Own>>>,
    known: Mutex<HashMap<ElectionName, Known>>,
}

impl fmt::Debug for ZkPrimitives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkPrimitives")
            .field("config", &self.shared.config)
            .finish()
    }
}

impl Drop for ZkPrimitives {
    fn drop(&mut self) {
        if let Ok(own) = self.own.lock() {
            own.values().for_each(|o| o.stop());
        }
    }
}

/// Ends a session once its TTL has passed since the last renewal that was answered
/// was sent, as a store with server-side TTLs would: its holder's deadline (the renew
/// deadline after that renewal, below the TTL) has passed by then. The node goes and
/// the session is closed; should the connection be down, it is dropped and the server
/// expires the session after its timeout (no sooner than the TTL after its last sign
/// of life). A process that dies leaves it to the server the same way.
async fn watchdog(own: Arc<Own>, shared: Arc<Shared>, ttl: Duration, id: String) {
    let step = (ttl / 40).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(step).await;
        let due = match own.beat.lock() {
            Ok(mut b) if b.confirmed.elapsed() > ttl => {
                b.ended = true;
                true
            }
            Ok(_) => false,
            Err(_) => return,
        };
        if due {
            tracing::debug!(session = %id, "no renewal answered for a TTL: ending the ZooKeeper session");
            let _ = end(&shared, &own, &id).await;
            return;
        }
    }
}

/// End session `id` opened here: delete its node (readers count it ended at once),
/// then close the ZooKeeper session (its member nodes go with it).
async fn end(shared: &Shared, own: &Own, id: &str) -> Result<()> {
    let client = own.client.lock().ok().and_then(|mut c| c.take());
    let Some(client) = client.filter(|c| !c.state().is_terminated()) else {
        return Ok(());
    };
    let deleted = shared
        .requests
        .call("end session", client.delete(&session_path(id), None))
        .await;
    // The client is detached: dropping it only drops the connection.
    drop(client);
    close_session(&shared.config, own.info.clone()).await?;
    match deleted {
        Err(e) if !crate::shared::is_no_node(&e) => Err(e),
        _ => Ok(()),
    }
}

/// The node that exists while session `session`'s record in the election at `dir`
/// does (never written: its deletion wakes the waiter behind the record).
fn presence(dir: &str, session: &str) -> String {
    format!("{dir}/:r-{session}")
}

/// The node rewritten with every write to session `session`'s record (its data: the
/// election's revision after that write), which its owner watches.
fn change(dir: &str, session: &str) -> String {
    format!("{dir}/:c-{session}")
}

/// A write to a record's nodes beside the election node's data.
enum Signal {
    Create(String, Vec<u8>),
    Set(String, Vec<u8>),
    Delete(String),
}

impl Signal {
    fn path(&self) -> &str {
        match self {
            Signal::Create(p, _) | Signal::Set(p, _) | Signal::Delete(p) => p,
        }
    }
}

/// A write planned on a known election: the multi's ops and the election after.
struct Plan {
    dir: String,
    checks: Vec<String>,
    create: bool,
    expected: i32,
    data: Vec<u8>,
    signals: Vec<Signal>,
    after: Known,
}

impl Plan {
    fn ops(&self) -> usize {
        self.checks.len() + usize::from(self.create) + 1 + self.signals.len()
    }

    fn add(&self, writer: &mut zookeeper_client::MultiWriter<'_>) -> Result<()> {
        let bad = |e| map("commit", e);
        let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        for path in &self.checks {
            writer.add_check_version(path, -1).map_err(bad)?;
        }
        if self.create {
            writer.add_create(&self.dir, &[], &options).map_err(bad)?;
        }
        writer
            .add_set_data(&self.dir, &self.data, Some(self.expected))
            .map_err(bad)?;
        for signal in &self.signals {
            match signal {
                Signal::Create(p, d) => writer.add_create(p, d, &options),
                Signal::Set(p, d) => writer.add_set_data(p, d, None),
                Signal::Delete(p) => writer.add_delete(p, None),
            }
            .map_err(bad)?;
        }
        Ok(())
    }

    /// The election after the write, given the `setData`'s stat.
    fn done(mut self, stat: &Stat) -> Known {
        self.after.version = Some(stat.version);
        self.after.mzxid = stat.mzxid;
        self.after.written = true;
        self.after
    }

    /// Where the election node's `setData` answers among the plan's results.
    fn set_at(&self) -> usize {
        self.checks.len() + usize::from(self.create)
    }
}

/// What a failed multi says of one write: which op failed.
enum Failed {
    /// A session it puts or touches has ended.
    Session(String),
    /// The node was created meanwhile (the write assumed none).
    Exists,
    /// The node's parent is missing.
    NoParent,
    /// The election moved on.
    Moved,
    /// A record's node was not as the records say (changed by hand): repair it.
    Signal(String, ZkError),
}

impl Plan {
    fn failed(&self, index: usize, err: &ZkError) -> Failed {
        if let Some(path) = self.checks.get(index) {
            let id = path.rsplit('/').next().unwrap_or_default().to_string();
            return Failed::Session(id);
        }
        if let Some(signal) = index
            .checked_sub(self.set_at() + 1)
            .and_then(|i| self.signals.get(i))
        {
            return Failed::Signal(signal.path().to_string(), err.clone());
        }
        match err {
            ZkError::NodeExists => Failed::Exists,
            ZkError::NoNode if self.create => Failed::NoParent,
            _ => Failed::Moved,
        }
    }
}

/// The `InvalidArgument` error for an election that holds Curator `LeaderLatch` nodes:
/// the layouts must never share an election (each would elect its own leader).
fn mixed_layouts(election: &ElectionName) -> Error {
    TAG.own(
        ErrorKind::InvalidArgument,
        format!(
            "election {election}: holds Curator LeaderLatch nodes, but this backend uses the \
             default layout; candidates of both layouts must not share an election (connect \
             with layout=curator to join them)"
        ),
    )
}

/// The revision of the election node with `stat` (none: 0).
fn revision_of(stat: Option<&Stat>) -> u64 {
    match stat {
        Some(s) if s.data_length > 0 => u64::try_from(s.version).unwrap_or(0),
        _ => 0,
    }
}

impl ZkPrimitives {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        ZkPrimitives {
            shared,
            own: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
        }
    }

    fn own(&self, id: &str) -> Option<Arc<Own>> {
        self.own.lock().ok().and_then(|o| o.get(id).cloned())
    }

    fn remember(&self, election: &ElectionName, known: &Known) {
        if let Ok(mut k) = self.known.lock() {
            if k.len() > 100_000 {
                k.clear();
            }
            k.insert(election.clone(), known.clone());
        }
    }

    fn cached(&self, election: &ElectionName) -> Option<Known> {
        self.known
            .lock()
            .ok()
            .and_then(|k| k.get(election).cloned())
    }

    /// Read `elections` and the liveness of their records' sessions: one multi-read of
    /// the nodes and of the session nodes last seen in them, and one more for sessions
    /// new to them.
    async fn read_known(&self, elections: &[ElectionName]) -> Result<Vec<Known>> {
        let client = self.shared.reader().await?;
        let mut guessed: Vec<String> = Vec::new();
        for e in elections {
            if let Some(k) = self.cached(e) {
                guessed.extend(k.sessions());
            }
        }
        guessed.sort();
        guessed.dedup();
        let bad = |e| map("read", e);
        let mut reader = client.new_multi_reader();
        for e in elections {
            reader.add_get_data(&election_dir(e)).map_err(bad)?;
        }
        for s in &guessed {
            reader.add_get_data(&session_path(s)).map_err(bad)?;
        }
        let mut results = self.shared.requests.call("read", reader.commit()).await?;
        let found = results.split_off(elections.len());
        let mut live: HashMap<String, bool> = HashMap::new();
        for (s, r) in guessed.into_iter().zip(found) {
            live.insert(s, matches!(r, MultiReadResult::Data { .. }));
        }
        let mut known = Vec::with_capacity(elections.len());
        for r in results {
            known.push(match r {
                MultiReadResult::Data { data, stat } => Known::from_node(&data, &stat),
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => Known::default(),
                MultiReadResult::Error { err } => return Err(self.tag(map("read", err))),
                _ => return Err(TAG.own(ErrorKind::Backend, "read: an unexpected answer")),
            });
        }
        let mut unknown: Vec<String> = known
            .iter()
            .flat_map(Known::sessions)
            .filter(|s| !live.contains_key(s))
            .collect();
        unknown.sort();
        unknown.dedup();
        if !unknown.is_empty() {
            let mut reader = client.new_multi_reader();
            for s in &unknown {
                reader.add_get_data(&session_path(s)).map_err(bad)?;
            }
            let found = self.shared.requests.call("read", reader.commit()).await?;
            for (s, r) in unknown.into_iter().zip(found) {
                live.insert(s, matches!(r, MultiReadResult::Data { .. }));
            }
        }
        for (e, k) in elections.iter().zip(known.iter_mut()) {
            if k.foreign_children() {
                let dir = election_dir(e);
                let children = self.shared.children(&client, "read", &dir).await?;
                k.curator = children.iter().any(|c| sequence_of(c).is_some());
            }
            for s in k.sessions() {
                let l = live.get(&s).copied().unwrap_or(false);
                k.live.insert(s, l);
            }
            self.remember(e, k);
        }
        Ok(known)
    }

    fn tag(&self, e: Error) -> Error {
        e.with_endpoint(self.shared.config.connect_string())
    }

    /// The write `write` on `base`: the multi's ops and the election after.
    fn plan(&self, election: &ElectionName, base: &Known, write: &Write) -> Plan {
        let mut after = base.clone();
        // The records minted by the write that last set the node get their number.
        for r in &mut after.stored.records {
            if r.minted {
                r.token = u64::try_from(base.mzxid).ok();
                r.minted = false;
            }
        }
        let revision = match base.version {
            Some(v) => u64::try_from(v).unwrap_or(0) + 1,
            None => 1,
        };
        if let Some(left) = write.left_body() {
            after.stored.left = String::from_utf8_lossy(&left).into_owned();
        }
        let dir = election_dir(election);
        let stamp = revision.to_string().into_bytes();
        let mut checks = Vec::new();
        let mut signals = Vec::new();
        for op in &write.ops {
            let session = op.session().to_string();
            let exists = after.stored.records.iter().any(|r| r.session == session);
            match op {
                Op::Delete(_) if exists => {
                    signals.push(Signal::Delete(presence(&dir, &session)));
                    signals.push(Signal::Delete(change(&dir, &session)));
                }
                Op::Put { .. } if !exists => {
                    signals.push(Signal::Create(presence(&dir, &session), Vec::new()));
                    signals.push(Signal::Create(change(&dir, &session), stamp.clone()));
                }
                Op::Put { .. } | Op::Touch(_) if exists => {
                    signals.push(Signal::Set(change(&dir, &session), stamp.clone()));
                }
                _ => {}
            }
            match op {
                Op::Put { token, .. } => {
                    let body = op.body().unwrap_or_default();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    let (token, minted) = match token {
                        Token::None => (None, false),
                        Token::Keep(t) => (Some(*t), false),
                        Token::Mint => (None, true),
                    };
                    match after
                        .stored
                        .records
                        .iter_mut()
                        .find(|r| r.session == session)
                    {
                        Some(r) => {
                            r.body = body;
                            r.token = token;
                            r.minted = minted;
                            r.version = revision;
                        }
                        None => {
                            after.stored.next += 1;
                            after.stored.records.push(Rec {
                                session: session.clone(),
                                arrival: after.stored.next,
                                version: revision,
                                token,
                                minted,
                                body,
                            });
                        }
                    }
                    checks.push(session.clone());
                    after.live.insert(session, true);
                }
                Op::Touch(_) => {
                    if let Some(r) = after
                        .stored
                        .records
                        .iter_mut()
                        .find(|r| r.session == session)
                    {
                        r.version = revision;
                    }
                    checks.push(session.clone());
                    after.live.insert(session, true);
                }
                Op::Delete(_) => {
                    after.stored.records.retain(|r| r.session != session);
                    after.live.remove(&session);
                }
            }
        }
        checks.sort();
        checks.dedup();
        // Serialising strings and numbers cannot fail.
        let data = serde_json::to_vec(&after.stored).unwrap_or_default();
        Plan {
            dir,
            signals,
            checks: checks.iter().map(|s| session_path(s)).collect(),
            create: base.version.is_none(),
            expected: base.version.unwrap_or(0),
            data,
            after,
        }
    }

    /// The election `write` is to be decided on: the one last seen if at its revision,
    /// none for revision 0 never seen, else read (`Err`: it moved on, as read).
    async fn base(
        &self,
        election: &ElectionName,
        write: &Write,
    ) -> Result<std::result::Result<Known, Known>> {
        match self.cached(election) {
            Some(k) if k.revision() == write.revision => return Ok(Ok(k)),
            None if write.revision == 0 => return Ok(Ok(Known::default())),
            _ => {}
        }
        let k = self.read_known(std::slice::from_ref(election)).await?;
        let k = k.into_iter().next().unwrap_or_default();
        Ok(match k.revision() == write.revision {
            true => Ok(k),
            false => Err(k),
        })
    }

    /// Send `plans` in one multi: `Ok(afters)` if it committed, else the index of the
    /// plan whose op failed and how.
    async fn send(
        &self,
        plans: &[Plan],
    ) -> Result<std::result::Result<Vec<Stat>, (usize, Failed)>> {
        let client = self.shared.reader().await?;
        let mut writer = client.new_multi_writer();
        for p in plans {
            p.add(&mut writer)?;
        }
        let commit = async { Ok::<_, ZkError>(writer.commit().await) };
        match self.shared.requests.call("commit", commit).await? {
            Ok(results) => {
                let mut stats = Vec::with_capacity(plans.len());
                let mut results = results.into_iter();
                for p in plans {
                    let mut set = None;
                    for i in 0..p.ops() {
                        let r = results.next();
                        if i == p.set_at() {
                            set = r;
                        }
                    }
                    match set {
                        Some(MultiWriteResult::SetData { stat }) => stats.push(stat),
                        _ => {
                            return Err(TAG.own(ErrorKind::Backend, "commit: an unexpected answer"))
                        }
                    }
                }
                Ok(Ok(stats))
            }
            Err(MultiWriteError::OperationFailed { index, source }) => {
                let mut at = index;
                for (i, p) in plans.iter().enumerate() {
                    if at < p.ops() {
                        return Ok(Err((i, p.failed(at, &source))));
                    }
                    at -= p.ops();
                }
                Err(self.tag(map("commit", source)))
            }
            Err(MultiWriteError::RequestFailed { source }) => Err(self.tag(map("commit", source))),
        }
    }

    /// Make the parents of `election`'s node.
    async fn make_parent(&self, election: &ElectionName) -> Result<()> {
        let dir = election_dir(election);
        let Some((parent, _)) = dir.rsplit_once('/') else {
            return Ok(());
        };
        if parent.is_empty() {
            return Ok(());
        }
        let client = self.shared.reader().await?;
        self.shared.make_dirs(&client, "commit", &[parent]).await
    }

    /// One write, after the base is known: its answer.
    async fn commit_one(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let mut made_parent = false;
        let mut repairs = 0;
        loop {
            let base = match self.base(election, write).await? {
                Ok(b) => b,
                Err(moved) => return Ok((false, moved.snapshot())),
            };
            if base.refuses(write) {
                return Err(mixed_layouts(election));
            }
            let plan = self.plan(election, &base, write);
            let plans = [plan];
            match self.send(&plans).await? {
                Ok(stats) => {
                    let [plan] = plans;
                    let after = plan.done(&stats[0]);
                    self.remember(election, &after);
                    return Ok((true, after.snapshot()));
                }
                Err((_, Failed::Session(id))) => {
                    let mut k = base;
                    k.live.insert(id, false);
                    self.remember(election, &k);
                    return Ok((false, k.snapshot()));
                }
                Err((_, Failed::NoParent)) if !made_parent => {
                    made_parent = true;
                    self.make_parent(election).await?;
                }
                Err((_, Failed::Signal(path, err))) if repairs < 4 => {
                    repairs += 1;
                    self.repair(&path, &err).await?;
                }
                Err((_, Failed::Signal(path, err))) => {
                    let why = format!("commit: the node {path} stays inconsistent ({err})");
                    return Err(TAG.own(ErrorKind::Backend, why));
                }
                Err((_, Failed::Exists | Failed::Moved | Failed::NoParent)) => {
                    let k = self.read_known(std::slice::from_ref(election)).await?;
                    let k = k.into_iter().next().unwrap_or_default();
                    if k.revision() == write.revision && base.version != k.version {
                        // An empty node (made for a sub-election): write it at its version.
                        continue;
                    }
                    return Ok((false, k.snapshot()));
                }
            }
        }
    }

    /// Make a record's node `path` fit the records again after its write failed with
    /// `err` (someone deleted or made it by hand).
    async fn repair(&self, path: &str, err: &ZkError) -> Result<()> {
        let client = self.shared.reader().await?;
        tracing::warn!(node = %path, error = %err, "a record's node was changed by hand; repairing it");
        let done = match err {
            ZkError::NodeExists => {
                self.shared
                    .requests
                    .call("repair", client.delete(path, None))
                    .await
            }
            _ => {
                let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                let made = client.create(path, &[], &options);
                self.shared.requests.call("repair", made).await.map(drop)
            }
        };
        match done {
            Err(e) if !crate::shared::is_no_node(&e) && !is_node_exists(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Session `id`'s own connection renews it: a multi checking its node, a write
    /// the ensemble's leader answers only once committed with a quorum (a follower cut
    /// off from it would go on answering reads).
    async fn renew_own(&self, id: &str, own: &Own) -> Result<bool> {
        let sent = Instant::now();
        let ended = own.beat.lock().map(|b| b.ended).unwrap_or(true);
        let Some(client) = own.client().filter(|_| !ended) else {
            return Ok(false);
        };
        let mut writer = client.new_multi_writer();
        writer
            .add_check_version(&session_path(id), -1)
            .map_err(|e| map("keep alive", e))?;
        let commit = async { Ok::<_, ZkError>(writer.commit().await) };
        match self
            .shared
            .requests
            .call_as(Purpose::Renewal, "keep alive", commit)
            .await?
        {
            Ok(_) => Ok(own
                .beat
                .lock()
                .map(|mut b| {
                    if !b.ended && sent > b.confirmed {
                        b.confirmed = sent;
                    }
                    !b.ended
                })
                .unwrap_or(false)),
            Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
            Err(MultiWriteError::RequestFailed { source }) => {
                let e = map("keep alive", source);
                match e.kind() {
                    ErrorKind::SessionExpired => Ok(false),
                    _ => Err(self.tag(e)),
                }
            }
        }
    }
}

#[async_trait]
impl Primitives for ZkPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        // Detached: dropping the client (an abandoned session) leaves the session to
        // expire on the server; a revoke closes it.
        let opened = Instant::now();
        let client = connect_client(&self.shared.config, ttl, None, true).await?;
        let negotiated = client.session_timeout();
        if negotiated != ttl {
            return Err(Error::invalid(format!(
                "ttl: ZooKeeper granted a session timeout of {negotiated:?} for the requested {ttl:?}; \
                 the server clamps session timeouts to [minSessionTimeout, maxSessionTimeout] \
                 (by default [2, 20] × tickTime), so choose a ttl in that range"
            ))
            .with_backend(crate::SCHEME));
        }
        let owner = client.session_id().0;
        let id = format!("{owner:016x}");
        let path = session_path(&id);
        let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        let mut made = false;
        loop {
            match self
                .shared
                .requests
                .call("open", client.create(&path, &[], &options))
                .await
            {
                Ok(_) => break,
                Err(e) if crate::shared::is_no_node(&e) && !made => {
                    made = true;
                    let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    match self
                        .shared
                        .requests
                        .call("open", client.mkdir(SESSIONS, &dirs))
                        .await
                    {
                        Err(e) if !is_node_exists(&e) => return Err(e),
                        _ => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let info = client.session().clone();
        let slot: ClientSlot = Arc::new(Mutex::new(Some(client)));
        self.shared.register(&id, info.clone(), slot.clone());
        let own = Arc::new(Own {
            client: slot,
            info,
            owner,
            registrations: tokio::sync::Mutex::default(),
            beat: Mutex::new(Beat {
                confirmed: opened,
                ended: false,
            }),
            watchdog: Mutex::new(None),
        });
        let task = watchdog(own.clone(), self.shared.clone(), ttl, id.clone());
        if let Ok(mut w) = own.watchdog.lock() {
            *w = Some(tokio::spawn(task));
        }
        if let Ok(mut o) = self.own.lock() {
            o.insert(id.clone(), own);
        }
        Ok(id)
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let renewals = sessions.iter().map(|id| async move {
            match self.own(id) {
                Some(own) => self.renew_own(id, &own).await,
                None => {
                    let client = self.shared.reader().await?;
                    let stat = self
                        .shared
                        .requests
                        .call_as(
                            Purpose::Renewal,
                            "keep alive",
                            client.check_stat(&session_path(id)),
                        )
                        .await?;
                    Ok(stat.is_some())
                }
            }
        });
        futures::future::try_join_all(renewals).await
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        let own = self.own.lock().ok().and_then(|mut o| o.remove(session));
        self.shared.unregister(session);
        let path = session_path(session);
        let Some(own) = own else {
            let client = self.shared.reader().await?;
            return match self
                .shared
                .requests
                .call("revoke", client.delete(&path, None))
                .await
            {
                Err(e) if !crate::shared::is_no_node(&e) => Err(e),
                _ => Ok(()),
            };
        };
        own.stop();
        end(&self.shared, &own, session).await
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let k = self.read_known(std::slice::from_ref(election)).await?;
        Ok(k.into_iter().next().unwrap_or_default().snapshot())
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let mut snaps = Vec::with_capacity(elections.len());
        for chunk in elections.chunks(BATCH) {
            snaps.extend(self.read_known(chunk).await?.iter().map(Known::snapshot));
        }
        Ok(snaps)
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        self.commit_one(election, write).await
    }

    /// One multi for the whole batch when every write commits; should one of them
    /// fail (a compare, an ended session), the batch is committed write by write.
    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let mut answers = Vec::with_capacity(writes.len());
        let mut start = 0;
        while start < writes.len() {
            // Chunks of at most BATCH writes and BATCH_BYTES of data.
            let mut plans = Vec::new();
            let mut bytes = 0;
            let mut end = start;
            let mut unknown = Vec::new();
            while end < writes.len() && plans.len() < BATCH && bytes < BATCH_BYTES {
                let (e, w) = &writes[end];
                match self.cached(e) {
                    Some(k) if k.revision() == w.revision && !k.curator => {
                        let p = self.plan(e, &k, w);
                        bytes += p.data.len();
                        plans.push(p);
                    }
                    None if w.revision == 0 => {
                        let p = self.plan(e, &Known::default(), w);
                        bytes += p.data.len();
                        plans.push(p);
                    }
                    _ => unknown.push(end),
                }
                end += 1;
            }
            let chunk = &writes[start..end];
            if !unknown.is_empty() || plans.len() < 2 {
                for (e, w) in chunk {
                    answers.push(self.commit_one(e, w).await?);
                }
                start = end;
                continue;
            }
            let mut made_parents = false;
            loop {
                match self.send(&plans).await? {
                    Ok(stats) => {
                        for ((plan, stat), (e, _)) in plans.into_iter().zip(&stats).zip(chunk) {
                            let after = plan.done(stat);
                            self.remember(e, &after);
                            answers.push((true, after.snapshot()));
                        }
                        break;
                    }
                    Err((_, Failed::NoParent)) if !made_parents => {
                        made_parents = true;
                        let client = self.shared.reader().await?;
                        let parents: Vec<&str> = plans
                            .iter()
                            .filter(|p| p.create)
                            .filter_map(|p| p.dir.rsplit_once('/').map(|(d, _)| d))
                            .filter(|d| !d.is_empty())
                            .collect();
                        self.shared.make_dirs(&client, "commit", &parents).await?;
                    }
                    Err(_) => {
                        for (e, w) in chunk {
                            answers.push(self.commit_one(e, w).await?);
                        }
                        break;
                    }
                }
            }
            start = end;
        }
        Ok(answers)
    }

    fn batch(&self) -> Option<usize> {
        Some(BATCH)
    }

    /// A waiter watches its own record's change node and the presence and session
    /// nodes of the record ahead; a holder its own change node; an observer the
    /// election node. The watches are sent together (one round trip) and then checked
    /// against what the caller saw, so a change before they were set is not missed.
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let client = self.shared.reader().await?;
        let dir = election_dir(election);
        let call = |f| self.shared.requests.call("wait", f);
        if what.me.is_none() && what.on.is_none() {
            let (stat, w) = call(client.check_and_watch_stat(&dir)).await?;
            if revision_of(stat.as_ref()) == what.seen {
                w.changed().await;
            }
            return Ok(());
        }
        let mine = what.me.as_deref().map(|m| change(&dir, m));
        let ahead = what
            .on
            .as_deref()
            .map(|o| (presence(&dir, o), session_path(o)));
        let mine = mine.as_deref().map(|p| client.get_and_watch_data(p));
        let ahead = ahead.as_ref().map(|(r, s)| {
            (
                client.check_and_watch_stat(r),
                client.check_and_watch_stat(s),
            )
        });
        let mut watches = Vec::new();
        if let Some(f) = mine {
            // Gone, or written after the revision seen (its data: that revision).
            match self.shared.requests.call("wait", f).await {
                Err(e) if crate::shared::is_no_node(&e) => return Ok(()),
                Err(e) => return Err(e),
                Ok((data, _, w)) => {
                    let stamp = String::from_utf8_lossy(&data).parse::<u64>();
                    if stamp.map_or(true, |s| s > what.seen) {
                        return Ok(());
                    }
                    watches.push(w);
                }
            }
        }
        if let Some((record, session)) = ahead {
            let (record, session) = (call(record).await?, call(session).await?);
            if record.0.is_none() || session.0.is_none() {
                return Ok(());
            }
            watches.push(record.1);
            watches.push(session.1);
        }
        let fired = watches.into_iter().map(|w| Box::pin(w.changed()));
        futures::future::select_all(fired).await;
        Ok(())
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(self)
    }
}

/// Members: ephemeral sequential nodes of the session's own ZooKeeper session (see
/// [`members`](crate::members)).
#[async_trait]
impl MemberStore for ZkPrimitives {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let own = self.own(session);
        let ended = || TAG.own(ErrorKind::SessionExpired, "ZooKeeper session ended");
        let own = own.ok_or_else(ended)?;
        let client = own.client().ok_or_else(ended)?;
        let mut regs = own.registrations.lock().await;
        members::register(
            &self.shared,
            &client,
            own.owner,
            &mut regs,
            namespace,
            member,
        )
        .await
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        // Nothing is registered in a session that is gone.
        let Some(own) = self.own(session) else {
            return Ok(());
        };
        let Some(client) = own.client() else {
            return Ok(());
        };
        let mut regs = own.registrations.lock().await;
        members::unregister(&self.shared, &client, own.owner, &mut regs, namespace, id).await
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        members::list(&self.shared, namespace).await
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        members::watch(&self.shared, namespace).await
    }
}
