//! A deterministic simulator that drives any [`ElectionAlgorithm`].
//!
//! Hosts each run one state machine. Messages take a delay drawn from a
//! seeded [`SimRng`]; hosts can crash (losing all but their
//! [`Durable`] state) and restart; links can be cut by partitions and
//! repaired. Every message is counted per
//! [`MessageKind`](crate::MessageKind) as sent, delivered or dropped. A run
//! is a pure function of the seed and the calls made, on any
//! platform and toolchain: the generator is a hand-written splitmix64, and all
//! collections iterate in a fixed order.
//!
//! Delivery rules:
//!
//! * a message to a host that is down, or across a cut link, is dropped when
//!   sent, and the sender is told through
//!   [`peer_unreachable`](ElectionAlgorithm::peer_unreachable) after a
//!   sampled delay (the way a refused connection comes back);
//! * a message in flight is dropped silently if its receiver crashed (or
//!   restarted) or the link was cut meanwhile;
//! * with [`Network::loss_per_million`] above zero, messages are also lost
//!   silently at random.
//!
//! ```
//! use tenure_peer::sim::Simulation;
//! use tenure_peer::{Bully, Config, ElectionAlgorithm, PeerId};
//!
//! let ids: Vec<PeerId> = (1..=5).map(PeerId).collect();
//! let members = ids.clone();
//! let mut sim = Simulation::new(7, ids, move |id| {
//!     Bully::new(Config::new(id, members.clone()).expect("valid config"))
//! });
//! sim.start_all();
//! assert!(sim.run_until_idle());
//! assert_eq!(sim.leader_of(PeerId(1)).map(|l| l.id), Some(PeerId(5)));
//! ```

mod faults;
mod log;
mod network;
mod queue;
mod rng;
mod stats;
mod step;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;

use crate::machine::ElectionAlgorithm;
use crate::types::{Durable, Instant, Leader, PeerId};

pub use log::{Happening, Record, Term};
pub use network::Network;
use queue::Scheduled;
pub use rng::SimRng;
pub use stats::MessageStats;

#[derive(Debug)]
struct Host<A> {
    machine: Option<A>,
    started: bool,
    incarnation: u64,
    timer_generation: u64,
    timer_at: Option<Instant>,
    durable: Durable,
}

/// The most steps [`Simulation::run_until_idle`] takes before giving up.
pub const MAX_IDLE_STEPS: u64 = 5_000_000;

/// A deterministic simulation of hosts running `A`.
pub struct Simulation<A> {
    seed: u64,
    rng: SimRng,
    now: Instant,
    network: Network,
    hosts: BTreeMap<PeerId, Host<A>>,
    queue: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    cut: BTreeSet<(PeerId, PeerId)>,
    stats: MessageStats,
    log: Vec<Record>,
    fingerprint: u64,
    factory: Box<dyn FnMut(PeerId) -> A>,
}

impl<A: fmt::Debug> fmt::Debug for Simulation<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .field("hosts", &self.hosts.keys().collect::<Vec<_>>())
            .field("queued", &self.queue.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<A: ElectionAlgorithm> Simulation<A> {
    /// A simulation with one host per id in `hosts`, each running the machine
    /// `factory` builds for it (again on every restart). Nothing runs until
    /// [`start_all`](Self::start_all) or [`start`](Self::start).
    pub fn new(
        seed: u64,
        hosts: impl IntoIterator<Item = PeerId>,
        factory: impl FnMut(PeerId) -> A + 'static,
    ) -> Self {
        let mut factory: Box<dyn FnMut(PeerId) -> A> = Box::new(factory);
        let hosts = hosts
            .into_iter()
            .map(|id| {
                (
                    id,
                    Host {
                        machine: Some(factory(id)),
                        started: false,
                        incarnation: 0,
                        timer_generation: 0,
                        timer_at: None,
                        durable: Durable::default(),
                    },
                )
            })
            .collect();
        Simulation {
            seed,
            rng: SimRng::new(seed),
            now: Instant::ZERO,
            network: Network::default(),
            hosts,
            queue: BinaryHeap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            stats: MessageStats::default(),
            log: Vec::new(),
            fingerprint: seed,
            factory,
        }
    }

    /// Replaces the network model (builder style).
    pub fn with_network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    /// Replaces the network model from now on (messages in flight keep
    /// their delays).
    pub fn set_network(&mut self, network: Network) {
        self.network = network;
    }

    /// The seed this run was built from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The host ids, ascending.
    pub fn hosts(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.hosts.keys().copied()
    }

    /// Message counts since the start or the last
    /// [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> &MessageStats {
        &self.stats
    }

    /// Zeroes the message counts.
    pub fn reset_stats(&mut self) {
        self.stats = MessageStats::default();
    }

    /// Everything that happened, in order.
    pub fn log(&self) -> &[Record] {
        &self.log
    }

    /// A digest of every step taken so far; equal runs have equal digests.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether `host` is up.
    pub fn is_up(&self, host: PeerId) -> bool {
        self.hosts.get(&host).is_some_and(|h| h.machine.is_some())
    }

    /// The machine running on `host`, if it is up.
    pub fn machine(&self, host: PeerId) -> Option<&A> {
        self.hosts.get(&host).and_then(|h| h.machine.as_ref())
    }

    /// The leader `host` follows, if it is up and knows one.
    pub fn leader_of(&self, host: PeerId) -> Option<Leader> {
        self.machine(host).and_then(|m| m.leader())
    }

    /// Every up host that considers itself leader, ascending.
    pub fn self_leaders(&self) -> Vec<(PeerId, Leader)> {
        self.hosts
            .iter()
            .filter_map(|(id, h)| {
                let leader = h.machine.as_ref()?.leader()?;
                (leader.id == *id).then_some((*id, leader))
            })
            .collect()
    }

    /// Whether messages from `a` reach `b` (ignoring crashes).
    pub fn is_connected(&self, a: PeerId, b: PeerId) -> bool {
        !self.cut.contains(&(a, b))
    }

    /// Starts every host that has not started yet, in ascending order.
    pub fn start_all(&mut self) {
        let ids: Vec<PeerId> = self.hosts().collect();
        for id in ids {
            self.start(id);
        }
    }

    /// Starts `host` if it is up and has not started.
    pub fn start(&mut self, host: PeerId) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if h.started {
            return;
        }
        let Some(machine) = h.machine.as_mut() else {
            return;
        };
        h.started = true;
        machine.start(now);
        self.after_input(host);
    }

    /// Tells `host`'s machine to start an election now, as its failure
    /// detector would.
    pub fn start_election(&mut self, host: PeerId) {
        let now = self.now;
        if let Some(machine) = self.hosts.get_mut(&host).and_then(|h| h.machine.as_mut()) {
            machine.start_election(now);
            self.after_input(host);
        }
    }

    /// Hands `host`'s machine (if it is up) to `input` with the current time,
    /// then sends what it produced, as after any other input: for inputs
    /// beyond the [`ElectionAlgorithm`] trait, such as
    /// [`QuorumGuard::set_candidate`](crate::QuorumGuard::set_candidate).
    pub fn input(&mut self, host: PeerId, input: impl FnOnce(&mut A, Instant)) {
        let now = self.now;
        if let Some(machine) = self.hosts.get_mut(&host).and_then(|h| h.machine.as_mut()) {
            input(machine, now);
            self.mix(&[8, now.as_nanos(), host.get()]);
            self.after_input(host);
        }
    }
}
