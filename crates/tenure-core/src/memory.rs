//! The in-memory backend: the reference implementation of the contract and the embedded
//! default. Driven by tokio time, so tests can `tokio::time::pause()`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::backend::config::{unknown_key, BackendUrl};
use crate::backend::mem_members::Namespaces;
use crate::backend::{
    Backend, BackendSession, CampaignMode, Capabilities, DynSession, LeaderStream, MemberStream,
    SessionEvents,
};
use crate::error::{Error, ErrorKind, Result};
use crate::name::{Candidate, ElectionName, FencingToken, LeaderInfo, Member};

/// The URL scheme of the in-memory backend: `mem://` (a private store) or `mem://NAME`
/// (a store shared by every `connect("mem://NAME")` in this process).
pub const MEM_SCHEME: &str = "mem";

/// An in-process store keeping the whole contract: sessions with TTLs on tokio time,
/// a queue of candidates per election ordered by priority, then arrival (only the next
/// waiter is woken), preemption of a holder by a candidate with a higher priority
/// (clause 14), strictly increasing fencing tokens, and watch channels for observers.
///
/// Fault hooks for tests act on a session by its id ([`Session::id`](crate::Session::id)):
/// [`expire_session`](Self::expire_session), [`stall_session`](Self::stall_session)
/// (its requests stop reaching the store, as in a partition, until
/// [`unstall_session`](Self::unstall_session)) and [`crash_session`](Self::crash_session)
/// (it stops forever without resigning; the store frees its seats after the TTL).
///
/// Clones share the store.
#[derive(Clone)]
pub struct MemoryBackend {
    store: Arc<MemStore>,
}

struct MemStore {
    name: String,
    state: Mutex<MemState>,
    requests: AtomicU64,
}

#[derive(Default)]
struct MemState {
    next_session: u64,
    sessions: HashMap<u64, SessionEntry>,
    /// Fault gates by session; they outlive an expired session so that a partitioned
    /// client stays cut off until the test heals it.
    gates: HashMap<u64, watch::Sender<Gate>>,
    elections: HashMap<ElectionName, ElectionEntry>,
    /// Member lists by namespace.
    members: Namespaces,
    /// Preemptions a stalled session has not heard of yet, by session: it is told
    /// when its requests get through again.
    unheard_preemptions: HashMap<u64, Vec<(ElectionName, FencingToken)>>,
    /// `mem://NAME` of a named store, the endpoint its errors name.
    endpoint: Option<String>,
}

impl MemState {
    fn new(name: &str) -> Self {
        MemState {
            endpoint: endpoint(name),
            ..MemState::default()
        }
    }
}

/// The endpoint errors of the store called `name` name: `mem://NAME`, none for a
/// private store. Errors of the memory backend have no cause to print.
fn endpoint(name: &str) -> Option<String> {
    (!name.is_empty()).then(|| format!("{MEM_SCHEME}://{name}"))
}

/// `e` naming `endpoint`, if any.
fn at(e: Error, endpoint: Option<&str>) -> Error {
    match endpoint {
        Some(endpoint) => e.with_endpoint(endpoint),
        None => e,
    }
}

struct SessionEntry {
    expires_at: Instant,
    ttl: Duration,
    events: SessionEvents,
    elections: HashSet<ElectionName>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gate {
    Open,
    Stalled,
    Crashed,
}

struct Waiter {
    session: u64,
    candidate: Candidate,
    grant: oneshot::Sender<Result<FencingToken>>,
}

struct Holder {
    session: u64,
    token: FencingToken,
    candidate: Candidate,
    /// Whether the holder was told that a candidate with a higher priority waits.
    preempted: bool,
}

struct ElectionEntry {
    last_token: u64,
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
    /// The waiter a handover asked for (by candidate id): the next grant goes to it
    /// if it still waits then. Used up by the next grant.
    handover_to: Option<String>,
    /// The leader as observers see it; made by the first observer (an election nobody
    /// observes costs no channel).
    watch: Option<watch::Sender<Option<LeaderInfo>>>,
}

impl ElectionEntry {
    fn new() -> Self {
        ElectionEntry {
            last_token: 0,
            holder: None,
            waiters: VecDeque::new(),
            handover_to: None,
            watch: None,
        }
    }

    fn leader(&self) -> Option<LeaderInfo> {
        self.holder.as_ref().map(|h| LeaderInfo {
            id: h.candidate.id().to_string(),
            value: h.candidate.value().to_string(),
            token: h.token,
        })
    }

    /// Tell observers, if any, of the current leader.
    fn publish(&self) {
        if let Some(w) = &self.watch {
            w.send_replace(self.leader());
        }
    }

    fn subscribe(&mut self) -> watch::Receiver<Option<LeaderInfo>> {
        let leader = self.leader();
        self.watch
            .get_or_insert_with(|| watch::Sender::new(leader))
            .subscribe()
    }

    fn grant(&mut self, session: u64, candidate: Candidate) -> FencingToken {
        self.last_token += 1;
        let token = FencingToken(self.last_token);
        self.holder = Some(Holder {
            session,
            token,
            candidate,
            preempted: false,
        });
        self.publish();
        token
    }

    /// Queue `waiter` behind every waiter of its priority or higher.
    fn enqueue(&mut self, waiter: Waiter) {
        let priority = waiter.candidate.priority();
        let at = self
            .waiters
            .iter()
            .position(|w| w.candidate.priority() < priority)
            .unwrap_or(self.waiters.len());
        self.waiters.insert(at, waiter);
    }

    /// The holder's session and token if it is to be told now that it is preempted by
    /// a candidate of priority `joined` that just queued: a higher priority than the
    /// holder's, which did not opt out and was not told yet. Marks the holder told.
    fn preemption_due(&mut self, joined: i32) -> Option<(u64, FencingToken)> {
        let holder = self.holder.as_mut()?;
        if holder.preempted
            || !holder.candidate.preemptible()
            || joined <= holder.candidate.priority()
        {
            return None;
        }
        holder.preempted = true;
        Some((holder.session, holder.token))
    }

    /// The store's side of a handover to `to` (or the best waiter): the holder to tell
    /// (session, token; `None` if it was told already) and what it holds.
    fn hand_over(
        &mut self,
        election: &ElectionName,
        to: Option<&str>,
    ) -> Result<(Option<(u64, FencingToken)>, LeaderInfo)> {
        let Some(info) = self.leader() else {
            return Err(Error::invalid(format!(
                "election {election}: nobody leads it, nothing to hand over"
            )));
        };
        let mut live = self.waiters.iter().filter(|w| !w.grant.is_closed());
        match to {
            Some(id) if !live.any(|w| w.candidate.id() == id) => {
                return Err(Error::invalid(format!(
                    "election {election}: no candidate {id:?} waits for it"
                )))
            }
            None if live.next().is_none() => {
                return Err(Error::invalid(format!(
                    "election {election}: nobody waits for it, {:?} keeps it",
                    info.id
                )))
            }
            _ => {}
        }
        self.handover_to = to.map(str::to_string);
        let holder = self.holder.as_mut().filter(|h| !h.preempted).map(|h| {
            h.preempted = true;
            (h.session, h.token)
        });
        Ok((holder, info))
    }

    /// Hand a free seat to the first waiter still listening (the queue is in grant
    /// order: priority, then arrival). Returns how many waiters
    /// were woken (one, or zero if none is left).
    fn advance(&mut self) -> u64 {
        if self.holder.is_some() {
            return 0;
        }
        if let Some(id) = self.handover_to.take() {
            let asked = self.waiters.iter().position(|w| w.candidate.id() == id);
            if let Some(w) = asked.and_then(|at| self.waiters.remove(at)) {
                if self.offer(w) {
                    return 1;
                }
            }
        }
        while let Some(w) = self.waiters.pop_front() {
            if self.offer(w) {
                return 1;
            }
        }
        self.publish();
        0
    }

    /// Grant the seat to `w` if it still listens.
    fn offer(&mut self, w: Waiter) -> bool {
        // `grant` below mints exactly this token.
        let token = FencingToken(self.last_token + 1);
        if w.grant.send(Ok(token)).is_ok() {
            self.grant(w.session, w.candidate);
            return true;
        }
        false
    }

    fn release(&mut self, session: u64, token: Option<FencingToken>) -> bool {
        let before = self.waiters.len();
        self.waiters.retain(|w| w.session != session);
        let mut changed = self.waiters.len() != before;
        if self
            .holder
            .as_ref()
            .is_some_and(|h| h.session == session && token.is_none_or(|t| t == h.token))
        {
            self.holder = None;
            changed = true;
        }
        changed
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<MemStore>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<MemStore>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("name", &self.store.name)
            .finish()
    }
}

impl MemoryBackend {
    /// A new private store.
    pub fn new() -> Self {
        MemoryBackend {
            store: Arc::new(MemStore {
                name: String::new(),
                state: Mutex::new(MemState::new("")),
                requests: AtomicU64::new(0),
            }),
        }
    }

    /// The store called `name` in this process, created if no live one exists, so that
    /// separate parts of one program can meet in it.
    pub fn named(name: &str) -> Self {
        let mut reg = match registry().lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(store) = reg.get(name).and_then(Weak::upgrade) {
            return MemoryBackend { store };
        }
        let store = Arc::new(MemStore {
            name: name.to_string(),
            state: Mutex::new(MemState::new(name)),
            requests: AtomicU64::new(0),
        });
        reg.insert(name.to_string(), Arc::downgrade(&store));
        MemoryBackend { store }
    }

    /// Parse `mem://` or `mem://NAME` (NAME: letters, digits, `-`, `_`, `.`).
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[MEM_SCHEME])?;
        url.forbid_userinfo("the memory store takes none")?;
        url.forbid_path("name the store as mem://NAME")?;
        if let Some((key, _)) = url.query.first() {
            return Err(unknown_key(key, &[]));
        }
        let name = match url.hosts.as_slice() {
            [] => return Ok(MemoryBackend::new()),
            [name] => name.as_str(),
            _ => return Err(Error::invalid("url: expected one store name (mem://NAME)")),
        };
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(Error::invalid(format!(
                "url: store name may use ASCII letters, digits, '-', '_', '.' (found {c:?})"
            )));
        }
        Ok(MemoryBackend::named(name))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemState> {
        crate::backend::lock(&self.store.state)
    }

    fn with_session<T>(&self, id: &str, f: impl FnOnce(&mut MemState, u64) -> T) -> Option<T> {
        let n = parse_session_id(id)?;
        let mut st = self.lock();
        if !st.sessions.contains_key(&n) {
            return None;
        }
        Some(f(&mut st, n))
    }

    /// Expire the session now, as an operator revoking it would: its seats are freed at
    /// once, its waiters dropped, and the client is told by notification (when its
    /// requests get through). This is earlier than the TTL promises, so the holder may
    /// still believe it leads while the next waiter is granted — the case fencing
    /// tokens exist for; tests of clause 1 use [`stall_session`](Self::stall_session) or
    /// [`crash_session`](Self::crash_session) instead. Returns false if no such session.
    pub fn expire_session(&self, id: &str) -> bool {
        self.with_session(id, |st, n| expire(st, n, "expired by a test hook"))
            .is_some()
    }

    /// Revoke the session now, as etcd's lessor revokes a lease: its seats and member
    /// registrations are deleted at once, and the holder hears of each seat as a watch
    /// on it would tell it (`ElectionLost`), but not of the session, which it learns
    /// is gone from its next request (`SessionExpired`). Returns false if no such
    /// session.
    pub fn revoke_session(&self, id: &str) -> bool {
        self.with_session(id, |st, n| {
            let held: Vec<(ElectionName, FencingToken)> = st
                .sessions
                .get(&n)
                .into_iter()
                .flat_map(|entry| &entry.elections)
                .filter_map(|e| {
                    let h = st.elections.get(e)?.holder.as_ref()?;
                    (h.session == n).then(|| (e.clone(), h.token))
                })
                .collect();
            let Some(entry) = end_session(st, n) else {
                return;
            };
            for (election, token) in held {
                entry
                    .events
                    .election_lost(&election, token, "revoked by a test hook");
            }
            st.gates.remove(&n);
        })
        .is_some()
    }

    /// Stop the session's requests from reaching the store (a partition): they wait
    /// until [`unstall_session`](Self::unstall_session); the store expires the session
    /// after its TTL meanwhile.
    pub fn stall_session(&self, id: &str) -> bool {
        self.set_gate(id, Gate::Stalled)
    }

    /// Let a stalled session's requests through again.
    pub fn unstall_session(&self, id: &str) -> bool {
        self.set_gate(id, Gate::Open)
    }

    /// Make the session stop for good without resigning (a crashed holder): its
    /// requests never complete and the store frees its seats after the TTL.
    pub fn crash_session(&self, id: &str) -> bool {
        self.set_gate(id, Gate::Crashed)
    }

    fn set_gate(&self, id: &str, gate: Gate) -> bool {
        let Some(n) = parse_session_id(id) else {
            return false;
        };
        let mut st = self.lock();
        let live = st.sessions.contains_key(&n);
        match st.gates.get(&n) {
            Some(g) => {
                g.send_replace(gate);
            }
            None => return false,
        }
        if gate == Gate::Open && !live {
            st.gates.remove(&n);
        }
        if gate == Gate::Open {
            tell_unheard_preemptions(&mut st, n);
        }
        true
    }

    /// Ids of the sessions the store currently keeps.
    pub fn session_ids(&self) -> Vec<String> {
        let st = self.lock();
        let mut ids: Vec<_> = st.sessions.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter().map(session_id).collect()
    }
}

fn session_id(n: u64) -> String {
    format!("mem-{n}")
}

fn parse_session_id(id: &str) -> Option<u64> {
    id.strip_prefix("mem-")?.parse().ok()
}

/// Expire session `n`: free everything it held, and tell its client (once its requests get through).
fn expire(st: &mut MemState, n: u64, reason: &str) {
    let Some(entry) = end_session(st, n) else {
        return;
    };
    // A cut-off client hears of the expiry only when its requests get through again.
    let open = st.gates.get(&n).is_none_or(|g| *g.borrow() == Gate::Open);
    if open {
        entry.events.expired(reason);
        st.gates.remove(&n);
    }
}

/// Remove session `n` from the store and free its seats, queue places and members;
/// its entry, for the caller to tell the client as the way it ended calls for.
fn end_session(st: &mut MemState, n: u64) -> Option<SessionEntry> {
    let entry = st.sessions.remove(&n)?;
    st.unheard_preemptions.remove(&n);
    release_all(st, n, &entry.elections);
    st.members.drop_session(&session_id(n));
    Some(entry)
}

/// Tell the holder of `election` that it is preempted, if that is due (see
/// [`ElectionEntry::preemption_due`]): one notification, as a store's watch event
/// would be. A stalled holder hears of it when its requests get through again.
/// Returns whether a notification was sent.
fn preempt(st: &mut MemState, election: &ElectionName, joined: i32) -> bool {
    let due = st
        .elections
        .get_mut(election)
        .and_then(|el| el.preemption_due(joined));
    let Some((session, token)) = due else {
        return false;
    };
    tell_preempted(st, election, session, token)
}

/// Tell `session` that its grant `token` of `election` is preempted (one
/// notification), or, while it is cut off, once its requests get through again.
/// Returns whether a notification was sent now.
fn tell_preempted(
    st: &mut MemState,
    election: &ElectionName,
    session: u64,
    token: FencingToken,
) -> bool {
    let open = st
        .gates
        .get(&session)
        .is_none_or(|g| *g.borrow() == Gate::Open);
    match st.sessions.get(&session) {
        Some(s) if open => {
            s.events.preempted(election, token);
            true
        }
        Some(_) => {
            st.unheard_preemptions
                .entry(session)
                .or_default()
                .push((election.clone(), token));
            false
        }
        None => false,
    }
}

/// Tell session `n`, whose requests get through again, of the preemptions it missed
/// while stalled (of seats it still holds with the same token).
fn tell_unheard_preemptions(st: &mut MemState, n: u64) {
    let Some(unheard) = st.unheard_preemptions.remove(&n) else {
        return;
    };
    let Some(session) = st.sessions.get(&n) else {
        return;
    };
    for (election, token) in unheard {
        let held = st
            .elections
            .get(&election)
            .and_then(|el| el.holder.as_ref())
            .is_some_and(|h| h.session == n && h.token == token);
        if held {
            session.events.preempted(&election, token);
        }
    }
}

fn release_all(st: &mut MemState, n: u64, elections: &HashSet<ElectionName>) {
    for e in elections {
        if let Some(el) = st.elections.get_mut(e) {
            let mut kept = VecDeque::new();
            for w in el.waiters.drain(..) {
                if w.session == n {
                    let e = Error::new(ErrorKind::SessionExpired, "session expired while waiting")
                        .with_backend(MEM_SCHEME);
                    let _ = w.grant.send(Err(at(e, st.endpoint.as_deref())));
                } else {
                    kept.push_back(w);
                }
            }
            el.waiters = kept;
            if el.release(n, None) {
                el.advance();
            }
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn scheme(&self) -> &'static str {
        MEM_SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        // Every batch is one request under the store's lock.
        Capabilities::full().batched(usize::MAX).prioritized()
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let n = {
            let mut st = self.lock();
            st.next_session += 1;
            let n = st.next_session;
            st.sessions.insert(
                n,
                SessionEntry {
                    expires_at: Instant::now() + ttl,
                    ttl,
                    events,
                    elections: HashSet::new(),
                },
            );
            st.gates.insert(n, watch::Sender::new(Gate::Open));
            n
        };
        // The store's own expiry timer for this session.
        let weak = Arc::downgrade(&self.store);
        tokio::spawn(async move {
            loop {
                let at = {
                    let Some(store) = weak.upgrade() else { return };
                    let st = match store.state.lock() {
                        Ok(g) => g,
                        Err(p) => p.into_inner(),
                    };
                    match st.sessions.get(&n) {
                        Some(s) => s.expires_at,
                        None => return,
                    }
                };
                tokio::time::sleep_until(at).await;
                let Some(store) = weak.upgrade() else { return };
                let mut st = match store.state.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                match st.sessions.get(&n) {
                    Some(s) if Instant::now() >= s.expires_at => {
                        expire(&mut st, n, "TTL passed without renewal");
                        return;
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        });
        Ok(Arc::new(MemSession {
            backend: self.clone(),
            n,
            id: session_id(n),
        }))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.store.requests.fetch_add(1, Ordering::Relaxed);
        let st = self.lock();
        Ok(st.elections.get(election).and_then(ElectionEntry::leader))
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.store.requests.fetch_add(1, Ordering::Relaxed);
        let rx = {
            let mut st = self.lock();
            st.elections
                .entry(election.clone())
                .or_insert_with(ElectionEntry::new)
                .subscribe()
        };
        Ok(crate::backend::watch_stream(rx, Ok))
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.store.requests.load(Ordering::Relaxed))
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        self.store.requests.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.lock();
        let st = &mut *guard;
        let endpoint = st.endpoint.clone();
        let tag = |e: Error| at(e.with_backend(MEM_SCHEME), endpoint.as_deref());
        let Some(el) = st.elections.get_mut(election) else {
            return Err(tag(Error::invalid(format!(
                "election {election}: nobody leads it, nothing to hand over"
            ))));
        };
        let (holder, info) = el.hand_over(election, to).map_err(tag)?;
        if let Some((session, token)) = holder {
            if tell_preempted(st, election, session, token) {
                self.store.requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(info)
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        Ok(self.lock().members.list(namespace))
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        Ok(self.lock().members.watch(namespace))
    }
}

/// A session of the in-memory store.
/// Where a campaign stands after the store's side of it.
enum Joined {
    Granted(FencingToken),
    Taken,
    Queued(oneshot::Receiver<Result<FencingToken>>),
}

struct MemSession {
    backend: MemoryBackend,
    n: u64,
    id: String,
}

impl fmt::Debug for MemSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemSession").field("id", &self.id).finish()
    }
}

/// The error of a session the store no longer has.
fn expired_error(store: &MemStore) -> Error {
    let e = Error::new(
        ErrorKind::SessionExpired,
        "session is not known to the store",
    )
    .with_backend(MEM_SCHEME);
    at(e, endpoint(&store.name).as_deref())
}

impl MemSession {
    /// Join `election`: take the seat if it is free and nobody queues, else (with
    /// [`CampaignMode::Wait`]) queue and wait for the grant; `None` if `TryOnce` found
    /// the seat taken or queued for.
    async fn enter(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<FencingToken>> {
        self.pass_gate().await?;
        let joined = {
            let mut guard = self.backend.lock();
            self.backend.store.requests.fetch_add(1, Ordering::Relaxed);
            self.join(&mut guard, election, candidate, mode)?
        };
        let rx = match joined {
            Joined::Granted(token) => return Ok(Some(token)),
            Joined::Taken => return Ok(None),
            Joined::Queued(rx) => rx,
        };
        match rx.await {
            Ok(r) => {
                if r.is_ok() {
                    // The wake-up of this waiter is one store message.
                    self.backend.store.requests.fetch_add(1, Ordering::Relaxed);
                }
                r.map(Some)
            }
            Err(_) => Err(expired_error(&self.backend.store)),
        }
    }

    /// The store's side of a campaign, under its lock.
    fn join(
        &self,
        st: &mut MemState,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Joined> {
        let waiting = mode == CampaignMode::Wait;
        let s = st
            .sessions
            .get_mut(&self.n)
            .ok_or_else(|| expired_error(&self.backend.store))?;
        let el = st
            .elections
            .entry(election.clone())
            .or_insert_with(ElectionEntry::new);
        match &el.holder {
            Some(h) if h.session == self.n => return Ok(Joined::Granted(h.token)),
            Some(_) if !waiting => return Ok(Joined::Taken),
            _ => {}
        }
        if waiting {
            el.waiters.retain(|w| w.session != self.n);
        }
        if el.holder.is_none() && el.waiters.is_empty() {
            s.elections.insert(election.clone());
            return Ok(Joined::Granted(el.grant(self.n, candidate.clone())));
        }
        if !waiting {
            return Ok(Joined::Taken);
        }
        s.elections.insert(election.clone());
        let (tx, rx) = oneshot::channel();
        el.enqueue(Waiter {
            session: self.n,
            candidate: candidate.clone(),
            grant: tx,
        });
        if preempt(st, election, candidate.priority()) {
            // The holder's notification is one store message.
            self.backend.store.requests.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Joined::Queued(rx))
    }

    /// Wait at the gate: stalled requests wait, crashed ones never complete.
    async fn pass_gate(&self) -> Result<()> {
        let mut gate = {
            let st = self.backend.lock();
            match st.gates.get(&self.n) {
                Some(g) => g.subscribe(),
                None => return Ok(()),
            }
        };
        loop {
            let g = *gate.borrow_and_update();
            match g {
                Gate::Open => return Ok(()),
                Gate::Stalled | Gate::Crashed => {
                    if gate.changed().await.is_err() {
                        return Err(expired_error(&self.backend.store));
                    }
                }
            }
        }
    }
}

#[async_trait]
impl BackendSession for MemSession {
    fn id(&self) -> &str {
        &self.id
    }

    async fn keep_alive(&self) -> Result<()> {
        self.pass_gate().await?;
        let mut st = self.backend.lock();
        let s = st
            .sessions
            .get_mut(&self.n)
            .ok_or_else(|| expired_error(&self.backend.store))?;
        s.expires_at = Instant::now() + s.ttl;
        Ok(())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        match self.enter(election, candidate, CampaignMode::Wait).await? {
            Some(token) => Ok(token),
            None => Err(expired_error(&self.backend.store)),
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        self.enter(election, candidate, CampaignMode::TryOnce).await
    }

    /// One request for the whole batch: the store takes every seat under one lock.
    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        self.pass_gate().await?;
        let mut guard = self.backend.lock();
        self.backend.store.requests.fetch_add(1, Ordering::Relaxed);
        seats
            .iter()
            .map(|(election, candidate)| {
                match self.join(&mut guard, election, candidate, CampaignMode::TryOnce)? {
                    Joined::Granted(token) => Ok(Some(token)),
                    _ => Ok(None),
                }
            })
            .collect()
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.resign_many(&[(election.clone(), token)]).await
    }

    /// One request for the whole batch, under the store's lock.
    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        self.pass_gate().await?;
        let mut guard = self.backend.lock();
        let st = &mut *guard;
        self.backend.store.requests.fetch_add(1, Ordering::Relaxed);
        for (election, token) in grants {
            if let Some(el) = st.elections.get_mut(election) {
                if el.release(self.n, *token) {
                    el.advance();
                }
            }
        }
        Ok(())
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.pass_gate().await?;
        let mut guard = self.backend.lock();
        let st = &mut *guard;
        if !st.sessions.contains_key(&self.n) {
            return Err(expired_error(&self.backend.store));
        }
        st.members.register(&session_id(self.n), namespace, member);
        Ok(())
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.pass_gate().await?;
        let st = self.backend.lock();
        st.members.unregister(&session_id(self.n), namespace, id);
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let mut guard = self.backend.lock();
        if let Some(entry) = guard.sessions.remove(&self.n) {
            guard.unheard_preemptions.remove(&self.n);
            release_all(&mut guard, self.n, &entry.elections);
            guard.members.drop_session(&session_id(self.n));
        }
        guard.gates.remove(&self.n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn ids(list: Vec<Member>) -> Vec<String> {
        list.iter().map(|m| m.id().to_string()).collect()
    }

    /// The conformance check's expired-session step failed under load: the core's new
    /// session registered the member again before the watcher read, and a watch
    /// channel handed over only the latest list, in which the member never left.
    #[tokio::test]
    async fn a_member_that_leaves_and_returns_at_once_is_seen_leaving() {
        let backend = MemoryBackend::new();
        let ns = ElectionName::new("ns").unwrap();
        let (events, _rx) = SessionEvents::channel();
        let ttl = Duration::from_secs(10);
        let a = backend.open_session(ttl, events.clone()).await.unwrap();
        let d = backend.open_session(ttl, events).await.unwrap();
        a.register_member(&ns, &Member::new("a", "1").unwrap())
            .await
            .unwrap();
        d.register_member(&ns, &Member::new("d", "1").unwrap())
            .await
            .unwrap();
        let mut w = backend.watch_members(&ns).await.unwrap();
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a", "d"]);
        // d leaves and comes back before the watcher reads again.
        d.unregister_member(&ns, "d").await.unwrap();
        d.register_member(&ns, &Member::new("d", "1").unwrap())
            .await
            .unwrap();
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a"]);
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a", "d"]);
    }
}
