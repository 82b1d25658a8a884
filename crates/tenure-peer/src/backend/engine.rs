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
use crate::wire::Envelope;

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
        }
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
            let taken = seat.holder.is_some()
                || !seat.waiters.is_empty()
                || seat.machine.leader().is_some_and(|l| l.id != me);
            if taken {
                let _ = reply.send(Ok(None));
                return;
            }
            Some(TokioInstant::now() + window)
        };
        seat.waiters.push_back(Waiter {
            session,
            candidate,
            reply,
            give_up_at,
        });
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
                Envelope::Hello { .. } => {}
            },
            TransportEvent::Undelivered { to, envelope } => {
                if let Envelope::Routed { channel, .. } = envelope {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    let now = self.clock.now();
                    if let Some(seat) = self.seats.get_mut(&name) {
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
        if let (None, Some(epoch)) = (&seat.holder, leading) {
            if seat.granted == Some(epoch) || seat.waiters.is_empty() {
                // That grant ended, or nobody here wants the seat: give the
                // epoch up; with waiters left, a campaign for a higher one
                // follows at once.
                seat.machine.relinquish(now);
                return true;
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
                    });
                    seat.granted = Some(epoch);
                    seat.hold_off_until = None;
                    break;
                }
            }
        }
        let wanted = seat.holder.is_some() || !seat.waiters.is_empty();
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

fn seat_envelope(name: &ElectionName, h: &Holder) -> Envelope {
    Envelope::Seat {
        channel: name.as_str().to_owned(),
        epoch: h.token,
        holder: h.candidate.id().to_owned(),
        value: h.candidate.value().to_owned(),
    }
}
