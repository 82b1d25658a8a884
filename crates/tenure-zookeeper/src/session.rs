//! The Curator layout (`layout=curator`): one tenure session = one ZooKeeper session;
//! candidacies as ephemeral sequential nodes, as Curator's `LeaderLatch` makes them.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::FutureExt;
use tenure_core::backend::{
    encode_record, revision_token, BackendSession, CampaignMode, Purpose, SessionEvents,
};
use tenure_core::{Candidate, ElectionName, Error, ErrorKind, FencingToken, Member, Result};
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, EventType, MultiReadResult, MultiReader,
    MultiWriteResult, OneshotWatcher, SessionState, WatchedEvent,
};

use crate::error::TAG;
use crate::members;
use crate::nodes::{election_dir, protected_prefix, random_uuid, sequence_of, sorted_latches};
use crate::shared::{close_session, connect_client, is_no_node, Shared};

/// A candidacy's node once created.
#[derive(Clone, Debug)]
struct Node {
    /// Name under the election's directory.
    name: String,
    /// The fencing token's zxid: the candidate node's creation zxid.
    czxid: i64,
}

impl Node {
    fn candidate(name: String, czxid: i64) -> Self {
        Node { name, czxid }
    }

    /// The paths to delete to give the seat up and leave the queue.
    fn paths(&self, dir: &str) -> Vec<String> {
        vec![format!("{dir}/{}", self.name)]
    }
}

/// Seats per multi of a batch: well within ZooKeeper's request size limit
/// (`jute.maxbuffer`, 1 MiB by default) for the longest names and values.
pub(crate) const BATCH: usize = 128;

/// A ZooKeeper session holding any number of candidacies.
pub(crate) struct ZkSession {
    shared: Arc<Shared>,
    /// `None` once closed or abandoned; clones are taken per request.
    client: Arc<Mutex<Option<Client>>>,
    /// Renewals in flight and when the last one ended, for the watchdog.
    beat: Arc<Mutex<Beat>>,
    watchdog: tokio::task::JoinHandle<()>,
    id: String,
    /// `_c_<uuid>-latch-`: this session's node name prefix in every election (Curator
    /// layout).
    prefix: String,
    /// Set by `close` and `abandon`: the owner ended this session, so later calls are
    /// `Closed`; a session that ended any other way (the server expired or closed it,
    /// the watchdog let it go) is `SessionExpired`, which makes the core open a new one.
    ended_by_owner: std::sync::atomic::AtomicBool,
    nodes: Arc<Mutex<HashMap<ElectionName, Node>>>,
    state_task: tokio::task::JoinHandle<()>,
    events: SessionEvents,
    /// The task guarding each held election's node (see [`guard_leader`]).
    guards: Mutex<HashMap<ElectionName, tokio::task::JoinHandle<()>>>,
    /// The ZooKeeper session id, the `ephemeralOwner` of this session's nodes.
    owner: i64,
    /// Member registrations by namespace and id: the node's name, `None` while unsure
    /// (a request in flight, failed or dropped). Held across requests, so registrations
    /// of one session are made one at a time.
    registrations: tokio::sync::Mutex<members::Registrations>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// The event of a one-shot watch on this session's own candidate node.
type OwnWatch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// What woke a waiting candidate.
enum Woken {
    Predecessor(EventType),
    Own,
    State(SessionState),
}

/// Renewals as the watchdog sees them: how many are in flight, and when the last one
/// ended (was answered, failed or was dropped).
#[derive(Debug)]
struct Beat {
    in_flight: usize,
    idle_since: Instant,
}

/// Counts one renewal in flight from its creation until it is dropped, whether it
/// finished or was dropped unfinished (the core drops a `keep_alive` that outlasts its
/// request timeout): the renewal ends either way.
struct InFlight(Arc<Mutex<Beat>>);

impl InFlight {
    fn start(beat: &Arc<Mutex<Beat>>) -> Self {
        if let Ok(mut b) = beat.lock() {
            b.in_flight += 1;
        }
        InFlight(beat.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut b) = self.0.lock() {
            b.in_flight = b.in_flight.saturating_sub(1);
            b.idle_since = Instant::now();
        }
    }
}

/// How long with no renewal in flight before the session counts as abandoned: half the
/// TTL. The core asks for the next renewal at most `renew_interval` after the previous
/// one ended (its interval after a success, a retry delay capped at the interval after a
/// failure or timeout), and `check_timing` holds `renew_interval` below half the TTL, so
/// a core that still wants the session never stays idle this long, however slow, failed
/// or closely spaced its renewals were while the client reconnected.
fn abandon_after(ttl: Duration) -> Duration {
    ttl / 2
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.state_task.abort();
        if let Ok(mut guards) = self.guards.lock() {
            guards.drain().for_each(|(_, t)| t.abort());
        }
        self.watchdog.abort();
        self.shared.unregister(&self.id);
    }
}

impl ZkSession {
    /// Open a ZooKeeper session whose timeout is `ttl`. The server must grant exactly
    /// `ttl`: a shorter session would expire before the core's deadline assumes, a
    /// longer one would make failover slower than promised.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Self> {
        // Detached: dropping the client (an abandoned session) leaves the session to
        // expire on the server instead of closing it; `close` closes it explicitly.
        let client = connect_client(&shared.config, ttl, None, true).await?;
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
        let session_info = client.session().clone();
        let mut states = client.state_watcher();
        let session_id = id.clone();
        let guard_events = events.clone();
        let state_task = tokio::spawn(async move {
            loop {
                match states.changed().await {
                    SessionState::Expired => {
                        tracing::debug!(session = %session_id, "ZooKeeper session expired");
                        events.expired("ZooKeeper session expired");
                        return;
                    }
                    SessionState::Closed | SessionState::AuthFailed => {
                        events.expired("ZooKeeper session ended");
                        return;
                    }
                    _ => {}
                }
            }
        });
        let client = Arc::new(Mutex::new(Some(client)));
        shared.register(&id, session_info, client.clone());
        let beat = Arc::new(Mutex::new(Beat {
            in_flight: 0,
            idle_since: Instant::now(),
        }));
        let watchdog = tokio::spawn(watchdog(client.clone(), beat.clone(), ttl, id.clone()));
        let uuid = random_uuid();
        Ok(ZkSession {
            shared,
            client,
            beat,
            watchdog,
            id,
            prefix: protected_prefix(&uuid),
            ended_by_owner: std::sync::atomic::AtomicBool::new(false),
            nodes: Arc::new(Mutex::new(HashMap::new())),
            state_task,
            events: guard_events,
            guards: Mutex::new(HashMap::new()),
            owner,
            registrations: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The error for a session that has ended: `Closed` if its owner ended it, else
    /// `SessionExpired`.
    fn ended(&self, how: &str) -> tenure_core::Error {
        if self
            .ended_by_owner
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            TAG.closed()
        } else {
            TAG.own(
                ErrorKind::SessionExpired,
                format!("ZooKeeper session {how}"),
            )
        }
    }

    fn client(&self) -> Result<Client> {
        let client = self
            .client
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .ok_or_else(|| self.ended("ended"))?;
        match client.state() {
            SessionState::Expired => {
                Err(TAG.own(ErrorKind::SessionExpired, "ZooKeeper session expired"))
            }
            SessionState::Closed => Err(self.ended("closed by the server")),
            SessionState::AuthFailed => {
                Err(TAG.own(ErrorKind::Unauthorized, "ZooKeeper authentication failed"))
            }
            _ => Ok(client),
        }
    }

    fn node(&self, election: &ElectionName) -> Option<Node> {
        self.nodes
            .lock()
            .ok()
            .and_then(|n| n.get(election).cloned())
    }

    /// Record `node` as this session's in `election`; returns it.
    fn remember(&self, election: &ElectionName, node: Node) -> Node {
        self.set_node(election, Some(node.clone()));
        node
    }

    fn set_node(&self, election: &ElectionName, node: Option<Node>) {
        if let Ok(mut n) = self.nodes.lock() {
            match node {
                Some(node) => n.insert(election.clone(), node),
                None => n.remove(election),
            };
        }
    }

    /// This session's node in `dir` as the server has it (after a create whose answer
    /// was lost, or a campaign that was dropped), by its protected prefix.
    async fn find_own(&self, client: &Client, dir: &str) -> Result<Option<Node>> {
        let children = self.shared.children(client, "campaign", dir).await?;
        for name in children.into_iter().filter(|c| c.starts_with(&self.prefix)) {
            match self
                .shared
                .requests
                .call("campaign", client.check_stat(&format!("{dir}/{name}")))
                .await?
            {
                Some(stat) => return Ok(Some(Node::candidate(name, stat.czxid))),
                None => continue,
            }
        }
        Ok(None)
    }

    /// This session's node in `election`, created if it has none.
    async fn ensure_node(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        candidate: &Candidate,
    ) -> Result<Node> {
        if let Some(node) = self.node(election) {
            return Ok(node);
        }
        if let Some(node) = self.find_own(client, dir).await? {
            return Ok(self.remember(election, node));
        }
        let path = format!("{dir}/{}", self.prefix);
        let data = encode_record(candidate);
        match self
            .shared
            .create_ephemeral(client, "campaign", dir, &path, &data)
            .await
        {
            Ok((stat, sequence)) => {
                let name = format!("{}{sequence}", self.prefix);
                let node = Node::candidate(name, stat.czxid);
                Ok(self.remember(election, node))
            }
            Err(e) if e.is_retryable() => {
                // The create may have happened: look for it before trying again.
                if let Some(node) = self.find_own(client, dir).await? {
                    return Ok(self.remember(election, node));
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Campaign until leading ([`CampaignMode::Wait`]) or once.
    async fn run(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<FencingToken>> {
        curator_accepts(candidate)?;
        let client = self.client()?;
        let dir = election_dir(election);
        if mode == CampaignMode::TryOnce && self.node(election).is_none() {
            // Do not queue behind a holder: look first.
            match self
                .shared
                .requests
                .call("try campaign", client.list_children(&dir))
                .await
            {
                Ok(children) if children.iter().any(|c| sequence_of(c).is_some()) => {
                    return Ok(None)
                }
                Ok(_) => {}
                Err(e) if is_no_node(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let mut states = client.state_watcher();
        // A one-shot exists watch on this session's own node, armed while waiting: its
        // event is delivered before any later one, so when the predecessor's delete
        // arrives and it has not fired, the node is still there.
        let mut own_watch: Option<(String, OwnWatch)> = None;
        loop {
            let node = self.ensure_node(&client, election, &dir, candidate).await?;
            let (children, written) = self.shared.children_of(&client, "campaign", &dir).await?;
            if written {
                return Err(mixed_layouts(election));
            }
            let latches = sorted_latches(children);
            let Some(position) = latches.iter().position(|c| *c == node.name) else {
                // Our node is gone (deleted by someone else): queue again.
                self.set_node(election, None);
                continue;
            };
            let own_path = format!("{dir}/{}", node.name);
            if position == 0 {
                let watch = own_watch.take().filter(|(n, _)| *n == node.name);
                return Ok(Some(self.granted(
                    election,
                    &own_path,
                    &node,
                    watch.map(|(_, w)| w),
                )));
            }
            if mode == CampaignMode::TryOnce {
                self.delete(&client, election, &dir, &node).await?;
                return Ok(None);
            }
            let predecessor = format!("{dir}/{}", latches[position - 1]);
            let Some(watcher) = self
                .watch_ahead(&client, election, &predecessor, &node, &mut own_watch)
                .await?
            else {
                continue;
            };
            let woken = tokio::select! {
                event = watcher.changed() => Woken::Predecessor(event.event_type),
                _ = changed(own_watch.as_mut().map(|(_, w)| w)) => Woken::Own,
                state = states.changed() => Woken::State(state),
            };
            match woken {
                Woken::Predecessor(EventType::NodeDeleted) if position == 1 => {
                    // The leader left and we were next: sequences only grow, so we lead
                    // unless our own node went first (its event would be here already).
                    let mut watch = own_watch.take().map(|(_, w)| w);
                    if let Some(w) = watch.as_mut() {
                        if w.as_mut().now_or_never().is_some() {
                            continue;
                        }
                    }
                    return Ok(Some(self.granted(election, &own_path, &node, watch)));
                }
                Woken::Predecessor(_) => {}
                Woken::Own => own_watch = None,
                Woken::State(state) => session_ended(state)?,
            }
        }
    }

    /// Arm the exists watch on `ahead` (the node a waiter waits for) and, once per node,
    /// the one on this session's own `node` (pipelined), kept in `own_watch`. `None`
    /// when either node is gone: list again (the own node is forgotten, to queue again).
    async fn watch_ahead(
        &self,
        client: &Client,
        election: &ElectionName,
        ahead: &str,
        node: &Node,
        own_watch: &mut Option<(String, OwnWatch)>,
    ) -> Result<Option<OneshotWatcher>> {
        if own_watch.as_ref().is_some_and(|(n, _)| *n != node.name) {
            *own_watch = None;
        }
        let watch_ahead = self
            .shared
            .requests
            .call("campaign", client.check_and_watch_stat(ahead));
        let (found, watcher) = if own_watch.is_none() {
            let own_path = format!("{}/{}", election_dir(election), node.name);
            let watch_own = self
                .shared
                .requests
                .call("campaign", client.check_and_watch_stat(&own_path));
            let (ahead, own_node) = futures::join!(watch_ahead, watch_own);
            match own_node? {
                (Some(_), w) => *own_watch = Some((node.name.clone(), Box::pin(w.changed()))),
                (None, _) => {
                    self.set_node(election, None);
                    return Ok(None);
                }
            }
            ahead?
        } else {
            watch_ahead.await?
        };
        Ok(found.map(|_| watcher))
    }

    /// Take the free seats of `chunk` (at most [`BATCH`]) in four round trips whatever
    /// its size: one multi-read of every election's queue (a seat with a queue is taken:
    /// trying never queues), one multi creating this session's node in the others, one
    /// multi-read of those queues and of the new nodes (for their creation zxids), and
    /// one multi withdrawing the nodes that are not first. Missing election directories
    /// are made in between (once per election); a seat this session already has a node
    /// in goes the one-seat way.
    async fn try_chunk(
        &self,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        const WHAT: &str = "try_campaign_many";
        for (_, c) in chunk {
            curator_accepts(c)?;
        }
        let client = self.client()?;
        let bad = |e| crate::error::map(WHAT, e);
        let (dirs, queues) = self
            .read_chunk(&client, chunk, |r, dir| r.add_get_children(dir))
            .await?;
        let mut answers = vec![None; chunk.len()];
        let (mut free, mut missing) = (Vec::new(), Vec::new());
        for (i, queue) in queues.into_iter().enumerate() {
            let (election, candidate) = &chunk[i];
            if self.node(election).is_some() {
                answers[i] = self.run(election, candidate, CampaignMode::TryOnce).await?;
                continue;
            }
            match queue {
                MultiReadResult::Children { children } => {
                    if !children.iter().any(|c| sequence_of(c).is_some()) {
                        free.push(i);
                    }
                }
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => {
                    missing.push(dirs[i].as_str());
                    free.push(i);
                }
                MultiReadResult::Error { err } => return Err(bad(err)),
                _ => return Err(self.unexpected(WHAT)),
            }
        }
        if free.is_empty() {
            return Ok(answers);
        }
        self.shared.make_dirs(&client, WHAT, &missing).await?;
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let records: Vec<Vec<u8>> = free.iter().map(|&i| encode_record(&chunk[i].1)).collect();
        let mut writer = client.new_multi_writer();
        for (&i, record) in free.iter().zip(&records) {
            let path = format!("{}/{}", dirs[i], self.prefix);
            writer.add_create(&path, record, &options).map_err(bad)?;
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        let created = self.shared.requests.call(WHAT, commit).await?;
        let mut paths = Vec::with_capacity(free.len());
        for result in created {
            match result {
                MultiWriteResult::Create { path, .. } => paths.push(path),
                _ => return Err(self.unexpected(WHAT)),
            }
        }
        // The creates' stats may be empty (ZOOKEEPER-4026): read the zxids back.
        let mut reader = client.new_multi_reader();
        for (&i, path) in free.iter().zip(&paths) {
            reader.add_get_children(&dirs[i]).map_err(bad)?;
            reader.add_get_data(path).map_err(bad)?;
        }
        let read = self.shared.requests.call(WHAT, reader.commit()).await?;
        let mut withdraw = client.new_multi_writer();
        let mut losers = 0;
        for ((&i, path), pair) in free.iter().zip(&paths).zip(read.chunks(2)) {
            let (MultiReadResult::Children { children }, MultiReadResult::Data { stat, .. }) =
                (&pair[0], &pair[1])
            else {
                return Err(self.unexpected(WHAT));
            };
            let name = path.rsplit('/').next().unwrap_or_default().to_string();
            let first = sorted_latches(children.clone()).into_iter().next();
            if first.as_deref() == Some(name.as_str()) {
                let election = &chunk[i].0;
                let node = Node::candidate(name, stat.czxid);
                self.set_node(election, Some(node.clone()));
                answers[i] = Some(self.granted(election, path, &node, None));
            } else {
                withdraw.add_delete(path, None).map_err(bad)?;
                losers += 1;
            }
        }
        if losers > 0 {
            let commit = async { withdraw.commit().await.map_err(ZkError::from) };
            self.shared.requests.call(WHAT, commit).await?;
        }
        Ok(answers)
    }

    /// The election directories of `chunk` and one multi-read (`try_campaign_many`) of
    /// what `add` asks of each, in order.
    async fn read_chunk(
        &self,
        client: &Client,
        chunk: &[(ElectionName, Candidate)],
        add: impl Fn(&mut MultiReader<'_>, &str) -> std::result::Result<(), ZkError>,
    ) -> Result<(Vec<String>, Vec<MultiReadResult>)> {
        let dirs: Vec<String> = chunk.iter().map(|(e, _)| election_dir(e)).collect();
        let mut reader = client.new_multi_reader();
        for dir in &dirs {
            add(&mut reader, dir).map_err(|e| crate::error::map("try_campaign_many", e))?;
        }
        let read = self
            .shared
            .requests
            .call("try_campaign_many", reader.commit())
            .await?;
        Ok((dirs, read))
    }

    /// An answer of ZooKeeper that does not fit the request `what`.
    fn unexpected(&self, what: &str) -> Error {
        TAG.own(
            ErrorKind::Backend,
            format!("{what}: an answer that does not fit the request"),
        )
    }

    /// Record the grant of `node` and guard it: a task waits for the node's exists watch
    /// (`watch`, or a new one) and reports the election lost if the node is deleted by
    /// anyone but this session (an operator, say). Returns the token.
    fn granted(
        &self,
        election: &ElectionName,
        path: &str,
        node: &Node,
        watch: Option<OwnWatch>,
    ) -> FencingToken {
        let token = revision_token(node.czxid);
        let task = tokio::spawn(guard_leader(
            self.guarded(election),
            path.to_string(),
            node.name.clone(),
            token,
            watch,
        ));
        self.guard(election, task);
        token
    }

    /// What a guard of `election` needs of this session.
    fn guarded(&self, election: &ElectionName) -> Guarded {
        Guarded {
            shared: self.shared.clone(),
            client: self.client.clone(),
            nodes: self.nodes.clone(),
            events: self.events.clone(),
            election: election.clone(),
        }
    }

    /// Keep `task` as the guard of `election`'s grant, stopping the one before.
    fn guard(&self, election: &ElectionName, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut guards) = self.guards.lock() {
            if let Some(old) = guards.insert(election.clone(), task) {
                old.abort();
            }
        }
    }

    /// Stop guarding `election`'s grant (before this session deletes its node).
    fn unguard(&self, election: &ElectionName) {
        if let Some(task) = self.guards.lock().ok().and_then(|mut g| g.remove(election)) {
            task.abort();
        }
    }

    async fn delete(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        node: &Node,
    ) -> Result<()> {
        self.unguard(election);
        let paths = node.paths(dir);
        let deleted = if let [path] = paths.as_slice() {
            self.shared
                .requests
                .call("resign", client.delete(path, None))
                .await
        } else {
            // The seat and the place in line go together: one transaction.
            let mut writer = client.new_multi_writer();
            for path in &paths {
                writer
                    .add_delete(path, None)
                    .map_err(|e| crate::error::map("resign", e))?;
            }
            let commit = async { writer.commit().await.map(drop).map_err(ZkError::from) };
            match self.shared.requests.call("resign", commit).await {
                // One of them is gone already (deleted by hand): delete the other alone.
                Err(e) if is_no_node(&e) => {
                    for path in &paths {
                        match self
                            .shared
                            .requests
                            .call("resign", client.delete(path, None))
                            .await
                        {
                            Err(e) if !is_no_node(&e) => return Err(e),
                            _ => {}
                        }
                    }
                    Ok(())
                }
                done => done,
            }
        };
        match deleted {
            Ok(()) => {}
            Err(e) if is_no_node(&e) => {}
            Err(e) => return Err(e),
        }
        self.set_node(election, None);
        Ok(())
    }

    /// Delete this session's nodes of a chunk of seats (at most [`BATCH`]) in one
    /// multi. A node already gone fails the whole multi, and then each is deleted on
    /// its own.
    async fn delete_many(&self, client: &Client, chunk: &[(&ElectionName, Node)]) -> Result<()> {
        const WHAT: &str = "resign_many";
        if let [(election, node)] = chunk {
            return self
                .delete(client, election, &election_dir(election), node)
                .await;
        }
        let mut writer = client.new_multi_writer();
        for (election, node) in chunk {
            self.unguard(election);
            for path in node.paths(&election_dir(election)) {
                writer
                    .add_delete(&path, None)
                    .map_err(|e| crate::error::map(WHAT, e))?;
            }
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        match self.shared.requests.call(WHAT, commit).await {
            Ok(_) => {
                for (election, _) in chunk {
                    self.set_node(election, None);
                }
            }
            Err(e) if is_no_node(&e) => {
                for (election, node) in chunk {
                    self.delete(client, election, &election_dir(election), node)
                        .await?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

#[async_trait]
impl BackendSession for ZkSession {
    fn id(&self) -> &str {
        &self.id
    }

    async fn keep_alive(&self) -> Result<()> {
        // In flight until answered, failed or dropped by the core's timeout.
        let _renewal = InFlight::start(&self.beat);
        // One write that checks nothing but that the root exists: it proves the server
        // still has the session and refreshes it, and, being a transaction, it is
        // answered only once the ensemble's leader has committed it with a quorum. A
        // read (the renewal before) was answered by whichever server the session is
        // on, and a follower cut off from its leader goes on answering reads for
        // syncLimit x tickTime (4 s at production timing) while the leader, no longer
        // hearing from the session, may expire it; a `sync` first would not do either,
        // as a leader cut off from its followers answers syncs at once until it gives
        // up, (syncLimit + 1) x tickTime. The write closes both windows; what is left
        // is the follower's report of the session's activity to the leader, at most a
        // ping (tickTime / 2) late, which check_timing holds within ttl - deadline.
        let client = self.client()?;
        let mut writer = client.new_multi_writer();
        writer
            .add_check_version("/", -1)
            .map_err(|e| crate::error::map("keep alive", e))?;
        let commit = async { writer.commit().await.map(drop).map_err(ZkError::from) };
        self.shared
            .requests
            .call_as(Purpose::Renewal, "keep alive", commit)
            .await
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        match self.run(election, candidate, CampaignMode::Wait).await? {
            Some(token) => Ok(token),
            None => Err(TAG.own(ErrorKind::Backend, "campaign ended without a grant")),
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        self.run(election, candidate, CampaignMode::TryOnce).await
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let mut answers = Vec::with_capacity(seats.len());
        for chunk in seats.chunks(BATCH) {
            answers.extend(self.try_chunk(chunk).await?);
        }
        Ok(answers)
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            // Nothing is held in a session that is gone.
            Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
            Err(e) => return Err(e),
        };
        let dir = election_dir(election);
        match (self.node(election), token) {
            (Some(node), Some(t)) if revision_token(node.czxid) != t => Ok(()),
            (Some(node), _) => self.delete(&client, election, &dir, &node).await,
            (None, Some(_)) => Ok(()),
            (None, None) => {
                // A campaign dropped while its create was in flight may have left a node.
                match self.find_own(&client, &dir).await? {
                    Some(node) => self.delete(&client, election, &dir, &node).await,
                    None => Ok(()),
                }
            }
        }
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut known = Vec::with_capacity(grants.len());
        for (election, token) in grants {
            match (self.node(election), token) {
                (Some(node), Some(t)) if revision_token(node.czxid) != *t => {}
                (Some(node), _) => known.push((election, node)),
                // Not known to hold it: the one-seat way looks for a stray node.
                (None, _) => self.resign(election, *token).await?,
            }
        }
        for chunk in known.chunks(BATCH) {
            self.delete_many(&client, chunk).await?;
        }
        Ok(())
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let client = self.client()?;
        let mut registrations = self.registrations.lock().await;
        let (shared, owner) = (&self.shared, self.owner);
        members::register(
            shared,
            &client,
            owner,
            &mut registrations,
            namespace,
            member,
        )
        .await
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            // Nothing is registered in a session that is gone.
            Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut registrations = self.registrations.lock().await;
        let (shared, owner) = (&self.shared, self.owner);
        members::unregister(shared, &client, owner, &mut registrations, namespace, id).await
    }

    /// Drop the connection without closing the session, as a crashed process would:
    /// zookeeper-client would otherwise go on pinging and keep the session alive. The
    /// server expires it after its timeout. (A campaign still waiting holds the
    /// connection until it ends.)
    fn abandon(&self) {
        tracing::debug!(session = %self.id, "abandoned: dropping the ZooKeeper connection");
        self.ended_by_owner
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.watchdog.abort();
        let client = self.client.lock().ok().and_then(|mut c| c.take());
        drop(client);
    }

    async fn close(&self) -> Result<()> {
        self.ended_by_owner
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let Some(client) = self.client.lock().ok().and_then(|mut c| c.take()) else {
            return Ok(());
        };
        if let Ok(mut guards) = self.guards.lock() {
            guards.drain().for_each(|(_, t)| t.abort());
        }
        // Delete the nodes first so waiters hear at once; closing the session would
        // delete them as well.
        let nodes: Vec<(ElectionName, Node)> = self
            .nodes
            .lock()
            .map(|mut n| n.drain().collect())
            .unwrap_or_default();
        if !client.state().is_terminated() {
            let deletes = nodes.iter().map(|(election, node)| {
                let paths = node.paths(&election_dir(election));
                let client = &client;
                async move {
                    let limit = self.shared.config.get_request_timeout();
                    if let [path] = paths.as_slice() {
                        let _ = tokio::time::timeout(limit, client.delete(path, None)).await;
                        return;
                    }
                    // The seat and the place in line together (priority layout), as in
                    // `resign`: the next waiter never finds the leaving one ahead of it.
                    let mut writer = client.new_multi_writer();
                    if paths.iter().all(|p| writer.add_delete(p, None).is_ok()) {
                        let _ = tokio::time::timeout(limit, writer.commit()).await;
                    }
                }
            });
            futures::future::join_all(deletes).await;
        }
        self.shared.unregister(&self.id);
        self.watchdog.abort();
        let info = client.session().clone();
        let ended = client.state().is_terminated();
        // The client is detached: dropping it only drops the connection.
        drop(client);
        if !ended {
            // End the session now rather than at its timeout; its nodes are gone already.
            let _ = close_session(&self.shared.config, info).await;
        }
        Ok(())
    }
}

/// Drops the client of a session whose renewals stopped (the core abandoned it, as in a
/// crash), so the server stops hearing from it and expires it after its timeout, as it
/// would for a dead process. zookeeper-client would otherwise keep pinging by itself.
async fn watchdog(
    client: Arc<Mutex<Option<Client>>>,
    beat: Arc<Mutex<Beat>>,
    ttl: Duration,
    id: String,
) {
    let step = (ttl / 40).max(Duration::from_millis(10));
    let limit = abandon_after(ttl);
    loop {
        tokio::time::sleep(step).await;
        let idle = match beat.lock() {
            Ok(b) if b.in_flight > 0 => continue,
            Ok(b) => b.idle_since.elapsed(),
            Err(_) => return,
        };
        if idle > limit {
            tracing::debug!(session = %id, ?idle, "no renewals asked for: leaving the ZooKeeper session to expire");
            let dropped = client.lock().ok().and_then(|mut c| c.take());
            drop(dropped);
            return;
        }
    }
}

/// What a task guarding a held election has of its session.
struct Guarded {
    shared: Arc<Shared>,
    client: Arc<Mutex<Option<Client>>>,
    nodes: Arc<Mutex<HashMap<ElectionName, Node>>>,
    events: SessionEvents,
    election: ElectionName,
}

impl Guarded {
    /// The session's client, `None` once the session ended.
    fn client(&self) -> Option<Client> {
        self.client
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|c| !c.state().is_terminated())
    }

    /// Run the guard's request `request`.
    async fn call<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, ZkError>>,
    ) -> Result<T> {
        self.shared.requests.call("guard", request).await
    }

    /// Could not watch `what` (failed with `e`): wait the retry delay of `attempt`,
    /// counting it.
    async fn back_off(&self, attempt: &mut u32, what: &str, e: &Error) {
        let delay = tenure_core::Retry::default().delay(*attempt);
        *attempt = attempt.saturating_add(1);
        let election = &self.election;
        tracing::debug!(%election, error = %e, ?delay, "could not watch {what}; retrying");
        tokio::time::sleep(delay).await;
    }

    /// Report the election lost: its `what` node at `path` was deleted by someone else.
    fn lost(&self, what: &str, path: &str, token: FencingToken) {
        let election = &self.election;
        tracing::warn!(%election, node = %path, token = token.0, "the {what} node was deleted by someone else");
        self.events.election_lost(
            election,
            token,
            &format!("the {what} node {path} was deleted by someone else"),
        );
    }
}

/// The event of `watch`, or never without one.
async fn changed(watch: Option<&mut OwnWatch>) -> WatchedEvent {
    match watch {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// The error of a waiting campaign whose session reached `state`, if it ended.
fn session_ended(state: SessionState) -> Result<()> {
    if !state.is_terminated() {
        return Ok(());
    }
    Err(match state {
        SessionState::AuthFailed => {
            TAG.own(ErrorKind::Unauthorized, "ZooKeeper authentication failed")
        }
        _ => TAG.own(ErrorKind::SessionExpired, "ZooKeeper session ended"),
    })
}

/// Guards a held election: waits for the exists watch on the leading node and, if the
/// node is deleted while this session still counts it as its own (not by `resign` or
/// `close`, which stop this task first), reports the election lost. Re-arms after other
/// node events; ends on session events (expiry is reported by the session's state task).
/// Holds no client between requests, so an abandoned session's connection still drops.
async fn guard_leader(
    g: Guarded,
    path: String,
    name: String,
    token: FencingToken,
    mut watch: Option<OwnWatch>,
) {
    let mut attempt = 0u32;
    loop {
        let deleted = match watch.take() {
            Some(w) => match w.await.event_type {
                EventType::NodeDeleted => true,
                EventType::Session => return,
                _ => continue,
            },
            None => {
                let Some(c) = g.client() else {
                    return;
                };
                let armed = g.call(c.check_and_watch_stat(&path)).await;
                drop(c);
                match armed {
                    Ok((Some(_), w)) => {
                        attempt = 0;
                        watch = Some(Box::pin(w.changed()));
                        continue;
                    }
                    Ok((None, _)) => true,
                    Err(e) => {
                        g.back_off(&mut attempt, "the leading node", &e).await;
                        continue;
                    }
                }
            }
        };
        if !deleted {
            continue;
        }
        let ours = g
            .nodes
            .lock()
            .map(|mut n| {
                let ours = n.get(&g.election).is_some_and(|node| node.name == name);
                if ours {
                    n.remove(&g.election);
                }
                ours
            })
            .unwrap_or(false);
        if ours {
            g.lost("leading", &path, token);
        }
        return;
    }
}

/// Why clause 14 is declared with the Curator layout: the core names it when it
/// refuses a priority or a handover.
pub(crate) const CURATOR_NO_PRIORITY: &str = "with layout=curator the election is shared \
    with Curator's LeaderLatch, which has no priorities (the default layout, \
    layout=priority, keeps them)";

/// The `InvalidArgument` error for an election the default layout writes (its node
/// holds data): the layouts must never share an election (each would elect its own
/// leader).
fn mixed_layouts(election: &ElectionName) -> Error {
    TAG.own(
        ErrorKind::InvalidArgument,
        format!(
            "election {election}: holds tenure's default-layout records, but this backend \
             uses layout=curator; candidates of both layouts must not share an election \
             (connect with layout=priority to join them)"
        ),
    )
}

/// The Curator layout's refusal of a `candidate` with a priority.
fn curator_accepts(candidate: &Candidate) -> Result<()> {
    if candidate.priority() == 0 {
        return Ok(());
    }
    Err(curator_refuses(&format!(
        "candidate {:?}: priority {}",
        candidate.id(),
        candidate.priority()
    )))
}

/// The `Unsupported` error of the Curator layout for `what` (a priority, a handover),
/// where the backend is asked directly rather than through the core.
pub(crate) fn curator_refuses(what: &str) -> Error {
    TAG.own(
        ErrorKind::Unsupported,
        format!("{what} is not supported: {CURATOR_NO_PRIORITY}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curator_refusals_name_the_layout() {
        let e = curator_refuses("handover");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.message().contains("layout=curator"), "{e}");
        assert!(e.message().contains("handover"), "{e}");
        let e = mixed_layouts(&ElectionName::new("a/b").unwrap());
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("a/b") && e.message().contains("layout=priority"),
            "{e}"
        );
    }
}
