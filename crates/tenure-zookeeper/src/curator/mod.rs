//! The Curator layout (`layout=curator`): one tenure session = one ZooKeeper session;
//! candidacies as ephemeral sequential nodes, as Curator's `LeaderLatch` makes them.

mod batch;
mod campaign;
mod guard;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_core::backend::{revision_token, BackendSession, CampaignMode, Purpose, SessionEvents};
use tenure_core::{Candidate, ElectionName, Error, ErrorKind, FencingToken, Member, Result};
use zookeeper_client::{Client, Error as ZkError, SessionState};

use crate::error::TAG;
use crate::members;
use crate::nodes::{election_dir, protected_prefix, random_uuid};
use crate::shared::{close_session, open_session, Shared};

/// A candidacy's node once created.
#[derive(Clone, Debug)]
struct Node {
    /// Name under the election's directory.
    name: String,
    /// The fencing token's zxid: the candidate node's creation zxid.
    czxid: i64,
}

impl Node {
    /// The node's path in the election directory `dir`.
    fn path(&self, dir: &str) -> String {
        format!("{dir}/{}", self.name)
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
    members: members::Registrar,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .finish()
    }
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
        let client = open_session(&shared.config, ttl).await?;
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
            members: members::Registrar::new(owner),
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

    /// The client, `None` once the session expired (a call with nothing to undo).
    fn live(&self) -> Result<Option<Client>> {
        match self.client() {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == ErrorKind::SessionExpired => Ok(None),
            Err(e) => Err(e),
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

    /// An answer of ZooKeeper that does not fit the request `what`.
    fn unexpected(&self, what: &str) -> Error {
        TAG.own(
            ErrorKind::Backend,
            format!("{what}: an answer that does not fit the request"),
        )
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
        // Nothing is held in a session that is gone.
        let Some(client) = self.live()? else {
            return Ok(());
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
        let Some(client) = self.live()? else {
            return Ok(());
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
        let shared = &self.shared;
        self.members
            .register(shared, &client, namespace, member)
            .await
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        // Nothing is registered in a session that is gone.
        let Some(client) = self.live()? else {
            return Ok(());
        };
        let shared = &self.shared;
        self.members
            .unregister(shared, &client, namespace, id)
            .await
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
            let limit = self.shared.config.get_request_timeout();
            let deletes = nodes.iter().map(|(election, node)| {
                let path = node.path(&election_dir(election));
                let client = &client;
                async move { tokio::time::timeout(limit, client.delete(&path, None)).await }
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

/// Why clause 14 is declared with the Curator layout: the core names it when it
/// refuses a priority or a handover.
pub(crate) const CURATOR_NO_PRIORITY: &str = "with layout=curator the election is shared \
    with Curator's LeaderLatch, which has no priorities (the default layout, \
    layout=priority, keeps them)";

/// The Curator layout's refusal of a `candidate` with a priority.
pub(super) fn curator_accepts(candidate: &Candidate) -> Result<()> {
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
        let e = campaign::mixed_layouts(&ElectionName::new("a/b").unwrap());
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("a/b") && e.message().contains("layout=priority"),
            "{e}"
        );
    }
}
