//! A heartbeat failure detector that wraps any election algorithm.

use crate::config::Config;
use crate::machine::{earliest, wrapper_inputs, ElectionAlgorithm, Relay, Timer};
use crate::message::Message;
use crate::types::{Durable, Event, Instant, Leader, PeerId};

/// Heartbeat failure detection around an election algorithm.
///
/// While the wrapped algorithm says this process leads, it sends `Heartbeat`
/// to every other member each `heartbeat_interval` (and once at once when it
/// starts leading). A process that follows a leader and hears no heartbeat
/// from it for `leader_timeout` calls the algorithm's
/// [`start_election`](ElectionAlgorithm::start_election). A leader that hears
/// a heartbeat from another process reports it through
/// [`leader_conflict`](ElectionAlgorithm::leader_conflict), which is how two
/// leaders left over from a healed partition settle on one.
///
/// Cost: `n − 1` messages per `heartbeat_interval` per leader. Everything
/// else passes through unchanged; `Heartbeat` messages never reach the
/// wrapped algorithm.
#[derive(Debug)]
pub struct Heartbeat<A> {
    inner: A,
    transmits: Relay,
    followed: Option<Leader>,
    beat_timer: Timer,
    silence_timer: Timer,
}

impl<A: ElectionAlgorithm> Heartbeat<A> {
    /// Wraps `inner`.
    pub fn new(inner: A) -> Self {
        Heartbeat {
            inner,
            transmits: Relay::default(),
            followed: None,
            beat_timer: Timer::default(),
            silence_timer: Timer::default(),
        }
    }

    /// The wrapped algorithm.
    pub fn get_ref(&self) -> &A {
        &self.inner
    }

    /// Unwraps the algorithm.
    pub fn into_inner(self) -> A {
        self.inner
    }

    fn beat(&mut self, now: Instant, epoch: u64) {
        self.transmits
            .send_to_others(self.inner.config(), &Message::Heartbeat { epoch });
        self.beat_timer
            .set(now + self.inner.config().timing().heartbeat_interval);
    }

    /// Follows the algorithm's leader view after every input.
    fn sync(&mut self, now: Instant) {
        let current = self.inner.leader();
        if current == self.followed {
            return;
        }
        self.followed = current;
        let me = self.inner.id();
        match current {
            Some(leader) if leader.id == me => {
                self.silence_timer.clear();
                self.beat(now, leader.epoch);
            }
            Some(_) => {
                self.beat_timer.clear();
                self.silence_timer
                    .set(now + self.inner.config().timing().leader_timeout);
            }
            None => {
                self.beat_timer.clear();
                self.silence_timer.clear();
            }
        }
    }
}

impl<A: ElectionAlgorithm> ElectionAlgorithm for Heartbeat<A> {
    wrapper_inputs!();

    fn start(&mut self, now: Instant) {
        self.inner.start(now);
        self.sync(now);
    }

    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        if let Message::Heartbeat { .. } = msg {
            let me = self.inner.id();
            match self.followed {
                Some(leader) if leader.id == from => {
                    self.silence_timer
                        .set(now + self.inner.config().timing().leader_timeout);
                }
                Some(leader) if leader.id == me && self.inner.config().is_other_member(from) => {
                    self.inner.leader_conflict(now, from);
                }
                _ => {}
            }
        } else {
            self.inner.handle_message(now, from, msg);
        }
        self.sync(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now);
        self.sync(now);
        if self.beat_timer.fire(now) {
            if let Some(leader) = self.followed {
                self.beat(now, leader.epoch);
            }
        }
        if self.silence_timer.fire(now) {
            self.inner.start_election(now);
            self.sync(now);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        earliest([
            self.inner.poll_timeout(),
            self.beat_timer.at(),
            self.silence_timer.at(),
        ])
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.inner.poll_event()
    }

    fn leader(&self) -> Option<Leader> {
        self.inner.leader()
    }

    fn durable(&self) -> Durable {
        self.inner.durable()
    }

    fn restore(&mut self, durable: Durable) {
        self.inner.restore(durable)
    }
}
