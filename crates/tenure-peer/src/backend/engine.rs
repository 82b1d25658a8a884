//! The task that owns a node's state: one quorum-guarded machine per
//! election, the local sessions and their waiters, the transport.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::CampaignMode;
use tenure_core::backend::SessionEvents;
use tenure_core::{Candidate, ElectionName, Error, ErrorKind, FencingToken, LeaderInfo, Result};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;

use super::config::{PeerConfig, PEER_SCHEME};
use super::state::StateFile;
use crate::config::Config;
use crate::heartbeat::Heartbeat;
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::node::{sleep_until, Clock};
use crate::quorum::QuorumGuard;
use crate::transport::{Transport, TransportEvent};
use crate::types::{Instant, PeerId};
use crate::wire::{Envelope, Holding};

/// The most elections one node keeps state for. Each costs a few hundred
/// bytes and must be kept (its promise is what makes epochs unique).
pub(crate) const MAX_ELECTIONS: usize = 100_000;

/// The share of a session's TTL a grant or renewal must be covered by the
/// quorum lease (the core's renew deadline is at most this share of the TTL).
const COVERED_SHARE: f64 = 1.0 - tenure_core::CLOCK_DRIFT_MARGIN;

type Machine = QuorumGuard<Heartbeat<Box<dyn ElectionAlgorithm + Send>>>;

pub(crate) type CampaignReply = oneshot::Sender<Result<Option<FencingToken>>>;

pub(crate) enum Command {
    OpenSession {
        ttl: Duration,
        events: SessionEvents,
        reply: oneshot::Sender<u64>,
    },
    KeepAlive {
        session: u64,
        reply: oneshot::Sender<Result<()>>,
    },
    Campaign {
        session: u64,
        election: ElectionName,
        candidate: Candidate,
        mode: CampaignMode,
        reply: CampaignReply,
    },
    Resign {
        session: u64,
        election: ElectionName,
        token: Option<FencingToken>,
        reply: oneshot::Sender<()>,
    },
    Close {
        session: u64,
        reply: oneshot::Sender<()>,
    },
    Leader {
        election: ElectionName,
        reply: oneshot::Sender<Option<LeaderInfo>>,
    },
    Observe {
        election: ElectionName,
        reply: oneshot::Sender<Result<watch::Receiver<Option<LeaderInfo>>>>,
    },
    Expire {
        session: u64,
        reply: oneshot::Sender<bool>,
    },
    /// Contract clause 14: ask every member about `election` for a handover
    /// (see [`HandoverAnswer`]); answers arrive on `answers`.
    HandoverAsk {
        election: ElectionName,
        to: Option<String>,
        answers: mpsc::UnboundedSender<(PeerId, HandoverAnswer)>,
        reply: oneshot::Sender<HandoverAsked>,
    },
    /// The answers of `request` are no longer wanted.
    HandoverDone { request: u64 },
    /// Contract clause 14: tell every member (this node included) that the
    /// holder of `epoch` is to step down, for `to` on `node` if named.
    Handover {
        election: ElectionName,
        epoch: u64,
        node: Option<PeerId>,
        to: Option<String>,
        reply: oneshot::Sender<()>,
    },
}

/// What a node says about an election when a handover is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HandoverAnswer {
    /// The local holder: epoch, candidate id and value.
    pub(crate) holder: Option<Holding>,
    /// The priority of the waiter asked for (or of the best waiter), if it
    /// waits on this node.
    pub(crate) waiter: Option<i16>,
}

/// The request number of a handover question, this node's own answer, and
/// how many other members were asked.
pub(crate) struct HandoverAsked {
    pub(crate) request: u64,
    pub(crate) local: HandoverAnswer,
    pub(crate) asked: usize,
    /// The other node this node follows as leader of the election, if any.
    pub(crate) leader: Option<PeerId>,
}

/// A handover that was asked for and has not been used up yet.
struct PendingHandover {
    /// The grant it ends.
    epoch: u64,
    /// The node the next grant goes to, if named.
    node: Option<PeerId>,
    /// The waiter on `node` the next grant goes to, if named.
    to: Option<String>,
    /// When this node learnt of it.
    since: Instant,
    /// When it lapses if nobody took the seat meanwhile.
    until: TokioInstant,
}

/// Tells every other member that the grant `epoch` of `name` is to go to
/// `node` (and `to` there). The holder's node sends it before its release,
/// on the same connections, so every node defers before it can campaign.
fn broadcast_handover(
    transport: &Transport,
    members: impl Iterator<Item = PeerId>,
    name: &ElectionName,
    epoch: u64,
    node: Option<PeerId>,
    to: Option<&str>,
) {
    for peer in members {
        let order = Envelope::Handover {
            channel: name.as_str().to_owned(),
            epoch,
            node,
            to: to.map(str::to_owned),
        };
        let _ = transport.send(peer, order);
    }
}

/// A candidate's priority as the wire carries it (the core keeps it within
/// −1000..=1000).
pub(crate) fn wire_priority(c: &Candidate) -> i16 {
    let p = c.priority().clamp(i32::from(i16::MIN), i32::from(i16::MAX));
    i16::try_from(p).unwrap_or_default()
}

/// Where a waiter of priority `priority` goes in a queue ordered by
/// priority, then arrival: behind every waiter of its priority or higher.
fn queue_position<'a>(priorities: impl Iterator<Item = &'a Candidate>, priority: i16) -> usize {
    let mut at = 0;
    for c in priorities {
        if wire_priority(c) < priority {
            break;
        }
        at += 1;
    }
    at
}

struct Waiter {
    session: u64,
    candidate: Candidate,
    reply: CampaignReply,
    /// For `try_campaign`: answer "not now" at this time.
    give_up_at: Option<TokioInstant>,
}

struct Holder {
    session: u64,
    candidate: Candidate,
    token: u64,
    /// Whether its session was told it is preempted (once per grant).
    preempted: bool,
    /// The lowest priority other nodes announced waiting since the grant:
    /// a rise above it (and above the holder's) is a candidate joining
    /// there, which preempts.
    rival_floor: Option<i16>,
}

struct RemoteSeat {
    leader: PeerId,
    epoch: u64,
    holder: String,
    value: String,
}

struct Seat {
    machine: Machine,
    waiters: VecDeque<Waiter>,
    holder: Option<Holder>,
    /// The epoch last handed to a local holder; never handed out twice.
    granted: Option<u64>,
    remote: Option<RemoteSeat>,
    watch: watch::Sender<Option<LeaderInfo>>,
    hold_off_until: Option<TokioInstant>,
    handover: Option<PendingHandover>,
}

impl Seat {
    /// The best priority among the waiting (not trying) sessions.
    fn interest(&self) -> Option<i16> {
        self.waiters
            .iter()
            .filter(|w| w.give_up_at.is_none())
            .map(|w| wire_priority(&w.candidate))
            .max()
    }

    /// What this node answers to a handover question about the seat.
    fn handover_answer(&self, to: Option<&str>) -> HandoverAnswer {
        let waiting = self.waiters.iter().filter(|w| {
            w.give_up_at.is_none()
                && !w.reply.is_closed()
                && to.is_none_or(|id| w.candidate.id() == id)
        });
        HandoverAnswer {
            holder: self.holder.as_ref().map(holding),
            waiter: waiting.map(|w| wire_priority(&w.candidate)).max(),
        }
    }
}

struct SessionEntry {
    ttl: Duration,
    events: SessionEvents,
    expires_at: TokioInstant,
    held: BTreeSet<ElectionName>,
    keepalives: Vec<(TokioInstant, oneshot::Sender<Result<()>>)>,
}

pub(crate) struct Engine {
    config: PeerConfig,
    machine_config: Config,
    clock: Clock,
    process_start: Instant,
    transport: Arc<Transport>,
    seats: HashMap<ElectionName, Seat>,
    wakeups: BTreeSet<(TokioInstant, ElectionName)>,
    wake_of: HashMap<ElectionName, TokioInstant>,
    sessions: HashMap<u64, SessionEntry>,
    next_session: u64,
    state: Option<StateFile>,
    /// Handover questions this node asked, by request number.
    handover_requests: HashMap<u64, mpsc::UnboundedSender<(PeerId, HandoverAnswer)>>,
    next_request: u64,
}

fn expired_error() -> Error {
    Error::new(
        ErrorKind::SessionExpired,
        "session is not known to this node",
    )
    .with_backend(PEER_SCHEME)
}

impl Engine {
    pub(crate) fn new(
        config: PeerConfig,
        machine_config: Config,
        transport: Arc<Transport>,
        state: Option<StateFile>,
    ) -> Self {
        let clock = Clock::new();
        let process_start = clock.now();
        Engine {
            config,
            machine_config,
            clock,
            process_start,
            transport,
            seats: HashMap::new(),
            wakeups: BTreeSet::new(),
            wake_of: HashMap::new(),
            sessions: HashMap::new(),
            next_session: 0,
            state,
            handover_requests: HashMap::new(),
            next_request: 0,
        }
    }

    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: mpsc::Receiver<TransportEvent>,
        stop: CancellationToken,
    ) {
        loop {
            let next_seat = self.wakeups.first().map(|(t, _)| *t);
            let next_session = self.sessions.values().map(|s| s.expires_at).min();
            let wake = match (next_seat, next_session) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => return,
                },
                ev = events.recv() => match ev {
                    Some(ev) => self.transport_event(ev),
                    None => return,
                },
                _ = sleep_until(wake) => self.wake(),
                _ = stop.cancelled() => return,
            }
        }
    }

    fn me(&self) -> PeerId {
        self.config.id
    }

    fn new_machine(&self, name: &ElectionName, now: Instant) -> Machine {
        let config = self.machine_config.clone();
        let algorithm = self
            .config
            .algorithm
            .machine(config, &self.config.candidates);
        let mut machine = QuorumGuard::new(Heartbeat::new(algorithm))
            .standing_by()
            .with_sticky_leadership()
            .with_process_start(self.process_start);
        if let Some(saved) = self.state.as_ref().and_then(|s| s.get(name)) {
            machine.restore(saved);
        }
        machine.start(now);
        machine
    }

    /// The seat of `name`, created (standing by) on first use; `None` past
    /// [`MAX_ELECTIONS`].
    fn ensure_seat(&mut self, name: &ElectionName) -> bool {
        if self.seats.contains_key(name) {
            return true;
        }
        if self.seats.len() >= MAX_ELECTIONS {
            tracing::warn!(election = %name, "too many elections on this node; ignored");
            return false;
        }
        let machine = self.new_machine(name, self.clock.now());
        self.seats.insert(
            name.clone(),
            Seat {
                machine,
                waiters: VecDeque::new(),
                holder: None,
                granted: None,
                remote: None,
                watch: watch::Sender::new(None),
                hold_off_until: None,
                handover: None,
            },
        );
        true
    }

    fn too_many() -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!("this node already keeps {MAX_ELECTIONS} elections"),
        )
        .with_backend(PEER_SCHEME)
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::OpenSession { ttl, events, reply } => {
                self.next_session += 1;
                let n = self.next_session;
                self.sessions.insert(
                    n,
                    SessionEntry {
                        ttl,
                        events,
                        expires_at: TokioInstant::now() + ttl,
                        held: BTreeSet::new(),
                        keepalives: Vec::new(),
                    },
                );
                let _ = reply.send(n);
            }
            Command::KeepAlive { session, reply } => self.keep_alive(session, reply),
            Command::Campaign {
                session,
                election,
                candidate,
                mode,
                reply,
            } => self.campaign(session, election, candidate, mode, reply),
            Command::Resign {
                session,
                election,
                token,
                reply,
            } => {
                self.resign(session, &election, token);
                let _ = reply.send(());
            }
            Command::Close { session, reply } => {
                self.end_session(session, None);
                let _ = reply.send(());
            }
            Command::Leader { election, reply } => {
                let info = self.seats.get(&election).and_then(|s| self.info(s));
                let _ = reply.send(info);
            }
            Command::Observe { election, reply } => {
                let rx = if self.ensure_seat(&election) {
                    self.publish(&election);
                    self.seats
                        .get(&election)
                        .map(|s| s.watch.subscribe())
                        .ok_or_else(Engine::too_many)
                } else {
                    Err(Engine::too_many())
                };
                let _ = reply.send(rx);
            }
            Command::Expire { session, reply } => {
                let known = self.sessions.contains_key(&session);
                self.end_session(session, Some("expired by a test hook"));
                let _ = reply.send(known);
            }
            Command::HandoverAsk {
                election,
                to,
                answers,
                reply,
            } => {
                self.next_request += 1;
                let request = self.next_request;
                let local = self
                    .seats
                    .get(&election)
                    .map(|s| s.handover_answer(to.as_deref()))
                    .unwrap_or_default();
                let me = self.me();
                let mut asked = 0;
                for peer in self.config.members.keys().filter(|p| **p != me) {
                    let ask = Envelope::HandoverAsk {
                        channel: election.as_str().to_owned(),
                        request,
                        to: to.clone(),
                    };
                    if self.transport.send(*peer, ask).is_ok() {
                        asked += 1;
                    }
                }
                self.handover_requests.insert(request, answers);
                let leader = self
                    .seats
                    .get(&election)
                    .and_then(|s| s.machine.leader())
                    .map(|l| l.id)
                    .filter(|id| *id != me);
                let _ = reply.send(HandoverAsked {
                    request,
                    local,
                    asked,
                    leader,
                });
            }
            Command::HandoverDone { request } => {
                self.handover_requests.remove(&request);
            }
            Command::Handover {
                election,
                epoch,
                node,
                to,
                reply,
            } => {
                let me = self.me();
                // The holder's node passes the order on itself (in `handover`).
                let holds = self
                    .seats
                    .get(&election)
                    .and_then(|s| s.holder.as_ref())
                    .is_some_and(|h| h.token == epoch);
                let others = self
                    .config
                    .members
                    .keys()
                    .copied()
                    .filter(|p| *p != me && !holds);
                broadcast_handover(
                    &self.transport,
                    others,
                    &election,
                    epoch,
                    node,
                    to.as_deref(),
                );
                self.handover(&election, epoch, node, to);
                let _ = reply.send(());
            }
        }
    }

    /// A handover of the grant `epoch` of `name` was asked for: the holder,
    /// if it is here, is told it is preempted (also one that opted out: a
    /// handover is asked for by name), and until the seat is taken again
    /// (at most two leases) every other node defers to `node`, whose next
    /// grant goes to `to` if it still waits then.
    fn handover(
        &mut self,
        name: &ElectionName,
        epoch: u64,
        node: Option<PeerId>,
        to: Option<String>,
    ) {
        if !self.ensure_seat(name) {
            return;
        }
        let me = self.me();
        let now = self.clock.now();
        let until = TokioInstant::now() + self.config.timing.lease * 2;
        let Some(seat) = self.seats.get_mut(name) else {
            return;
        };
        // An order for a grant already superseded (a copy that came late).
        let stale = seat.machine.leader().is_some_and(|l| l.epoch > epoch)
            || seat.granted.is_some_and(|g| g > epoch);
        if stale {
            return;
        }
        if let Some(h) = seat.holder.as_mut().filter(|h| h.token == epoch) {
            if !h.preempted {
                // This is the holder's node: pass the order on to everyone
                // before the release can leave, then tell the holder.
                let others = self.config.members.keys().copied().filter(|p| *p != me);
                broadcast_handover(&self.transport, others, name, epoch, node, to.as_deref());
                h.preempted = true;
                if let Some(entry) = self.sessions.get(&h.session) {
                    tracing::debug!(election = %name, epoch, "handover: telling the holder");
                    entry.events.preempted(name, FencingToken(epoch));
                }
            }
        }
        seat.handover = Some(PendingHandover {
            epoch,
            node,
            to,
            since: now,
            until,
        });
        self.settle(name);
    }

    fn keep_alive(&mut self, session: u64, reply: oneshot::Sender<Result<()>>) {
        let now_t = TokioInstant::now();
        let now = self.clock.at(now_t);
        let Some(entry) = self.sessions.get_mut(&session) else {
            let _ = reply.send(Err(expired_error()));
            return;
        };
        entry.expires_at = now_t + entry.ttl;
        if entry.held.is_empty() {
            let _ = reply.send(Ok(()));
            return;
        }
        entry.keepalives.push((now_t, reply));
        let held: Vec<ElectionName> = entry.held.iter().cloned().collect();
        for name in held {
            if let Some(seat) = self.seats.get_mut(&name) {
                // One round trip to a majority, started now.
                seat.machine.renew_now(now);
            }
            self.settle(&name);
        }
        self.check_keepalives();
    }

    fn campaign(
        &mut self,
        session: u64,
        election: ElectionName,
        candidate: Candidate,
        mode: CampaignMode,
        reply: CampaignReply,
    ) {
        if !self.sessions.contains_key(&session) {
            let _ = reply.send(Err(expired_error()));
            return;
        }
        if !self.ensure_seat(&election) {
            let _ = reply.send(Err(Engine::too_many()));
            return;
        }
        let me = self.me();
        let window = self.config.timing.answer_timeout * 3;
        let Some(seat) = self.seats.get_mut(&election) else {
            return;
        };
        if let Some(h) = &seat.holder {
            if h.session == session {
                let _ = reply.send(Ok(Some(FencingToken(h.token))));
                return;
            }
        }
        seat.waiters.retain(|w| w.session != session);
        let give_up_at = if mode == CampaignMode::Wait {
            None
        } else {
            let now = self.clock.now();
            let taken = seat.holder.is_some()
                || !seat.waiters.is_empty()
                || seat.machine.leader().is_some_and(|l| l.id != me)
                || seat.machine.rival_interest(now).is_some();
            if taken {
                let _ = reply.send(Ok(None));
                return;
            }
            Some(TokioInstant::now() + window)
        };
        let priority = wire_priority(&candidate);
        if let (Some(h), None) = (seat.holder.as_mut(), give_up_at) {
            if priority > wire_priority(&h.candidate) {
                preempt(&self.sessions, &election, h);
            }
        }
        let at = queue_position(seat.waiters.iter().map(|w| &w.candidate), priority);
        seat.waiters.insert(
            at,
            Waiter {
                session,
                candidate,
                reply,
                give_up_at,
            },
        );
        self.settle(&election);
    }

    fn resign(&mut self, session: u64, election: &ElectionName, token: Option<FencingToken>) {
        let hold_off = self.config.hold_off;
        let Some(seat) = self.seats.get_mut(election) else {
            return;
        };
        if token.is_none() {
            seat.waiters.retain(|w| w.session != session);
        }
        let resigned = seat
            .holder
            .as_ref()
            .is_some_and(|h| h.session == session && token.is_none_or(|t| t.0 == h.token));
        if resigned {
            seat.holder = None;
            if seat.waiters.is_empty() {
                seat.hold_off_until = Some(TokioInstant::now() + hold_off);
            }
            if let Some(entry) = self.sessions.get_mut(&session) {
                entry.held.remove(election);
            }
        }
        self.settle(election);
    }

    /// Closes (`reason` None) or expires a session: its seats are freed and
    /// its waiters fail.
    fn end_session(&mut self, session: u64, reason: Option<&str>) {
        let Some(entry) = self.sessions.remove(&session) else {
            return;
        };
        let mut touched: Vec<ElectionName> = entry.held.iter().cloned().collect();
        for (name, seat) in &mut self.seats {
            let before = seat.waiters.len();
            let mut kept = VecDeque::new();
            for w in seat.waiters.drain(..) {
                if w.session == session {
                    let _ = w.reply.send(Err(expired_error()));
                } else {
                    kept.push_back(w);
                }
            }
            seat.waiters = kept;
            if seat.waiters.len() != before {
                touched.push(name.clone());
            }
            if seat.holder.as_ref().is_some_and(|h| h.session == session) {
                seat.holder = None;
            }
        }
        for (_, reply) in entry.keepalives {
            let _ = reply.send(Err(expired_error()));
        }
        if let Some(reason) = reason {
            entry.events.expired(reason);
        }
        for name in touched {
            self.settle(&name);
        }
    }

    fn transport_event(&mut self, ev: TransportEvent) {
        match ev {
            TransportEvent::Received { from, envelope } => match envelope {
                Envelope::Routed { channel, msg } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        tracing::debug!(%from, "message for an invalid election name dropped");
                        return;
                    };
                    if !self.ensure_seat(&name) {
                        return;
                    }
                    let now = self.clock.now();
                    tracing::trace!(election = %name, %from, ?msg, "received");
                    if let Some(seat) = self.seats.get_mut(&name) {
                        seat.machine.handle_message(now, from, msg);
                    }
                    self.settle(&name);
                }
                Envelope::Seat {
                    channel,
                    epoch,
                    holder,
                    value,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    if !self.config.members.contains_key(&from) || !self.ensure_seat(&name) {
                        return;
                    }
                    if let Some(seat) = self.seats.get_mut(&name) {
                        let newer = seat.remote.as_ref().is_none_or(|r| epoch >= r.epoch);
                        if newer {
                            seat.remote = Some(RemoteSeat {
                                leader: from,
                                epoch,
                                holder,
                                value,
                            });
                        }
                    }
                    self.publish(&name);
                }
                Envelope::HandoverAsk {
                    channel,
                    request,
                    to,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    let answer = self
                        .seats
                        .get(&name)
                        .map(|s| s.handover_answer(to.as_deref()))
                        .unwrap_or_default();
                    let _ = self.transport.send(
                        from,
                        Envelope::HandoverAnswer {
                            channel,
                            request,
                            holding: answer.holder.unwrap_or_default(),
                            waiter: answer.waiter,
                        },
                    );
                }
                Envelope::HandoverAnswer {
                    request,
                    holding,
                    waiter,
                    ..
                } => {
                    if let Some(answers) = self.handover_requests.get(&request) {
                        let answer = HandoverAnswer {
                            holder: (holding.epoch > 0).then_some(holding),
                            waiter,
                        };
                        if answers.send((from, answer)).is_err() {
                            self.handover_requests.remove(&request);
                        }
                    }
                }
                Envelope::Handover {
                    channel,
                    epoch,
                    node,
                    to,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    if self.config.members.contains_key(&from) {
                        self.handover(&name, epoch, node, to);
                    }
                }
                Envelope::Hello { .. } => {}
            },
            TransportEvent::Undelivered { to, envelope } => {
                if let Envelope::Routed { channel, .. } = envelope {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    let now = self.clock.now();
                    if let Some(seat) = self.seats.get_mut(&name) {
                        seat.machine.forget_interest(now, to);
                        seat.machine.peer_unreachable(now, to);
                        self.settle(&name);
                    }
                }
            }
        }
    }

    fn wake(&mut self) {
        let now_t = TokioInstant::now();
        let expired: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at <= now_t)
            .map(|(n, _)| *n)
            .collect();
        for n in expired {
            self.end_session(n, Some("TTL passed without renewal"));
        }
        let mut due = Vec::new();
        while let Some((t, name)) = self.wakeups.first().cloned() {
            if t > now_t {
                break;
            }
            self.wakeups.remove(&(t, name.clone()));
            self.wake_of.remove(&name);
            due.push(name);
        }
        let now = self.clock.at(now_t);
        for name in due {
            if let Some(seat) = self.seats.get_mut(&name) {
                if seat.machine.poll_timeout().is_some_and(|at| at <= now) {
                    seat.machine.handle_timeout(now);
                }
                let mut kept = VecDeque::new();
                for w in seat.waiters.drain(..) {
                    if w.give_up_at.is_some_and(|t| t <= now_t) {
                        let _ = w.reply.send(Ok(None));
                    } else {
                        kept.push_back(w);
                    }
                }
                seat.waiters = kept;
            }
            self.settle(&name);
        }
    }

    /// After any input to the seat of `name`: send what its machine
    /// produced, hand the seat to a local waiter or take it back, follow the
    /// candidacy the local sessions want, publish, and re-arm its timer.
    fn settle(&mut self, name: &ElectionName) {
        for _ in 0..16 {
            self.flush(name);
            if !self.reconcile(name) {
                break;
            }
        }
        self.flush(name);
        self.publish(name);
        self.reschedule(name);
        self.check_keepalives();
    }

    fn flush(&mut self, name: &ElectionName) {
        let Some(seat) = self.seats.get_mut(name) else {
            return;
        };
        if let Some(state) = self.state.as_mut() {
            // A promise is on disk before the acknowledgement carrying it
            // leaves.
            if let Err(e) = state.save(name, seat.machine.durable()) {
                tracing::error!(election = %name, error = %e, "could not save the promise; a restart of this node could acknowledge an epoch twice");
            }
        }
        for _ in 0..64 {
            let mut failed = Vec::new();
            while let Some((to, msg)) = seat.machine.poll_transmit() {
                if let (Message::QuorumRenew { epoch, .. }, Some(h)) = (&msg, &seat.holder) {
                    if *epoch == h.token {
                        // Renewals carry who holds the seat, for observers
                        // that joined late.
                        let _ = self.transport.send(to, seat_envelope(name, h));
                    }
                }
                tracing::trace!(election = %name, %to, ?msg, "sending");
                let envelope = Envelope::Routed {
                    channel: name.as_str().to_owned(),
                    msg,
                };
                if self.transport.send(to, envelope).is_err() {
                    failed.push(to);
                }
            }
            if failed.is_empty() {
                break;
            }
            let now = self.clock.now();
            for to in failed {
                seat.machine.forget_interest(now, to);
                seat.machine.peer_unreachable(now, to);
            }
        }
        while seat.machine.poll_event().is_some() {}
    }

    /// One step towards the state the local sessions want; true if the
    /// machine was given an input (so there is more to flush).
    fn reconcile(&mut self, name: &ElectionName) -> bool {
        let me = self.me();
        let now_t = TokioInstant::now();
        let now = self.clock.at(now_t);
        let Some(seat) = self.seats.get_mut(name) else {
            return false;
        };
        let leading = seat.machine.fencing_token();
        // The holder's grant ends with this node's leadership of its epoch.
        if let Some(h) = seat.holder.take_if(|h| leading != Some(h.token)) {
            tracing::debug!(election = %name, token = h.token, ?leading, "the grant ends with this node's leadership of its epoch");
            if let Some(entry) = self.sessions.get_mut(&h.session) {
                entry.held.remove(name);
                entry.events.election_lost(
                    name,
                    FencingToken(h.token),
                    "this node lost its quorum leadership",
                );
            }
        }
        {
            let sessions = &self.sessions;
            seat.waiters
                .retain(|w| !w.reply.is_closed() && sessions.contains_key(&w.session));
        }
        // A handover is used up once another node leads in a later epoch
        // (on the node it names: by the grant below), or lapses.
        let used_up = seat.handover.as_ref().is_some_and(|h| {
            h.until <= now_t
                || seat
                    .machine
                    .leader()
                    .is_some_and(|l| l.epoch > h.epoch && (l.id != me || h.node != Some(me)))
        });
        if used_up {
            seat.handover = None;
        }
        // Clause 14: tell the other members the best priority waiting here;
        // preempt the holder, once, when a higher priority joins on another
        // node: the best priority announced there rises above the holder's
        // (a join here preempts in `campaign`). A waiter that was there at
        // the grant (one passed over by a handover) does not.
        let interest = seat.interest();
        seat.machine.set_interest(now, interest);
        let best_rival = seat.machine.best_rival(now);
        let rival = best_rival.map(|(p, _)| p);
        if let Some(h) = seat.holder.as_mut() {
            let joined = rival > h.rival_floor;
            h.rival_floor = h.rival_floor.min(rival);
            let above = best_rival.filter(|(p, _)| *p > wire_priority(&h.candidate));
            if let (true, Some((_, node))) = (joined, above) {
                if !h.preempted && h.candidate.preemptible() {
                    // The other nodes may not have heard of the newcomer
                    // yet when this node's release reaches them: name its
                    // node to them first (as a handover does).
                    let others = self.config.members.keys().copied().filter(|p| *p != me);
                    broadcast_handover(&self.transport, others, name, h.token, Some(node), None);
                    seat.handover = Some(PendingHandover {
                        epoch: h.token,
                        node: Some(node),
                        to: None,
                        since: now,
                        until: now_t + self.config.timing.lease * 2,
                    });
                }
                preempt(&self.sessions, name, h);
            }
        }
        // Without a holder here, local waiters stand back while a higher
        // priority waits elsewhere, or while a handover names another node
        // that still has waiters; a handover naming this node (for a waiter
        // still here) puts it ahead of any priority.
        let best_here = seat
            .waiters
            .iter()
            .map(|w| wire_priority(&w.candidate))
            .max();
        let since = seat.handover.as_ref().map_or(now, |h| h.since);
        let named = seat
            .handover
            .as_ref()
            .and_then(|h| h.node.map(|n| (n, h.to.clone())));
        let deferring = match named {
            Some((node, to)) if node == me => {
                let here = to.is_none_or(|id| seat.waiters.iter().any(|w| w.candidate.id() == id));
                !here && rival.is_some_and(|r| best_here.is_none_or(|b| r > b))
            }
            Some((node, _)) if !seat.machine.withdrew_since(node, since) => true,
            _ => rival.is_some_and(|r| best_here.is_none_or(|b| r > b)),
        };
        let outranked = seat.holder.is_none() && !seat.waiters.is_empty() && deferring;
        if let (None, Some(epoch), false) = (&seat.holder, leading, outranked) {
            if seat.granted == Some(epoch) || seat.waiters.is_empty() {
                // That grant ended, or nobody here wants the seat: give the
                // epoch up; with waiters left, a campaign for a higher one
                // follows at once.
                seat.machine.relinquish(now);
                return true;
            }
            // A handover to a waiter here: it goes first.
            let preferred = seat
                .handover
                .as_ref()
                .filter(|h| h.node == Some(me))
                .and_then(|h| h.to.as_deref())
                .and_then(|id| seat.waiters.iter().position(|w| w.candidate.id() == id));
            if let Some(w) = preferred.and_then(|at| seat.waiters.remove(at)) {
                seat.waiters.push_front(w);
            }
            let expiry = seat.machine.lease_expiry();
            while let Some(w) = seat.waiters.pop_front() {
                let ttl = self
                    .sessions
                    .get(&w.session)
                    .map_or(Duration::ZERO, |s| s.ttl);
                // The core keeps the grant valid until at most a renewal's
                // send time plus COVERED_SHARE × TTL: the lease must last
                // that long, or wait for the next renewal round.
                let covered = expiry.is_some_and(|e| e >= now + ttl.mul_f64(COVERED_SHARE));
                if !covered {
                    seat.waiters.push_front(w);
                    break;
                }
                let token = FencingToken(epoch);
                tracing::debug!(election = %name, epoch, ?expiry, "granting the seat");
                if w.reply.send(Ok(Some(token))).is_ok() {
                    for peer in self.config.members.keys().filter(|p| **p != me) {
                        let h = Holder {
                            session: w.session,
                            candidate: w.candidate.clone(),
                            token: epoch,
                            preempted: false,
                            rival_floor: rival,
                        };
                        let _ = self.transport.send(*peer, seat_envelope(name, &h));
                    }
                    if let Some(entry) = self.sessions.get_mut(&w.session) {
                        entry.held.insert(name.clone());
                    }
                    seat.holder = Some(Holder {
                        session: w.session,
                        candidate: w.candidate,
                        token: epoch,
                        preempted: false,
                        rival_floor: rival,
                    });
                    seat.granted = Some(epoch);
                    seat.hold_off_until = None;
                    // The handover, if any, is used up by this grant.
                    seat.handover = None;
                    break;
                }
            }
        }
        let wanted = seat.holder.is_some() || (!seat.waiters.is_empty() && !outranked);
        if wanted && !seat.machine.is_candidate() {
            let other_leads = seat.machine.leader().is_some_and(|l| l.id != me);
            let held_off = seat.hold_off_until.is_some_and(|t| now_t < t)
                && seat.machine.known_candidates().next().is_some()
                && !other_leads;
            if !held_off {
                seat.hold_off_until = None;
                seat.machine.set_candidate(now, true);
                return true;
            }
        } else if !wanted && seat.machine.is_candidate() {
            seat.machine.set_candidate(now, false);
            return true;
        }
        false
    }

    fn info(&self, seat: &Seat) -> Option<LeaderInfo> {
        if let Some(h) = &seat.holder {
            return Some(LeaderInfo {
                id: h.candidate.id().to_owned(),
                value: h.candidate.value().to_owned(),
                token: FencingToken(h.token),
            });
        }
        let leader = seat.machine.leader().filter(|l| l.id != self.me())?;
        seat.remote
            .as_ref()
            .filter(|r| r.leader == leader.id && r.epoch == leader.epoch)
            .map(|r| LeaderInfo {
                id: r.holder.clone(),
                value: r.value.clone(),
                token: FencingToken(r.epoch),
            })
    }

    fn publish(&self, name: &ElectionName) {
        let Some(seat) = self.seats.get(name) else {
            return;
        };
        let info = self.info(seat);
        seat.watch.send_if_modified(|v| {
            let changed = *v != info;
            if changed {
                v.clone_from(&info);
            }
            changed
        });
    }

    fn reschedule(&mut self, name: &ElectionName) {
        let Some(seat) = self.seats.get(name) else {
            return;
        };
        let mut at = seat.machine.poll_timeout().map(|t| self.clock.tokio(t));
        let mut consider = |t: Option<TokioInstant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        if !seat.waiters.is_empty() && !seat.machine.is_candidate() {
            consider(seat.hold_off_until);
        }
        for w in &seat.waiters {
            consider(w.give_up_at);
        }
        consider(seat.handover.as_ref().map(|h| h.until));
        if let Some(old) = self.wake_of.remove(name) {
            self.wakeups.remove(&(old, name.clone()));
        }
        if let Some(t) = at {
            self.wakeups.insert((t, name.clone()));
            self.wake_of.insert(name.clone(), t);
        }
    }

    /// Answers keep-alives whose every held seat has renewed since they were
    /// sent.
    fn check_keepalives(&mut self) {
        for entry in self.sessions.values_mut() {
            if entry.keepalives.is_empty() {
                continue;
            }
            let need = entry.ttl.mul_f64(COVERED_SHARE);
            let mut pending = Vec::new();
            for (sent, reply) in entry.keepalives.drain(..) {
                if reply.is_closed() {
                    continue;
                }
                let from = self.clock.at(sent) + need;
                let renewed = entry.held.iter().all(|name| {
                    self.seats.get(name).is_some_and(|s| {
                        s.holder.is_some() && s.machine.lease_expiry().is_some_and(|e| e >= from)
                    })
                });
                if renewed {
                    let _ = reply.send(Ok(()));
                } else {
                    pending.push((sent, reply));
                }
            }
            entry.keepalives = pending;
        }
    }
}

/// Tells the session of `h` that a higher priority joined (once per grant,
/// and not a holder that opted out): the core ends the grant and resigns.
fn preempt(sessions: &HashMap<u64, SessionEntry>, name: &ElectionName, h: &mut Holder) {
    if h.preempted || !h.candidate.preemptible() {
        return;
    }
    h.preempted = true;
    tracing::debug!(election = %name, token = h.token, "a higher priority joined: the holder is preempted");
    if let Some(entry) = sessions.get(&h.session) {
        entry.events.preempted(name, FencingToken(h.token));
    }
}

/// Who holds the seat, for the wire.
fn holding(h: &Holder) -> Holding {
    Holding {
        epoch: h.token,
        holder: h.candidate.id().to_owned(),
        value: h.candidate.value().to_owned(),
    }
}

fn seat_envelope(name: &ElectionName, h: &Holder) -> Envelope {
    let Holding {
        epoch,
        holder,
        value,
    } = holding(h);
    Envelope::Seat {
        channel: name.as_str().to_owned(),
        epoch,
        holder,
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, priority: i32) -> Candidate {
        Candidate::new(id)
            .and_then(|c| c.with_priority(priority))
            .unwrap()
    }

    /// Queues `joins` one after the other as `campaign` does.
    fn queue(joins: &[(&str, i32)]) -> Vec<String> {
        let mut q: VecDeque<Candidate> = VecDeque::new();
        for (id, p) in joins {
            let c = cand(id, *p);
            let at = queue_position(q.iter(), wire_priority(&c));
            q.insert(at, c);
        }
        q.iter().map(|c| c.id().to_owned()).collect()
    }

    #[test]
    fn waiters_queue_by_priority_then_arrival() {
        // The order of contract clause 14's check: 0, 5, 5, 2 → 5, 5, 2, 0.
        assert_eq!(
            queue(&[("b", 0), ("c", 5), ("d", 5), ("e", 2)]),
            ["c", "d", "e", "b"]
        );
        assert_eq!(
            queue(&[
                ("a", -1000),
                ("b", 1000),
                ("c", 0),
                ("d", -1000),
                ("e", 1000)
            ]),
            ["b", "e", "c", "a", "d"]
        );
        // One priority: first come, first served.
        assert_eq!(queue(&[("x", 3), ("y", 3), ("z", 3)]), ["x", "y", "z"]);
    }

    #[test]
    fn priorities_fit_the_wire() {
        assert_eq!(wire_priority(&cand("a", 1000)), 1000);
        assert_eq!(wire_priority(&cand("a", -1000)), -1000);
        assert_eq!(wire_priority(&cand("a", 0)), 0);
        assert_eq!(wire_priority(&Candidate::new("a").unwrap()), 0);
    }
}
