//! The interface every election state machine offers, and the bookkeeping
//! they share.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;

use crate::config::Config;
use crate::message::Message;
use crate::types::{Durable, Event, Instant, Leader, PeerId};

/// A sans-IO leader-election state machine.
///
/// The driver (the [`sim`](crate::sim) simulator, or a transport) feeds it
/// inputs, each stamped with the current time, and after every input drains
/// its outputs:
///
/// * inputs: [`start`](Self::start) once, then any number of
///   [`handle_message`](Self::handle_message),
///   [`handle_timeout`](Self::handle_timeout),
///   [`peer_unreachable`](Self::peer_unreachable) and
///   [`start_election`](Self::start_election);
/// * outputs: [`poll_transmit`](Self::poll_transmit) until `None`,
///   [`poll_event`](Self::poll_event) until `None`, then
///   [`poll_timeout`](Self::poll_timeout) to learn when to call
///   `handle_timeout` next.
///
/// A machine never reads a clock, opens a socket or draws a random number, so
/// a run is a pure function of its inputs. It never panics on any message,
/// from any sender, at any time.
pub trait ElectionAlgorithm: fmt::Debug {
    /// The configuration the machine was built with.
    fn config(&self) -> &Config;

    /// This process.
    fn id(&self) -> PeerId {
        self.config().id()
    }

    /// Starts the machine at `now`. Call once, before any other input. The
    /// default starts an election unless a leader is known already (restored
    /// or announced before the start).
    fn start(&mut self, now: Instant) {
        if self.leader().is_none() {
            self.start_election(now);
        }
    }

    /// A message from `from` arrived at `now`.
    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message);

    /// Time has reached `now`; timers due by then fire. Calling it early or
    /// more often than asked is harmless.
    fn handle_timeout(&mut self, now: Instant);

    /// The transport could not deliver to `peer` (connection refused, no
    /// route). Algorithms that wait for `peer` stop waiting; the ring skips
    /// it.
    fn peer_unreachable(&mut self, now: Instant, peer: PeerId);

    /// The failure detector suspects the current leader (or there is none):
    /// start an election now (candidate/ordinary first waits its tie-break
    /// delay).
    fn start_election(&mut self, now: Instant);

    /// While leading, this process heard that `other` claims to lead too. The
    /// default starts an election when `other` outranks this process, which
    /// resolves the conflict for every rank-based algorithm.
    fn leader_conflict(&mut self, now: Instant, other: PeerId) {
        if other > self.id() {
            self.start_election(now);
        }
    }

    /// The next message to send, if any.
    fn poll_transmit(&mut self) -> Option<(PeerId, Message)>;

    /// When `handle_timeout` should next be called, if ever.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next event, if any. Events mirror every change of
    /// [`leader`](Self::leader).
    fn poll_event(&mut self) -> Option<Event>;

    /// The leader this process currently follows (possibly itself).
    fn leader(&self) -> Option<Leader>;

    /// State to persist across a crash; see [`Durable`].
    fn durable(&self) -> Durable {
        Durable::default()
    }

    /// Hands back persisted state after a restart, before `start`.
    fn restore(&mut self, durable: Durable) {
        let _ = durable;
    }
}

impl<A: ElectionAlgorithm + ?Sized> ElectionAlgorithm for Box<A> {
    fn config(&self) -> &Config {
        (**self).config()
    }
    fn id(&self) -> PeerId {
        (**self).id()
    }
    fn start(&mut self, now: Instant) {
        (**self).start(now)
    }
    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        (**self).handle_message(now, from, msg)
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now)
    }
    fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
        (**self).peer_unreachable(now, peer)
    }
    fn start_election(&mut self, now: Instant) {
        (**self).start_election(now)
    }
    fn leader_conflict(&mut self, now: Instant, other: PeerId) {
        (**self).leader_conflict(now, other)
    }
    fn poll_transmit(&mut self) -> Option<(PeerId, Message)> {
        (**self).poll_transmit()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn poll_event(&mut self) -> Option<Event> {
        (**self).poll_event()
    }
    fn leader(&self) -> Option<Leader> {
        (**self).leader()
    }
    fn durable(&self) -> Durable {
        (**self).durable()
    }
    fn restore(&mut self, durable: Durable) {
        (**self).restore(durable)
    }
}

/// Queued outputs plus the leader view whose changes become events.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    transmits: VecDeque<(PeerId, Message)>,
    events: VecDeque<Event>,
    view: Option<Leader>,
}

impl Outbox {
    pub(crate) fn send(&mut self, to: PeerId, msg: Message) {
        self.transmits.push_back((to, msg));
    }

    pub(crate) fn leader(&self) -> Option<Leader> {
        self.view
    }

    /// Changes the view, queueing the event that describes the change.
    pub(crate) fn set_leader(&mut self, leader: Option<Leader>) {
        if leader == self.view {
            return;
        }
        match leader {
            Some(new) => self.events.push_back(Event::LeaderChanged {
                leader: new.id,
                epoch: new.epoch,
            }),
            None => {
                if let Some(old) = self.view {
                    self.events
                        .push_back(Event::LeaderLost { epoch: old.epoch });
                }
            }
        }
        self.view = leader;
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<(PeerId, Message)> {
        self.transmits.pop_front()
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

/// The output half of [`ElectionAlgorithm`] (`poll_transmit`, `poll_event`,
/// `leader`) for a machine whose outputs queue in the [`Outbox`] at
/// `self.<field path>`; used inside the trait impl.
macro_rules! outbox_outputs {
    ($($field:tt).+) => {
        fn poll_transmit(&mut self) -> Option<(PeerId, Message)> {
            self.$($field).+.poll_transmit()
        }
        $crate::machine::outbox_view!($($field).+);
    };
}
pub(crate) use outbox_outputs;

/// `poll_event` and `leader` of [`ElectionAlgorithm`] for a machine whose
/// leader view is the [`Outbox`] at `self.<field path>` (part of
/// [`outbox_outputs`], alone for a wrapper that relays its messages).
macro_rules! outbox_view {
    ($($field:tt).+) => {
        fn poll_event(&mut self) -> Option<Event> {
            self.$($field).+.poll_event()
        }
        fn leader(&self) -> Option<Leader> {
            self.$($field).+.leader()
        }
    };
}
pub(crate) use outbox_view;

/// The part of [`ElectionAlgorithm`] a wrapper (heartbeat, quorum guard) passes
/// to the machine it wraps at `self.inner`: `config` is the wrapped machine's;
/// `peer_unreachable`, `start_election` and `leader_conflict` reach it (only
/// while `self.<gate>()` holds, when a gate is named), after which the wrapper
/// follows its view with `self.sync(now)`; `poll_transmit` sends the wrapped
/// machine's messages first, then the wrapper's own in `self.transmits`. Used
/// inside the trait impl.
macro_rules! wrapper_inputs {
    ($($gate:ident)?) => {
        fn config(&self) -> &Config {
            self.inner.config()
        }

        fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
            if true $(&& self.$gate())? {
                self.inner.peer_unreachable(now, peer);
            }
            self.sync(now);
        }

        fn start_election(&mut self, now: Instant) {
            if true $(&& self.$gate())? {
                self.inner.start_election(now);
            }
            self.sync(now);
        }

        fn leader_conflict(&mut self, now: Instant, other: PeerId) {
            if true $(&& self.$gate())? {
                self.inner.leader_conflict(now, other);
            }
            self.sync(now);
        }

        fn poll_transmit(&mut self) -> Option<(PeerId, Message)> {
            self.transmits.poll_after(&mut self.inner)
        }
    };
}
pub(crate) use wrapper_inputs;

/// A wrapper's own messages (heartbeats, quorum traffic), sent after those
/// of the machine it wraps.
#[derive(Debug, Default)]
pub(crate) struct Relay(VecDeque<(PeerId, Message)>);

impl Relay {
    pub(crate) fn send(&mut self, to: PeerId, msg: Message) {
        self.0.push_back((to, msg));
    }

    /// Queues `msg` for every member of `config` but this process.
    pub(crate) fn send_to_others(&mut self, config: &Config, msg: &Message) {
        for peer in config.others() {
            self.send(peer, msg.clone());
        }
    }

    /// The next message to send: the wrapped machine's first, then these.
    pub(crate) fn poll_after(
        &mut self,
        inner: &mut impl ElectionAlgorithm,
    ) -> Option<(PeerId, Message)> {
        inner.poll_transmit().or_else(|| self.0.pop_front())
    }
}

/// One optional deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Timer(Option<Instant>);

impl Timer {
    pub(crate) fn set(&mut self, at: Instant) {
        self.0 = Some(at);
    }

    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    pub(crate) fn at(self) -> Option<Instant> {
        self.0
    }

    pub(crate) fn is_set(self) -> bool {
        self.0.is_some()
    }

    /// True (and cleared) when the deadline has passed by `now`.
    pub(crate) fn fire(&mut self, now: Instant) -> bool {
        match self.0 {
            Some(at) if at <= now => {
                self.0 = None;
                true
            }
            _ => false,
        }
    }
}

/// An election round's answers: `Election` went to `asked`, and the round is
/// complete once each of them has answered `Alive` or been reported
/// unreachable.
#[derive(Debug)]
pub(crate) struct Ballot {
    epoch: u64,
    asked: BTreeSet<PeerId>,
    alive: BTreeSet<PeerId>,
    unreachable: BTreeSet<PeerId>,
}

impl Ballot {
    /// Sends `Election { epoch }` to every process in `asked`.
    pub(crate) fn open(out: &mut Outbox, epoch: u64, asked: BTreeSet<PeerId>) -> Self {
        for peer in &asked {
            out.send(*peer, Message::Election { epoch });
        }
        Ballot {
            epoch,
            asked,
            alive: BTreeSet::new(),
            unreachable: BTreeSet::new(),
        }
    }

    /// Counts `Alive { epoch }` from `from` if it answers this round; true
    /// when that completes the round.
    pub(crate) fn alive(&mut self, epoch: u64, from: PeerId) -> bool {
        if epoch != self.epoch || !self.asked.contains(&from) {
            return false;
        }
        self.alive.insert(from);
        self.is_complete()
    }

    /// Counts `peer` out if it was asked; true when that completes the round.
    pub(crate) fn unreachable(&mut self, peer: PeerId) -> bool {
        if !self.asked.contains(&peer) {
            return false;
        }
        self.unreachable.insert(peer);
        self.is_complete()
    }

    /// Every asked process answered or is unreachable.
    pub(crate) fn is_complete(&self) -> bool {
        self.alive.len() + self.unreachable.len() >= self.asked.len()
    }

    /// The round's epoch and the processes that answered `Alive`.
    pub(crate) fn close(self) -> (u64, BTreeSet<PeerId>) {
        (self.epoch, self.alive)
    }
}

/// Waiting for a leader of at least some epoch to be announced by a
/// deadline.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Watch {
    epoch: u64,
    timer: Timer,
}

impl Watch {
    /// Waits until `deadline` for a leader of `epoch` or later (or of the
    /// highest epoch waited for so far).
    pub(crate) fn set(&mut self, deadline: Instant, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
        self.timer.set(deadline);
    }

    /// Stops waiting.
    pub(crate) fn clear(&mut self) {
        self.timer.clear();
    }

    /// Stops waiting if `epoch` is one waited for.
    pub(crate) fn settle(&mut self, epoch: u64) {
        if epoch >= self.epoch {
            self.timer.clear();
        }
    }

    pub(crate) fn at(self) -> Option<Instant> {
        self.timer.at()
    }

    /// True (and cleared) when the deadline passed by `now` while `leader`
    /// is none, or of an earlier epoch than the one waited for.
    pub(crate) fn lapsed(&mut self, now: Instant, leader: Option<Leader>) -> bool {
        self.timer.fire(now) && leader.is_none_or(|l| l.epoch < self.epoch)
    }
}

/// The earliest of several optional deadlines.
pub(crate) fn earliest(deadlines: impl IntoIterator<Item = Option<Instant>>) -> Option<Instant> {
    deadlines.into_iter().flatten().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Implements only the required methods; counts elections started.
    #[derive(Debug)]
    struct Minimal {
        config: Config,
        out: Outbox,
        elections: u32,
    }

    impl ElectionAlgorithm for Minimal {
        fn config(&self) -> &Config {
            &self.config
        }
        fn handle_message(&mut self, _: Instant, _: PeerId, _: Message) {}
        fn handle_timeout(&mut self, _: Instant) {}
        fn peer_unreachable(&mut self, _: Instant, _: PeerId) {}
        fn start_election(&mut self, _: Instant) {
            self.elections += 1;
        }
        fn poll_timeout(&self) -> Option<Instant> {
            None
        }
        outbox_outputs!(out);
    }

    fn minimal() -> Minimal {
        let config = Config::new(PeerId(1), [PeerId(1), PeerId(2)]).unwrap();
        Minimal {
            config,
            out: Outbox::default(),
            elections: 0,
        }
    }

    #[test]
    fn default_start_elects_only_without_a_leader() {
        let mut m = minimal();
        m.start(Instant::ZERO);
        assert_eq!(m.elections, 1);
        let mut m = minimal();
        m.out.set_leader(Some(Leader {
            id: PeerId(2),
            epoch: 1,
        }));
        m.start(Instant::ZERO);
        assert_eq!(m.elections, 0);
        assert_eq!(m.leader().map(|l| l.id), Some(PeerId(2)));
    }

    #[test]
    fn a_ballot_completes_when_every_asked_process_is_accounted_for() {
        let mut out = Outbox::default();
        let mut b = Ballot::open(&mut out, 4, BTreeSet::from([PeerId(2), PeerId(3)]));
        let sent: Vec<_> = std::iter::from_fn(|| out.poll_transmit()).collect();
        assert_eq!(
            sent,
            vec![
                (PeerId(2), Message::Election { epoch: 4 }),
                (PeerId(3), Message::Election { epoch: 4 })
            ]
        );
        assert!(!b.alive(3, PeerId(2)), "another round's answer");
        assert!(!b.alive(4, PeerId(9)), "not asked");
        assert!(!b.unreachable(PeerId(9)), "not asked");
        assert!(!b.alive(4, PeerId(2)));
        assert!(b.unreachable(PeerId(3)));
        assert_eq!(b.close(), (4, BTreeSet::from([PeerId(2)])));
    }

    #[test]
    fn a_watch_lapses_only_without_a_leader_of_the_awaited_epoch() {
        let t = Instant::ZERO + std::time::Duration::from_secs(1);
        let leader = |epoch| {
            Some(Leader {
                id: PeerId(2),
                epoch,
            })
        };
        let mut w = Watch::default();
        w.set(t, 5);
        w.set(t, 3);
        assert!(!w.lapsed(Instant::ZERO, None), "not due yet");
        assert!(w.lapsed(t, leader(4)), "the highest epoch awaited stands");
        w.set(t, 5);
        assert!(!w.lapsed(t, leader(5)));
        assert_eq!(w.at(), None, "fired");
        w.set(t, 5);
        w.settle(4);
        assert_eq!(w.at(), Some(t));
        w.settle(5);
        assert_eq!(w.at(), None);
    }
}
