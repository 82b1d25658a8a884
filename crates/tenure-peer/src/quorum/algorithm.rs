//! The guard as an [`ElectionAlgorithm`]: its inputs, timers and durable state.

use super::{QuorumGuard, Role};
use crate::config::Config;
use crate::machine::{earliest, outbox_view, wrapper_inputs, ElectionAlgorithm};
use crate::message::Message;
use crate::types::{Durable, Event, Instant, Leader, PeerId};

impl<A: ElectionAlgorithm> ElectionAlgorithm for QuorumGuard<A> {
    wrapper_inputs!(participating);

    fn start(&mut self, now: Instant) {
        // A restarted process may have acknowledged someone just before it
        // crashed: refuse everyone for one lease.
        self.locked_until = self.process_start.unwrap_or(now) + self.lease();
        if self.candidate {
            self.inner_started = true;
            self.inner.start(now);
        }
        self.sync(now);
    }

    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        if !self.inner.config().is_other_member(from) {
            return;
        }
        match msg {
            Message::QuorumRequest { .. }
            | Message::QuorumRenew { .. }
            | Message::QuorumAck { .. }
            | Message::QuorumNack { .. }
            | Message::QuorumRelease { .. } => self.on_quorum(now, from, msg),
            Message::Candidacy { active, priority } => {
                match priority {
                    Some(p) => {
                        self.interests.insert(from, (p, now));
                    }
                    None => {
                        if self.interests.remove(&from).is_some() {
                            self.withdrawals.insert(from, now);
                        }
                    }
                }
                if active {
                    self.candidates.insert(from);
                } else {
                    self.candidates.remove(&from);
                    if self.participating() {
                        self.inner.peer_unreachable(now, from);
                    }
                }
            }
            other if self.participating() => {
                // Only candidates send election traffic.
                self.candidates.insert(from);
                self.inner.handle_message(now, from, other);
            }
            Message::Heartbeat { .. } => {}
            _ => self.transmits.send(
                from,
                Message::Candidacy {
                    active: false,
                    priority: self.interest,
                },
            ),
        }
        self.sync(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        // Lease first: a lapsed lease ends leadership before anything else.
        if self.lease_timer.fire(now) {
            if let Role::Leading { lease_expiry, .. } = self.role {
                if now >= lease_expiry {
                    self.step_down();
                    self.release_self_lock(now);
                    if self.inner_leads {
                        self.retry_timer.set(now + self.retry_delay());
                    }
                } else {
                    self.lease_timer.set(lease_expiry);
                }
            }
        }
        if self.follow_timer.fire(now) {
            let following_other = self.out.leader().is_some_and(|l| l.id != self.me());
            if following_other {
                self.out.set_leader(None);
            }
        }
        if self.campaign_timer.fire(now) && matches!(self.role, Role::Campaigning { .. }) {
            self.give_up(now);
        }
        if self.renew_timer.fire(now) {
            self.renew(now);
        }
        if self.refresh_timer.fire(now) && self.interest.is_some() {
            self.announce();
            self.refresh_timer.set(now + self.lease() / 2);
        }
        if self.participating() {
            self.inner.handle_timeout(now);
        }
        if self.retry_timer.fire(now) && matches!(self.role, Role::Follower) && self.inner_leads {
            self.campaign(now);
        }
        self.sync(now);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        earliest([
            self.inner.poll_timeout().filter(|_| self.participating()),
            self.campaign_timer.at(),
            self.renew_timer.at(),
            self.lease_timer.at(),
            self.retry_timer.at(),
            self.follow_timer.at(),
            self.refresh_timer.at(),
        ])
    }

    outbox_view!(out);

    fn durable(&self) -> Durable {
        Durable {
            epoch: self.promised,
            holder: self.promised_to,
        }
    }

    fn restore(&mut self, durable: Durable) {
        if durable.epoch > self.promised {
            self.promised = durable.epoch;
            self.promised_to = durable.holder;
        }
        self.max_seen = self.max_seen.max(durable.epoch);
    }
}
