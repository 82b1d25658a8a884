//! Running a simulation: taking steps, draining hosts' outputs, sending messages.

use std::cmp::Reverse;
use std::time::Duration;

use super::log::{Happening, Record};
use super::queue::Action;
use super::rng::SimRng;
use super::stats::MessageStats;
use super::{Simulation, MAX_IDLE_STEPS};
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::types::{Instant, PeerId};

impl<A: ElectionAlgorithm> Simulation<A> {
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

    pub(super) fn mix(&mut self, words: &[u64]) {
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
    pub(super) fn after_input(&mut self, host: PeerId) {
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
