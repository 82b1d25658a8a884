//! The task that owns a node's state: one quorum-guarded machine per
//! election, the local sessions and their waiters, the transport.

mod command;
mod handover;
mod inbound;
mod seat;
mod session;
mod settle;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use tenure_core::{ElectionName, Error, ErrorKind, FencingToken, LeaderInfo};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;

use super::config::{PeerConfig, PEER_SCHEME};
use super::state::StateFile;
use crate::config::Config;
use crate::heartbeat::Heartbeat;
use crate::machine::ElectionAlgorithm;
use crate::node::{sleep_until, Clock};
use crate::quorum::QuorumGuard;
use crate::transport::{Transport, TransportEvent};
use crate::types::{Instant, PeerId};

pub(crate) use command::Command;
pub(crate) use handover::HandoverAnswer;
use seat::Seat;
use session::SessionEntry;

/// The most elections one node keeps state for. Each costs a few hundred
/// bytes and must be kept (its promise is what makes epochs unique).
pub(crate) const MAX_ELECTIONS: usize = 100_000;

/// The share of a session's TTL a grant or renewal must be covered by the
/// quorum lease (the core's renew deadline is at most this share of the TTL).
const COVERED_SHARE: f64 = 1.0 - tenure_core::CLOCK_DRIFT_MARGIN;

type Machine = QuorumGuard<Heartbeat<Box<dyn ElectionAlgorithm + Send>>>;

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
}
