//! The bully algorithm (compact variant) and next-in-line failover, which
//! extends it.

use std::collections::{BTreeSet, VecDeque};

use crate::config::Config;
use crate::machine::{earliest, outbox_outputs, Ballot, ElectionAlgorithm, Outbox, Timer, Watch};
use crate::message::Message;
use crate::types::{Event, Instant, Leader, PeerId};

/// How many failover alternatives a [`NextInLine`] leader publishes unless
/// told otherwise.
pub const DEFAULT_ALTERNATIVES: usize = 2;

#[derive(Debug)]
enum Phase {
    Idle,
    /// Sent `Election` to every higher rank; collecting `Alive`.
    Collecting(Ballot),
    /// Nominated the highest responder; waiting for its announcement.
    Nominated {
        epoch: u64,
        nominee: PeerId,
        /// Other responders, highest first, in case the nominee is gone.
        spares: VecDeque<PeerId>,
    },
    /// Next-in-line: asked `target` to take over; waiting for `Alive`.
    Failover {
        epoch: u64,
        target: PeerId,
        remaining: VecDeque<PeerId>,
    },
}

/// The shared machinery; `next_in_line` switches on failover lists.
#[derive(Debug)]
struct BullyCore {
    config: Config,
    out: Outbox,
    /// `Some(n)`: next-in-line mode publishing `n` alternatives.
    next_in_line: Option<usize>,
    max_epoch: u64,
    alternatives: Vec<PeerId>,
    phase: Phase,
    answer_timer: Timer,
    /// Waiting for an announcement.
    watch: Watch,
}

impl BullyCore {
    fn new(config: Config, next_in_line: Option<usize>) -> Self {
        BullyCore {
            config,
            out: Outbox::default(),
            next_in_line,
            max_epoch: 0,
            alternatives: Vec::new(),
            phase: Phase::Idle,
            answer_timer: Timer::default(),
            watch: Watch::default(),
        }
    }

    fn me(&self) -> PeerId {
        self.config.id()
    }

    fn next_epoch(&mut self) -> u64 {
        self.max_epoch = self.max_epoch.saturating_add(1);
        self.max_epoch
    }

    fn see_epoch(&mut self, epoch: u64) {
        self.max_epoch = self.max_epoch.max(epoch);
    }

    fn await_announcement(&mut self, now: Instant, epoch: u64) {
        self.watch
            .set(now + self.config.timing().announce_timeout, epoch);
    }

    fn start_election(&mut self, now: Instant) {
        let previous = self.out.leader();
        self.out.set_leader(None);
        if self.next_in_line.is_some() {
            if let Some(prev) = previous.filter(|l| l.id != self.me()) {
                let alternatives: VecDeque<PeerId> = self
                    .alternatives
                    .iter()
                    .copied()
                    .filter(|p| *p != prev.id)
                    .collect();
                if !alternatives.is_empty() {
                    let epoch = self.next_epoch();
                    self.try_failover(now, epoch, alternatives);
                    return;
                }
            }
        }
        self.bully_round(now);
    }

    /// Step 1: `Election` to every higher rank.
    fn bully_round(&mut self, now: Instant) {
        let epoch = self.next_epoch();
        let me = self.me();
        let asked: BTreeSet<PeerId> = self.config.others().filter(|p| *p > me).collect();
        if asked.is_empty() {
            self.announce(epoch);
            return;
        }
        self.phase = Phase::Collecting(Ballot::open(&mut self.out, epoch, asked));
        self.answer_timer
            .set(now + self.config.timing().answer_timeout);
    }

    /// Step 2 ends: pick the highest responder, or lead when none answered.
    fn decide(&mut self, now: Instant) {
        let Phase::Collecting(ballot) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        self.answer_timer.clear();
        let (epoch, alive) = ballot.close();
        let spares: VecDeque<PeerId> = alive.into_iter().rev().collect();
        self.nominate_next(now, epoch, spares);
    }

    fn nominate_next(&mut self, now: Instant, epoch: u64, mut spares: VecDeque<PeerId>) {
        match spares.pop_front() {
            None => self.announce(epoch),
            Some(nominee) => {
                self.out.send(nominee, Message::Nominate { epoch });
                self.phase = Phase::Nominated {
                    epoch,
                    nominee,
                    spares,
                };
                self.await_announcement(now, epoch);
            }
        }
    }

    fn try_failover(&mut self, now: Instant, epoch: u64, mut remaining: VecDeque<PeerId>) {
        match remaining.pop_front() {
            None => self.bully_round(now),
            Some(target) if target == self.me() => self.announce(epoch),
            Some(target) => {
                self.out.send(target, Message::Failover { epoch });
                self.phase = Phase::Failover {
                    epoch,
                    target,
                    remaining,
                };
                self.answer_timer
                    .set(now + self.config.timing().answer_timeout);
            }
        }
    }

    /// Step 3: tell the others that this process leads.
    fn announce(&mut self, epoch: u64) {
        let me = self.me();
        let epoch = epoch.max(self.max_epoch);
        self.see_epoch(epoch);
        self.phase = Phase::Idle;
        self.answer_timer.clear();
        self.watch.clear();
        let alternatives: Vec<PeerId> = match self.next_in_line {
            Some(count) => self
                .config
                .members()
                .iter()
                .rev()
                .copied()
                .filter(|p| *p < me)
                .take(count)
                .collect(),
            None => Vec::new(),
        };
        self.alternatives = alternatives.clone();
        self.out.set_leader(Some(Leader { id: me, epoch }));
        let everyone = self.next_in_line.is_some();
        let targets: Vec<PeerId> = self
            .config
            .others()
            .filter(|p| everyone || *p < me)
            .collect();
        for peer in targets {
            self.out.send(
                peer,
                Message::Elected {
                    leader: me,
                    epoch,
                    alternatives: alternatives.clone(),
                },
            );
        }
    }

    fn leads_at_least(&self, epoch: u64) -> bool {
        self.out
            .leader()
            .is_some_and(|l| l.id == self.me() && l.epoch >= epoch)
    }

    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        if !self.config.is_other_member(from) {
            return;
        }
        match msg {
            Message::Election { epoch } => {
                self.see_epoch(epoch);
                if from < self.me() {
                    self.out.send(from, Message::Alive { epoch });
                    if !self.leads_at_least(epoch) {
                        self.await_announcement(now, epoch);
                    }
                }
            }
            Message::Alive { epoch } => self.on_alive(now, from, epoch),
            Message::Nominate { epoch } => {
                self.see_epoch(epoch);
                if !self.leads_at_least(epoch) {
                    self.announce(epoch);
                } else if let Some(view) = self.out.leader() {
                    // Already leading: the nominator missed the announcement
                    // (it joined late, or stood by); repeat it to it alone.
                    self.out.send(
                        from,
                        Message::Elected {
                            leader: view.id,
                            epoch: view.epoch,
                            alternatives: self.alternatives.clone(),
                        },
                    );
                }
            }
            Message::Failover { epoch } => {
                self.see_epoch(epoch);
                self.out.send(from, Message::Alive { epoch });
                if !self.leads_at_least(epoch) {
                    self.announce(epoch);
                }
            }
            Message::Elected {
                leader,
                epoch,
                alternatives,
            } => self.on_elected(now, from, leader, epoch, alternatives),
            _ => {}
        }
    }

    fn on_alive(&mut self, now: Instant, from: PeerId, epoch: u64) {
        if let Phase::Collecting(ballot) = &mut self.phase {
            if ballot.alive(epoch, from) {
                self.decide(now);
            }
            return;
        }
        match &self.phase {
            Phase::Failover {
                epoch: current,
                target,
                ..
            } if *current == epoch && *target == from => {
                self.phase = Phase::Idle;
                self.answer_timer.clear();
                self.await_announcement(now, epoch);
            }
            _ => {}
        }
    }

    fn on_elected(
        &mut self,
        now: Instant,
        from: PeerId,
        leader: PeerId,
        epoch: u64,
        alternatives: Vec<PeerId>,
    ) {
        self.see_epoch(epoch);
        // Only the leader itself announces its leadership.
        if leader != from {
            return;
        }
        if let Some(view) = self.out.leader() {
            if (epoch, leader) < (view.epoch, view.id) {
                return;
            }
        }
        if leader < self.me() {
            // A lower rank claims to lead while this process is alive: bully it.
            if !matches!(self.phase, Phase::Collecting { .. }) {
                self.out.set_leader(None);
                self.bully_round(now);
            }
            return;
        }
        self.phase = Phase::Idle;
        self.answer_timer.clear();
        self.watch.clear();
        self.alternatives = alternatives
            .into_iter()
            .filter(|p| self.config.is_member(*p))
            .collect();
        self.out.set_leader(Some(Leader { id: leader, epoch }));
    }

    fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
        if let Phase::Collecting(ballot) = &mut self.phase {
            if ballot.unreachable(peer) {
                self.decide(now);
            }
            return;
        }
        match &self.phase {
            Phase::Nominated { nominee, .. } if *nominee == peer => {
                if let Phase::Nominated { epoch, spares, .. } =
                    std::mem::replace(&mut self.phase, Phase::Idle)
                {
                    self.watch.clear();
                    self.nominate_next(now, epoch, spares);
                }
            }
            Phase::Failover { target, .. } if *target == peer => {
                if let Phase::Failover {
                    epoch, remaining, ..
                } = std::mem::replace(&mut self.phase, Phase::Idle)
                {
                    self.try_failover(now, epoch, remaining);
                }
            }
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.answer_timer.fire(now) {
            match std::mem::replace(&mut self.phase, Phase::Idle) {
                phase @ Phase::Collecting { .. } => {
                    self.phase = phase;
                    self.decide(now);
                }
                Phase::Failover {
                    epoch, remaining, ..
                } => self.try_failover(now, epoch, remaining),
                other => self.phase = other,
            }
        }
        if self.watch.lapsed(now, self.out.leader()) {
            self.phase = Phase::Idle;
            self.answer_timer.clear();
            self.out.set_leader(None);
            self.bully_round(now);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        earliest([self.answer_timer.at(), self.watch.at()])
    }
}

macro_rules! delegate_to_core {
    ($ty:ty) => {
        impl ElectionAlgorithm for $ty {
            fn config(&self) -> &Config {
                &self.0.config
            }
            fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
                self.0.handle_message(now, from, msg)
            }
            fn handle_timeout(&mut self, now: Instant) {
                self.0.handle_timeout(now)
            }
            fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
                self.0.peer_unreachable(now, peer)
            }
            fn start_election(&mut self, now: Instant) {
                self.0.start_election(now)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                self.0.poll_timeout()
            }
            outbox_outputs!(0.out);
        }
    };
}

/// The bully algorithm in its compact form (Kordafshari 2005).
///
/// 1. The initiator sends `Election` to every higher rank.
/// 2. It collects `Alive` answers until every asked process has answered or
///    been reported unreachable, or `answer_timeout` passes. With no answer it
///    goes to step 3 itself; otherwise it sends `Nominate` to the
///    highest-ranked responder, which does step 3.
/// 3. The process that knows of no live higher rank sends `Elected` to every
///    lower rank.
///
/// A process that answered `Alive` (or nominated someone) starts its own
/// election if no announcement follows within `announce_timeout`; a process
/// that hears a lower rank announce itself starts one too.
///
/// Messages for one election whose initiator has `h` higher ranks, `a` of
/// which answer, won by a process with `l` lower ranks: `h + a + 1 + l`
/// (`h + l` when nobody answers and the initiator leads). That is O(n) for one
/// initiator and O(n²) when every process starts an election at once.
#[derive(Debug)]
pub struct Bully(BullyCore);

impl Bully {
    /// A bully machine for `config`.
    pub fn new(config: Config) -> Self {
        Bully(BullyCore::new(config, None))
    }
}

delegate_to_core!(Bully);

/// Next-in-line failover (Gholipour 2009) on top of the bully algorithm.
///
/// Every leader's `Elected` carries an ordered list of failover alternatives
/// (the next ranks below it, [`DEFAULT_ALTERNATIVES`] unless set) and goes to
/// every other process. A process that suspects the leader sends `Failover` to
/// the first alternative; the alternative answers `Alive` and announces itself
/// to everyone, without a full election round. If the process is itself the
/// first alternative it announces at once; an alternative that does not answer
/// within `answer_timeout`, or is unreachable, is skipped; with the list
/// exhausted the process falls back to a bully election. With a live first
/// alternative an election costs `2 + (n − 1)` messages.
#[derive(Debug)]
pub struct NextInLine(BullyCore);

impl NextInLine {
    /// A next-in-line machine publishing [`DEFAULT_ALTERNATIVES`] alternatives.
    pub fn new(config: Config) -> Self {
        Self::with_alternatives(config, DEFAULT_ALTERNATIVES)
    }

    /// A next-in-line machine publishing `count` alternatives when it leads.
    pub fn with_alternatives(config: Config, count: usize) -> Self {
        NextInLine(BullyCore::new(config, Some(count)))
    }

    /// The failover list published by the current leader.
    pub fn alternatives(&self) -> &[PeerId] {
        &self.0.alternatives
    }
}

delegate_to_core!(NextInLine);
