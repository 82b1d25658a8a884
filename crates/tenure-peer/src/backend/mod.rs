//! The `peer://` backend: tenure's election traits on a cluster of peer
//! nodes, without a store.

mod config;
mod engine;
mod state;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::CampaignMode;
use tenure_core::backend::{BackendSession, Capabilities, Clause, SessionEvents};
use tenure_core::{
    Backend, Candidate, ElectionName, Error, ErrorKind, FencingToken, LeaderInfo, LeaderStream,
    Result, Timing,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use config::{PeerAlgorithm, PeerConfig, PEER_SCHEME};
use engine::{Command, Engine, HandoverAnswer};

use crate::transport::{Transport, TransportStats};
use crate::types::PeerId;

/// A node of a `peer://` cluster, implementing tenure's [`Backend`].
///
/// One process (one `PeerBackend`) is one node. Every election name gets its
/// own quorum-guarded state machine on every node, created on first use and
/// sharing the node's TCP transport. A node is a candidate in an election
/// while one of its sessions campaigns for it or holds it; the seat is held
/// by the node the algorithm elects *and* a majority of the whole membership
/// acknowledges, and within that node by its best waiting session
/// (priority, then arrival); the fencing token is the quorum epoch. A node
/// with waiters stands back while another node announces a higher priority
/// (contract clause 14). See the crate docs for the semantics
/// and the contract table.
///
/// Clones share the node; it stops when the last clone is dropped (or on
/// [`shutdown`](Self::shutdown)), as if the process had crashed: nothing is
/// released, the others fail over.
#[derive(Clone)]
pub struct PeerBackend {
    inner: Arc<Inner>,
}

struct Inner {
    id: PeerId,
    config: PeerConfig,
    commands: mpsc::UnboundedSender<Command>,
    transport: Arc<Transport>,
    stop: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl fmt::Debug for PeerBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerBackend")
            .field("id", &self.inner.id)
            .field("listen", &self.inner.transport.local_addr())
            .field("algorithm", &self.inner.config.algorithm)
            .finish()
    }
}

fn stopped() -> Error {
    Error::new(ErrorKind::Unavailable, "this peer node has stopped").with_backend(PEER_SCHEME)
}

impl PeerBackend {
    /// Parses `url` ([`PeerConfig::from_url`]) and starts the node.
    pub async fn connect(url: &str) -> Result<PeerBackend> {
        PeerBackend::start(PeerConfig::from_url(url)?).await
    }

    /// Starts a node: binds its listen address and begins taking part in
    /// elections (as a voter, until a session campaigns). Must be called
    /// inside a Tokio runtime. A listen address in use is `Unavailable`.
    pub async fn start(config: PeerConfig) -> Result<PeerBackend> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                // The cause once, the address as the endpoint (tenure_core::Error's rule).
                Error::new(
                    ErrorKind::Unavailable,
                    format!("node {}: listen", config.id),
                )
                .with_source(e)
                .with_backend(PEER_SCHEME)
                .with_endpoint(config.listen.to_string())
            })?;
        PeerBackend::with_listener(config, listener)
    }

    /// Like [`start`](Self::start) with a listener bound already (tests bind
    /// port 0 for every node first, then build the member list).
    pub fn with_listener(
        config: PeerConfig,
        listener: tokio::net::TcpListener,
    ) -> Result<PeerBackend> {
        config.validate()?;
        let machine_config = config.machine_config()?;
        let state = match &config.state {
            Some(path) => Some(state::StateFile::open(path).map_err(|why| {
                Error::invalid(format!("peer config: state: {why}")).with_backend(PEER_SCHEME)
            })?),
            None => None,
        };
        let listen = listener
            .local_addr()
            .map_or_else(|_| config.listen.to_string(), |a| a.to_string());
        let (transport, events) = Transport::with_listener(
            config.id,
            listener,
            &config.members,
            config.transport.clone(),
        )
        .map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("node {}: start the transport", config.id),
            )
            .with_source(e)
            .with_backend(PEER_SCHEME)
            .with_endpoint(listen)
        })?;
        let transport = Arc::new(transport);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let engine = Engine::new(config.clone(), machine_config, transport.clone(), state);
        tokio::spawn(engine.run(commands_rx, events, stop.clone()));
        Ok(PeerBackend {
            inner: Arc::new(Inner {
                id: config.id,
                config,
                commands,
                transport,
                stop,
            }),
        })
    }

    /// This node's id.
    pub fn id(&self) -> PeerId {
        self.inner.id
    }

    /// The address this node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.transport.local_addr()
    }

    /// The configuration this node runs with.
    pub fn config(&self) -> &PeerConfig {
        &self.inner.config
    }

    /// The transport's counters (frames, malformed frames by cause, …).
    pub fn transport_stats(&self) -> TransportStats {
        self.inner.transport.stats()
    }

    /// A fault for tests: drop every frame in and out (a blackholing
    /// partition) until called with `false`.
    pub fn set_isolated(&self, isolated: bool) {
        self.inner.transport.set_isolated(isolated);
    }

    /// A fault for tests: expire the session with id `session` (as
    /// [`Session::id`](tenure_core::Session::id) shows it) now. False if
    /// there is no such session on this node.
    pub async fn expire_session(&self, session: &str) -> bool {
        let Some(n) = self.session_number(session) else {
            return false;
        };
        self.ask(|reply| Command::Expire { session: n, reply })
            .await
            .unwrap_or(false)
    }

    /// Stops the node as a crash would: nothing is released; the other nodes
    /// fail over once the quorum lease runs out.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
    }

    fn session_number(&self, session: &str) -> Option<u64> {
        let prefix = format!("peer-{}-", self.inner.id);
        session.strip_prefix(&prefix)?.parse().ok()
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        ask(&self.inner.commands, make).await
    }
}

async fn ask<T>(
    commands: &mpsc::UnboundedSender<Command>,
    make: impl FnOnce(oneshot::Sender<T>) -> Command,
) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    commands.send(make(tx)).map_err(|_| stopped())?;
    rx.await.map_err(|_| stopped())
}

const CRASH_FAILOVER: &str = "a crashed *session* on a live node is replaced within its TTL, but a crashed or cut-off *node* is replaced only once its quorum lease (the URL's `lease`, at least the TTL) has run out and the failure detector (`leader_timeout`) has noticed";
const MEMBERSHIP: &str = "there is no store to keep a namespace's member list in, and the peer cluster's own membership is the static list in the URL; the shard manager needs a store backend";
const NO_HERD: &str = "there is no store to count requests in: waiters on one node queue locally and only the first campaigns; across nodes, the election algorithm's own messages decide (see the algorithm table)";

#[async_trait]
impl Backend for PeerBackend {
    fn scheme(&self) -> &'static str {
        PEER_SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::full()
            .prioritized()
            .resigning_locally()
            .except(Clause::CrashFailover, CRASH_FAILOVER)
            .except(Clause::NoHerd, NO_HERD)
            .except(Clause::Membership, MEMBERSHIP)
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        let lease = self.inner.config.timing.lease;
        if timing.ttl > lease {
            return Err(Error::invalid(format!(
                "ttl: {:?} exceeds the quorum lease {lease:?} of this peer:// cluster; use a TTL of at most the lease (or a longer lease= in the URL)",
                timing.ttl
            ))
            .with_backend(PEER_SCHEME));
        }
        Ok(())
    }

    async fn open_session(
        &self,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Arc<dyn BackendSession>> {
        let n = self
            .ask(|reply| Command::OpenSession { ttl, events, reply })
            .await?;
        Ok(Arc::new(PeerSession {
            id: format!("peer-{}-{n}", self.inner.id),
            n,
            commands: self.inner.commands.clone(),
            transport: self.inner.transport.clone(),
        }))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        let election = election.clone();
        self.ask(|reply| Command::Leader { election, reply }).await
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        let election = election.clone();
        let rx = self
            .ask(|reply| Command::Observe { election, reply })
            .await??;
        Ok(tenure_core::backend::watch_stream(rx, Ok))
    }

    /// Contract clause 14. This node asks every member who holds the seat
    /// and where the waiter `to` (or any waiter) waits, waiting for their
    /// answers at most twice the `answer_timeout`; then it tells every
    /// member: the holder's node tells its session (preempted), the other
    /// nodes defer to the node of `to` (or of the best waiter) until it takes
    /// the seat, and that node grants `to` (or its best waiter) first.
    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        let (tx, mut answers) = mpsc::unbounded_channel();
        let asked = {
            let (election, to) = (election.clone(), to.map(str::to_owned));
            self.ask(|reply| Command::HandoverAsk {
                election,
                to,
                answers: tx,
                reply,
            })
            .await?
        };
        // The node forgets the question when this call ends, however it ends.
        let _done = HandoverDone {
            commands: self.inner.commands.clone(),
            request: asked.request,
        };
        let mut heard = vec![(self.inner.id, asked.local)];
        let window = self.inner.config.timing.answer_timeout * 2;
        let _ = tokio::time::timeout(window, async {
            while heard.len() <= asked.asked {
                match answers.recv().await {
                    Some(answer) => heard.push(answer),
                    None => break,
                }
            }
        })
        .await;
        let holder_known = heard.iter().any(|(_, a)| a.holder.is_some());
        let silent = asked
            .leader
            .filter(|l| !heard.iter().any(|(node, _)| node == l));
        if let (false, Some(leader)) = (holder_known, silent) {
            // This node follows a leader that did not answer: it may hold
            // the seat still, so "nobody leads" would be a guess.
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("election {election}: node {leader} leads it but did not answer within {window:?}"),
            )
            .with_backend(PEER_SCHEME));
        }
        let (epoch, node) = choose_handover(election, to, &heard)?;
        let info = heard
            .iter()
            .filter_map(|(_, a)| a.holder.as_ref())
            .find(|h| h.epoch == epoch)
            .map(|h| LeaderInfo {
                id: h.holder.clone(),
                value: h.value.clone(),
                token: FencingToken(h.epoch),
            })
            .ok_or_else(|| Error::invalid(format!("election {election}: nobody leads it")))?;
        let (election, to) = (election.clone(), to.map(str::to_owned));
        self.ask(|reply| Command::Handover {
            election,
            epoch,
            node,
            to,
            reply,
        })
        .await?;
        Ok(info)
    }
}

/// Tells the node, when dropped, that the answers to `request` are no longer
/// wanted.
struct HandoverDone {
    commands: mpsc::UnboundedSender<Command>,
    request: u64,
}

impl Drop for HandoverDone {
    fn drop(&mut self) {
        let request = self.request;
        let _ = self.commands.send(Command::HandoverDone { request });
    }
}

/// From the answers to a handover question: the grant to end (the highest
/// epoch held) and the node the seat is to go to: where `to` (or, without
/// `to`, the best waiter) waits with the highest priority, ties to the
/// highest node id.
/// Nobody leading, nobody waiting, or no waiter `to`: `InvalidArgument`.
pub(crate) fn choose_handover(
    election: &ElectionName,
    to: Option<&str>,
    heard: &[(PeerId, HandoverAnswer)],
) -> Result<(u64, Option<PeerId>)> {
    let invalid = |why: String| Error::invalid(why).with_backend(PEER_SCHEME);
    let Some((epoch, holder)) = heard
        .iter()
        .filter_map(|(_, a)| a.holder.as_ref())
        .map(|h| (h.epoch, &h.holder))
        .max_by_key(|(epoch, _)| *epoch)
    else {
        return Err(invalid(format!(
            "election {election}: nobody leads it, nothing to hand over"
        )));
    };
    let waiter = heard
        .iter()
        .filter_map(|(node, a)| a.waiter.map(|p| (p, *node)))
        .max();
    match (to, waiter) {
        (Some(id), None) => Err(invalid(format!(
            "election {election}: no candidate {id:?} waits for it"
        ))),
        (None, None) => Err(invalid(format!(
            "election {election}: nobody waits for it, {holder:?} keeps it"
        ))),
        (_, Some((_, node))) => Ok((epoch, Some(node))),
    }
}

/// A session on one node: local to it, kept alive by the core's renewals,
/// expired by the node when renewals stop for a TTL.
struct PeerSession {
    id: String,
    n: u64,
    commands: mpsc::UnboundedSender<Command>,
    transport: Arc<Transport>,
}

/// How long a resign or close waits for its release to leave the node.
const FLUSH_LIMIT: Duration = Duration::from_millis(250);

impl PeerSession {
    /// Lets what a resign or close sent (the release that hands the seat
    /// over) leave before the caller goes on, as a process about to exit
    /// would need.
    async fn flush(&self) {
        let _ = tokio::time::timeout(FLUSH_LIMIT, self.transport.flush()).await;
    }
}

impl fmt::Debug for PeerSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerSession").field("id", &self.id).finish()
    }
}

#[async_trait]
impl BackendSession for PeerSession {
    fn id(&self) -> &str {
        &self.id
    }

    async fn keep_alive(&self) -> Result<()> {
        let session = self.n;
        ask(&self.commands, |reply| Command::KeepAlive {
            session,
            reply,
        })
        .await?
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let (session, election, candidate) = (self.n, election.clone(), candidate.clone());
        let granted = ask(&self.commands, |reply| Command::Campaign {
            session,
            election,
            candidate,
            mode: CampaignMode::Wait,
            reply,
        })
        .await??;
        granted.ok_or_else(|| {
            Error::new(ErrorKind::Backend, "campaign ended without a grant")
                .with_backend(PEER_SCHEME)
        })
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let (session, election, candidate) = (self.n, election.clone(), candidate.clone());
        ask(&self.commands, |reply| Command::Campaign {
            session,
            election,
            candidate,
            mode: CampaignMode::TryOnce,
            reply,
        })
        .await?
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let (session, election) = (self.n, election.clone());
        ask(&self.commands, |reply| Command::Resign {
            session,
            election,
            token,
            reply,
        })
        .await?;
        self.flush().await;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let session = self.n;
        // A stopped node has nothing left to release.
        if ask(&self.commands, |reply| Command::Close { session, reply })
            .await
            .is_ok()
        {
            self.flush().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Holding;

    fn holder(epoch: u64, id: &str) -> HandoverAnswer {
        HandoverAnswer {
            holder: Some(Holding {
                epoch,
                holder: id.to_owned(),
                value: String::new(),
            }),
            waiter: None,
        }
    }

    fn waiter(priority: i16) -> HandoverAnswer {
        HandoverAnswer {
            holder: None,
            waiter: Some(priority),
        }
    }

    #[test]
    fn a_handover_goes_to_the_node_of_the_waiter_named() {
        let e = ElectionName::new("e").unwrap();
        let heard = [
            (PeerId(1), HandoverAnswer::default()),
            (PeerId(2), holder(7, "x")),
            (PeerId(3), waiter(-4)),
        ];
        assert_eq!(
            choose_handover(&e, Some("c"), &heard).unwrap(),
            (7, Some(PeerId(3)))
        );
        // Without a name: the node of the best waiter.
        assert_eq!(
            choose_handover(&e, None, &heard).unwrap(),
            (7, Some(PeerId(3)))
        );
        // The same id on two nodes: the higher priority, then the higher id.
        let two = [
            (PeerId(1), waiter(2)),
            (PeerId(2), waiter(5)),
            (PeerId(3), holder(9, "x")),
            (PeerId(4), waiter(5)),
        ];
        assert_eq!(
            choose_handover(&e, Some("c"), &two).unwrap(),
            (9, Some(PeerId(4)))
        );
        // A stale holder (a lower epoch) is not the one asked.
        let stale = [
            (PeerId(1), holder(3, "old")),
            (PeerId(2), holder(4, "new")),
            (PeerId(3), waiter(0)),
        ];
        assert_eq!(choose_handover(&e, None, &stale).unwrap().0, 4);
    }

    #[test]
    fn a_handover_without_leader_or_waiter_is_refused() {
        let e = ElectionName::new("e").unwrap();
        let nobody = [
            (PeerId(1), waiter(1)),
            (PeerId(2), HandoverAnswer::default()),
        ];
        let alone = [
            (PeerId(1), holder(2, "x")),
            (PeerId(2), HandoverAnswer::default()),
        ];
        for (to, heard) in [
            (Some("c"), &nobody[..]),
            (None, &alone[..]),
            (Some("c"), &alone[..]),
        ] {
            let err = choose_handover(&e, to, heard).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            assert!(err.to_string().contains("election e"), "{err}");
        }
    }
}
