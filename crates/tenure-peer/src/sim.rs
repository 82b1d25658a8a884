//! A deterministic simulator that drives any [`ElectionAlgorithm`].
//!
//! Hosts each run one state machine. Messages take a delay drawn from a
//! seeded [`SimRng`]; hosts can crash (losing all but their
//! [`Durable`] state) and restart; links can be cut by partitions and
//! repaired. Every message is counted per [`MessageKind`] as sent, delivered
//! or dropped. A run is a pure function of the seed and the calls made, on any
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

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::time::Duration;

use crate::machine::ElectionAlgorithm;
use crate::message::{Message, MessageKind};
use crate::types::{Durable, Event, Instant, Leader, PeerId};

/// The simulator's pseudo-random generator: splitmix64, so a seed yields the
/// same numbers everywhere.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(bound);
        u64::try_from(wide >> 64).unwrap_or(0)
    }

    /// A duration in `low..=high` (`low` when `high < low`).
    pub fn duration_between(&mut self, low: Duration, high: Duration) -> Duration {
        let low_ns = u64::try_from(low.as_nanos()).unwrap_or(u64::MAX);
        let high_ns = u64::try_from(high.as_nanos()).unwrap_or(u64::MAX);
        if high_ns <= low_ns {
            return low;
        }
        let span = high_ns - low_ns;
        let offset = if span == u64::MAX {
            self.next_u64()
        } else {
            self.below(span + 1)
        };
        Duration::from_nanos(low_ns + offset)
    }
}

/// How the simulated network behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// Shortest one-way delay. Default 1 ms; keep it above zero so that a
    /// reply always comes strictly after its request.
    pub min_delay: Duration,
    /// Longest one-way delay. Default 10 ms.
    pub max_delay: Duration,
    /// Messages lost silently at random, per million. Default 0.
    pub loss_per_million: u32,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(10),
            loss_per_million: 0,
        }
    }
}

/// Messages counted per kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageStats {
    sent: [u64; MessageKind::ALL.len()],
    delivered: [u64; MessageKind::ALL.len()],
    dropped: [u64; MessageKind::ALL.len()],
}

impl MessageStats {
    /// Messages of `kind` that state machines emitted.
    pub fn sent(&self, kind: MessageKind) -> u64 {
        self.sent.get(kind.index()).copied().unwrap_or(0)
    }

    /// Messages of `kind` handed to their receiver.
    pub fn delivered(&self, kind: MessageKind) -> u64 {
        self.delivered.get(kind.index()).copied().unwrap_or(0)
    }

    /// Messages of `kind` that never arrived.
    pub fn dropped(&self, kind: MessageKind) -> u64 {
        self.dropped.get(kind.index()).copied().unwrap_or(0)
    }

    /// All messages emitted.
    pub fn total_sent(&self) -> u64 {
        self.sent.iter().sum()
    }

    /// All messages delivered.
    pub fn total_delivered(&self) -> u64 {
        self.delivered.iter().sum()
    }

    /// All messages dropped.
    pub fn total_dropped(&self) -> u64 {
        self.dropped.iter().sum()
    }

    fn bump(counts: &mut [u64; MessageKind::ALL.len()], kind: MessageKind) {
        if let Some(slot) = counts.get_mut(kind.index()) {
            *slot = slot.saturating_add(1);
        }
    }
}

impl fmt::Display for MessageStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in MessageKind::ALL {
            let sent = self.sent(kind);
            if sent == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(
                f,
                "{kind}: {sent} sent/{} delivered/{} dropped",
                self.delivered(kind),
                self.dropped(kind)
            )?;
        }
        if first {
            f.write_str("no messages")?;
        }
        Ok(())
    }
}

/// Something that happened to a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happening {
    /// The host's state machine reported an event.
    Event(Event),
    /// The host crashed.
    Crashed,
    /// The host restarted with a fresh state machine.
    Restarted,
}

/// One entry of the simulation's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When.
    pub at: Instant,
    /// Where.
    pub host: PeerId,
    /// What.
    pub what: Happening,
}

/// A stretch of time during which one host considered itself leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The leader.
    pub host: PeerId,
    /// Its epoch.
    pub epoch: u64,
    /// When it started leading.
    pub from: Instant,
    /// When it stopped (crash, step-down, or following someone else); `None`
    /// while it still leads.
    pub until: Option<Instant>,
}

impl Term {
    /// Whether this term and `other` share some instant. A term that ends at
    /// the instant another starts does not overlap it.
    pub fn overlaps(&self, other: &Term) -> bool {
        let self_end = self.until.unwrap_or(Instant::from_nanos(u64::MAX));
        let other_end = other.until.unwrap_or(Instant::from_nanos(u64::MAX));
        self.from < other_end && other.from < self_end
    }
}

#[derive(Debug)]
enum Action {
    Deliver {
        from: PeerId,
        to: PeerId,
        incarnation: u64,
        msg: Message,
    },
    Unreachable {
        host: PeerId,
        peer: PeerId,
        incarnation: u64,
    },
    Timer {
        host: PeerId,
        generation: u64,
    },
}

#[derive(Debug)]
struct Scheduled {
    at: Instant,
    seq: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

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

    /// Crashes `host`: its machine and timers are gone, messages to it are
    /// lost. Its [`Durable`] state is kept for the restart.
    pub fn crash(&mut self, host: PeerId) {
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        let Some(machine) = h.machine.take() else {
            return;
        };
        h.durable = machine.durable();
        h.started = false;
        h.incarnation += 1;
        h.timer_generation += 1;
        h.timer_at = None;
        self.mix(&[3, host.get()]);
        self.log.push(Record {
            at: self.now,
            host,
            what: Happening::Crashed,
        });
    }

    /// Restarts a crashed `host` with a fresh machine that gets the durable
    /// state back, then starts it.
    pub fn restart(&mut self, host: PeerId) {
        self.restart_with(host, true);
    }

    /// Restarts a crashed `host` with a fresh machine that does not get its durable
    /// state back (a `peer://` node without `state=`), then starts it.
    pub fn restart_forgetting(&mut self, host: PeerId) {
        self.restart_with(host, false);
    }

    fn restart_with(&mut self, host: PeerId, restore: bool) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if h.machine.is_some() {
            return;
        }
        let mut machine = (self.factory)(host);
        if restore {
            machine.restore(h.durable);
        }
        h.incarnation += 1;
        h.started = true;
        machine.start(now);
        h.machine = Some(machine);
        self.mix(&[4, host.get()]);
        self.log.push(Record {
            at: now,
            host,
            what: Happening::Restarted,
        });
        self.after_input(host);
    }

    /// Cuts every link between a host of `a` and a host of `b`, both ways.
    pub fn partition(&mut self, a: &[PeerId], b: &[PeerId]) {
        for x in a {
            for y in b {
                if x != y {
                    self.cut.insert((*x, *y));
                    self.cut.insert((*y, *x));
                }
            }
        }
    }

    /// Cuts `host` off from every other host.
    pub fn isolate(&mut self, host: PeerId) {
        let others: Vec<PeerId> = self.hosts().filter(|p| *p != host).collect();
        self.partition(&[host], &others);
    }

    /// Repairs every cut link.
    pub fn repair(&mut self) {
        self.cut.clear();
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

    /// Runs until nothing is left to do (no message in flight, no timer set).
    /// Returns false if that did not happen within [`MAX_IDLE_STEPS`] steps,
    /// as with algorithms that keep periodic timers.
    pub fn run_until_idle(&mut self) -> bool {
        for _ in 0..MAX_IDLE_STEPS {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Runs every step due up to `deadline`, then sets the clock to it.
    pub fn run_until(&mut self, deadline: Instant) {
        while self
            .queue
            .peek()
            .is_some_and(|Reverse(next)| next.at <= deadline)
        {
            self.step();
        }
        self.now = self.now.max(deadline);
    }

    /// Runs for `duration` of simulated time.
    pub fn run_for(&mut self, duration: Duration) {
        let deadline = self.now + duration;
        self.run_until(deadline);
    }

    /// Takes the next step; false when there was nothing to do.
    pub fn step(&mut self) -> bool {
        let Some(Reverse(next)) = self.queue.pop() else {
            return false;
        };
        self.now = self.now.max(next.at);
        let now = self.now;
        match next.action {
            Action::Deliver {
                from,
                to,
                incarnation,
                msg,
            } => {
                let kind = msg.kind();
                let connected = self.is_connected(from, to);
                let target = self
                    .hosts
                    .get_mut(&to)
                    .filter(|h| h.incarnation == incarnation)
                    .and_then(|h| h.machine.as_mut());
                match target {
                    Some(machine) if connected => {
                        MessageStats::bump(&mut self.stats.delivered, kind);
                        machine.handle_message(now, from, msg);
                        self.mix(&[5, now.as_nanos(), from.get(), to.get(), kind.index() as u64]);
                        self.after_input(to);
                    }
                    _ => MessageStats::bump(&mut self.stats.dropped, kind),
                }
            }
            Action::Unreachable {
                host,
                peer,
                incarnation,
            } => {
                let target = self
                    .hosts
                    .get_mut(&host)
                    .filter(|h| h.incarnation == incarnation)
                    .and_then(|h| h.machine.as_mut());
                if let Some(machine) = target {
                    machine.peer_unreachable(now, peer);
                    self.mix(&[6, now.as_nanos(), host.get(), peer.get()]);
                    self.after_input(host);
                }
            }
            Action::Timer { host, generation } => {
                let target = self
                    .hosts
                    .get_mut(&host)
                    .filter(|h| h.timer_generation == generation);
                if let Some(h) = target {
                    h.timer_at = None;
                    if let Some(machine) = h.machine.as_mut() {
                        machine.handle_timeout(now);
                        self.mix(&[7, now.as_nanos(), host.get()]);
                        self.after_input(host);
                    }
                }
            }
        }
        true
    }

    /// Every stretch during which a host considered itself leader, in order of
    /// their start.
    pub fn terms(&self) -> Vec<Term> {
        let mut open: BTreeMap<PeerId, usize> = BTreeMap::new();
        let mut terms: Vec<Term> = Vec::new();
        for record in &self.log {
            let starts = match &record.what {
                Happening::Event(Event::LeaderChanged { leader, epoch })
                    if *leader == record.host =>
                {
                    Some(*epoch)
                }
                _ => None,
            };
            if let Some(index) = open.remove(&record.host) {
                if let Some(term) = terms.get_mut(index) {
                    term.until = Some(record.at);
                }
            }
            if let Some(epoch) = starts {
                open.insert(record.host, terms.len());
                terms.push(Term {
                    host: record.host,
                    epoch,
                    from: record.at,
                    until: None,
                });
            }
        }
        terms
    }

    fn schedule(&mut self, at: Instant, action: Action) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            action,
        }));
    }

    fn mix(&mut self, words: &[u64]) {
        for word in words {
            let mut rng = SimRng::new(self.fingerprint ^ word.rotate_left(17));
            self.fingerprint = rng.next_u64();
        }
    }

    fn delay(&mut self) -> Duration {
        let (low, high) = (self.network.min_delay, self.network.max_delay);
        self.rng.duration_between(low, high)
    }

    /// Drains `host`'s outputs after an input and re-arms its timer.
    fn after_input(&mut self, host: PeerId) {
        let now = self.now;
        let mut transmits = Vec::new();
        let mut events = Vec::new();
        let (timeout, from_incarnation) = {
            let Some(h) = self.hosts.get_mut(&host) else {
                return;
            };
            let Some(machine) = h.machine.as_mut() else {
                return;
            };
            while let Some(transmit) = machine.poll_transmit() {
                transmits.push(transmit);
            }
            while let Some(event) = machine.poll_event() {
                events.push(event);
            }
            (machine.poll_timeout(), h.incarnation)
        };
        for event in events {
            self.log.push(Record {
                at: now,
                host,
                what: Happening::Event(event),
            });
        }
        for (to, msg) in transmits {
            self.transmit(host, from_incarnation, to, msg);
        }
        if let Some(h) = self.hosts.get_mut(&host) {
            if h.timer_at != timeout {
                h.timer_generation += 1;
                h.timer_at = timeout;
                let generation = h.timer_generation;
                if let Some(at) = timeout {
                    self.schedule(at.max(now), Action::Timer { host, generation });
                }
            }
        }
    }

    fn transmit(&mut self, from: PeerId, from_incarnation: u64, to: PeerId, msg: Message) {
        let kind = msg.kind();
        MessageStats::bump(&mut self.stats.sent, kind);
        let delay = self.delay();
        let at = self.now + delay;
        let receiver = self
            .hosts
            .get(&to)
            .filter(|h| h.machine.is_some() && to != from)
            .map(|h| h.incarnation);
        match receiver {
            Some(incarnation) if self.is_connected(from, to) => {
                let lost = self.network.loss_per_million > 0
                    && self.rng.below(1_000_000) < u64::from(self.network.loss_per_million);
                if lost {
                    MessageStats::bump(&mut self.stats.dropped, kind);
                } else {
                    self.schedule(
                        at,
                        Action::Deliver {
                            from,
                            to,
                            incarnation,
                            msg,
                        },
                    );
                }
            }
            _ => {
                MessageStats::bump(&mut self.stats.dropped, kind);
                self.schedule(
                    at,
                    Action::Unreachable {
                        host: from,
                        peer: to,
                        incarnation: from_incarnation,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_its_reference_output() {
        // First outputs of splitmix64 seeded with 0 (Vigna's reference code).
        let mut rng = SimRng::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut rng = SimRng::new(99);
        for _ in 0..1000 {
            assert!(rng.below(7) < 7);
            let d = rng.duration_between(Duration::from_millis(1), Duration::from_millis(3));
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(3));
        }
        assert_eq!(rng.below(0), 0);
    }

    #[test]
    fn terms_close_on_crash_and_do_not_overlap_when_adjacent() {
        let a = Term {
            host: PeerId(1),
            epoch: 1,
            from: Instant::from_nanos(0),
            until: Some(Instant::from_nanos(10)),
        };
        let b = Term {
            host: PeerId(2),
            epoch: 2,
            from: Instant::from_nanos(10),
            until: None,
        };
        assert!(!a.overlaps(&b));
        let c = Term {
            from: Instant::from_nanos(9),
            ..b
        };
        assert!(a.overlaps(&c));
    }
}
