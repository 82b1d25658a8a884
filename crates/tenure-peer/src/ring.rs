//! The ring algorithm (Chang & Roberts 1979), alive-set and max-only variants.

use crate::config::Config;
use crate::machine::{earliest, outbox_outputs, ElectionAlgorithm, Outbox, Timer, Watch};
use crate::message::Message;
use crate::types::{Event, Instant, Leader, PeerId};

/// Bound on remembered hand-offs kept for skipping unreachable successors.
const MAX_REMEMBERED_FORWARDS: usize = 16;

/// What a ring election message carries around the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingVariant {
    /// Every process on the way adds itself; the initiator elects the highest
    /// rank of the set, and the announcement travels only through the set.
    AliveSet,
    /// Only the highest rank seen so far travels; the announcement goes around
    /// the whole ring again, skipping unreachable processes anew.
    MaxOnly,
}

/// Ring election.
///
/// Processes form a ring in ascending rank order (the highest rank's successor
/// is the lowest). The initiator sends `RingElection` to its successor; each
/// process adds itself (or raises the carried maximum) and hands the message
/// to its successor. When the transport reports a successor unreachable, the
/// process hands the same message to the next one, until one accepts (a
/// report arriving more than `answer_timeout` after the hand-off is ignored). When
/// the message returns to the initiator, the highest rank in it leads and a
/// second round, `RingElected`, carries the result around back to the
/// initiator.
///
/// Concurrent initiators: a process running its own round drops election
/// messages of rounds that rank below its own (by epoch, then initiator); a
/// message that has made more hops than there are members is dropped. The
/// initiator restarts when its round has not returned within
/// `round_timeout`; a process that handed a round on starts its own when no
/// announcement follows within `round_timeout`.
///
/// Messages for one election with `l` live processes and `u` unreachable
/// ones in the ring: `l + u` for the first round (each unreachable process
/// costs one failed hand-off), then `l` (alive-set) or `l + u` (max-only) for
/// the second.
#[derive(Debug)]
pub struct Ring {
    config: Config,
    variant: RingVariant,
    out: Outbox,
    max_epoch: u64,
    /// The epoch of this process's own round, while it runs.
    round: Option<u64>,
    round_timer: Timer,
    /// Waiting for the announcement of a round this process handed on.
    watch: Watch,
    forwards: Vec<(PeerId, Instant, Message)>,
    last_live: Vec<PeerId>,
}

impl Ring {
    /// A ring machine for `config` using `variant`.
    pub fn new(config: Config, variant: RingVariant) -> Self {
        Ring {
            config,
            variant,
            out: Outbox::default(),
            max_epoch: 0,
            round: None,
            round_timer: Timer::default(),
            watch: Watch::default(),
            forwards: Vec::new(),
            last_live: Vec::new(),
        }
    }

    /// The variant this machine runs.
    pub fn variant(&self) -> RingVariant {
        self.variant
    }

    /// The set carried by the last round this process completed or saw
    /// announced, in visiting order starting at the initiator (alive-set
    /// variant; empty in the max-only variant).
    pub fn last_live_set(&self) -> &[PeerId] {
        &self.last_live
    }

    fn hop_limit(&self) -> u32 {
        u32::try_from(self.config.members().len()).unwrap_or(u32::MAX)
    }

    /// The first member after `after` in ring order that `accept` admits.
    fn next_after(&self, after: PeerId, accept: impl Fn(PeerId) -> bool) -> Option<PeerId> {
        let ring = self.config.members();
        let start = ring.iter().position(|p| *p > after).unwrap_or(0);
        ring.iter()
            .cycle()
            .skip(start)
            .take(ring.len())
            .copied()
            .find(|p| *p != after && accept(*p))
    }

    /// Where `msg` goes after `after` (the sender itself, or a process that
    /// turned out unreachable).
    fn next_hop(&self, msg: &Message, after: PeerId) -> Option<PeerId> {
        match msg {
            Message::RingElected { live, .. } if !live.is_empty() => {
                self.next_after(after, |p| live.contains(&p))
            }
            _ => self.next_after(after, |_| true),
        }
    }

    /// Hand-offs are remembered for `answer_timeout`: an unreachable report
    /// later than that is ignored, and the round timeout takes over.
    fn forget_old_forwards(&mut self, now: Instant) {
        let horizon = self.config.timing().answer_timeout;
        self.forwards
            .retain(|(_, at, _)| now.saturating_duration_since(*at) < horizon);
    }

    fn dispatch(&mut self, now: Instant, dest: Option<PeerId>, msg: Message) {
        let me = self.config.id();
        match dest {
            Some(dest) if dest != me => {
                self.forget_old_forwards(now);
                if self.forwards.len() >= MAX_REMEMBERED_FORWARDS {
                    self.forwards.remove(0);
                }
                self.forwards.push((dest, now, msg.clone()));
                self.out.send(dest, msg);
            }
            _ => {
                // Nobody else is reachable: the message is back here.
                if let Message::RingElection {
                    initiator,
                    epoch,
                    live,
                    ..
                } = msg
                {
                    if initiator == me && self.round == Some(epoch) {
                        self.complete_round(now, epoch, live);
                    }
                }
            }
        }
    }

    fn complete_round(&mut self, now: Instant, epoch: u64, mut live: Vec<PeerId>) {
        let me = self.config.id();
        live.retain(|p| self.config.is_member(*p));
        self.round = None;
        self.round_timer.clear();
        self.watch.clear();
        let leader = live.iter().copied().max().unwrap_or(me).max(me);
        let live = match self.variant {
            RingVariant::AliveSet => live,
            RingVariant::MaxOnly => Vec::new(),
        };
        self.last_live = live.clone();
        self.out.set_leader(Some(Leader { id: leader, epoch }));
        let msg = Message::RingElected {
            initiator: me,
            leader,
            epoch,
            hops: 1,
            live,
        };
        let dest = self.next_hop(&msg, me);
        // The announcement ends when it is back here; nothing to do then.
        if dest.is_some_and(|d| d != me) {
            self.dispatch(now, dest, msg);
        }
    }

    fn on_election(
        &mut self,
        now: Instant,
        initiator: PeerId,
        epoch: u64,
        hops: u32,
        mut live: Vec<PeerId>,
    ) {
        let me = self.config.id();
        self.max_epoch = self.max_epoch.max(epoch);
        if initiator == me {
            if self.round == Some(epoch) {
                self.complete_round(now, epoch, live);
            }
            return;
        }
        if hops > self.hop_limit() || !self.config.is_member(initiator) {
            return;
        }
        live.retain(|p| self.config.is_member(*p));
        if let Some(mine) = self.round {
            if (mine, me) > (epoch, initiator) {
                return;
            }
        }
        match self.variant {
            RingVariant::AliveSet => {
                if live.contains(&me) {
                    return;
                }
                live.push(me);
            }
            RingVariant::MaxOnly => {
                let max = live.iter().copied().max().unwrap_or(me).max(me);
                live = vec![max];
            }
        }
        self.watch
            .set(now + self.config.timing().round_timeout, epoch);
        let msg = Message::RingElection {
            initiator,
            epoch,
            hops: hops.saturating_add(1),
            live,
        };
        let dest = self.next_hop(&msg, me);
        self.dispatch(now, dest, msg);
    }

    fn on_elected(
        &mut self,
        now: Instant,
        initiator: PeerId,
        leader: PeerId,
        epoch: u64,
        hops: u32,
        live: Vec<PeerId>,
    ) {
        let me = self.config.id();
        self.max_epoch = self.max_epoch.max(epoch);
        if initiator == me || hops > self.hop_limit() || !self.config.is_member(leader) {
            return;
        }
        let stale = self
            .out
            .leader()
            .is_some_and(|view| (epoch, leader) < (view.epoch, view.id));
        if !stale {
            if self.round.is_some_and(|mine| mine <= epoch) {
                self.round = None;
                self.round_timer.clear();
            }
            self.watch.settle(epoch);
            self.last_live = live.clone();
            self.out.set_leader(Some(Leader { id: leader, epoch }));
        }
        let msg = Message::RingElected {
            initiator,
            leader,
            epoch,
            hops: hops.saturating_add(1),
            live,
        };
        let dest = self.next_hop(&msg, me);
        if dest.is_some_and(|d| d != me) {
            self.dispatch(now, dest, msg);
        }
    }
}

impl ElectionAlgorithm for Ring {
    fn config(&self) -> &Config {
        &self.config
    }

    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        if !self.config.is_other_member(from) {
            return;
        }
        match msg {
            Message::RingElection {
                initiator,
                epoch,
                hops,
                live,
            } => self.on_election(now, initiator, epoch, hops, live),
            Message::RingElected {
                initiator,
                leader,
                epoch,
                hops,
                live,
            } => self.on_elected(now, initiator, leader, epoch, hops, live),
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.round_timer.fire(now) {
            self.round = None;
            self.start_election(now);
        }
        if self.watch.lapsed(now, self.out.leader()) && self.round.is_none() {
            self.start_election(now);
        }
    }

    fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
        self.forget_old_forwards(now);
        let mut retry = Vec::new();
        self.forwards.retain(|(dest, _, msg)| {
            if *dest == peer {
                retry.push(msg.clone());
                false
            } else {
                true
            }
        });
        for msg in retry {
            let dest = self.next_hop(&msg, peer);
            self.dispatch(now, dest, msg);
        }
    }

    fn start_election(&mut self, now: Instant) {
        let me = self.config.id();
        self.out.set_leader(None);
        self.max_epoch = self.max_epoch.saturating_add(1);
        let epoch = self.max_epoch;
        self.round = Some(epoch);
        self.round_timer
            .set(now + self.config.timing().round_timeout);
        let msg = Message::RingElection {
            initiator: me,
            epoch,
            hops: 1,
            live: vec![me],
        };
        let dest = self.next_hop(&msg, me);
        self.dispatch(now, dest, msg);
    }

    outbox_outputs!(out);

    fn poll_timeout(&self) -> Option<Instant> {
        earliest([self.round_timer.at(), self.watch.at()])
    }
}
