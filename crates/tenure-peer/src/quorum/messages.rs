//! Quorum messages: promises granted or refused, renewals followed, releases, acks.

use super::{QuorumGuard, Role};
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::types::{Instant, Leader, PeerId};

impl<A: ElectionAlgorithm> QuorumGuard<A> {
    fn grantable(&self, now: Instant, from: PeerId, epoch: u64) -> bool {
        epoch > self.promised && (now >= self.locked_until || self.promised_to == Some(from))
    }

    fn grant(&mut self, now: Instant, from: PeerId, epoch: u64) {
        if !matches!(self.role, Role::Follower) {
            self.step_down();
        }
        self.promised = epoch;
        self.promised_to = Some(from);
        self.locked_until = now + self.lease();
    }

    fn follow(&mut self, now: Instant, leader: PeerId, epoch: u64) {
        self.out.set_leader(Some(Leader { id: leader, epoch }));
        self.follow_timer.set(now + self.lease());
    }

    pub(super) fn on_quorum(&mut self, now: Instant, from: PeerId, msg: Message) {
        match msg {
            Message::QuorumRequest { epoch } => {
                self.max_seen = self.max_seen.max(epoch);
                if self.grantable(now, from, epoch) {
                    self.grant(now, from, epoch);
                    self.transmits
                        .send(from, Message::QuorumAck { epoch, round: 0 });
                } else {
                    let promised = self.promised;
                    self.transmits
                        .send(from, Message::QuorumNack { epoch: promised });
                }
            }
            Message::QuorumRenew { epoch, round } => {
                self.max_seen = self.max_seen.max(epoch);
                // A renewal proves its sender won `epoch` with a majority: the
                // epoch cannot be won by anyone else, and every earlier
                // leader's lease has run out. So it is accepted whatever this
                // process promised, as long as it promised nothing later.
                if epoch >= self.promised {
                    self.grant(now, from, epoch);
                    self.follow(now, from, epoch);
                    self.transmits
                        .send(from, Message::QuorumAck { epoch, round });
                } else {
                    let promised = self.promised;
                    self.transmits
                        .send(from, Message::QuorumNack { epoch: promised });
                }
            }
            Message::QuorumAck { epoch, round } => self.on_ack(now, from, epoch, round),
            Message::QuorumRelease { epoch } => self.on_release(now, from, epoch),
            Message::QuorumNack { epoch } => {
                self.max_seen = self.max_seen.max(epoch);
                match &mut self.role {
                    Role::Campaigning { nacks, acks, .. } => {
                        if !acks.contains(&from) {
                            nacks.insert(from);
                        }
                        self.check_campaign(now);
                    }
                    Role::Leading { epoch: mine, .. } if epoch > *mine => {
                        // A member promised a later epoch: this leadership is over.
                        self.step_down();
                        self.release_self_lock(now);
                        if self.inner_leads {
                            self.retry_timer.set(now + self.retry_delay());
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn on_release(&mut self, now: Instant, from: PeerId, epoch: u64) {
        let mut freed = false;
        if self.promised_to == Some(from) && self.promised == epoch && now < self.locked_until {
            // The promise stays (the epoch is never granted twice); only the
            // lease bound to `from` ends.
            self.locked_until = now;
            freed = true;
        }
        let followed = self
            .out
            .leader()
            .is_some_and(|l| l.id == from && l.epoch <= epoch);
        if followed {
            self.follow_timer.clear();
            self.out.set_leader(None);
        }
        if !(freed || followed) {
            return;
        }
        // Campaign now rather than at a retry set to wait out that lease.
        self.retry_timer.clear();
        if self.participating() && self.inner.leader().is_some_and(|l| l.id == from) {
            self.inner.start_election(now);
        }
    }

    fn on_ack(&mut self, now: Instant, from: PeerId, epoch: u64, round: u64) {
        let majority = self.inner.config().majority();
        let lease = self.lease();
        match &mut self.role {
            Role::Campaigning {
                epoch: mine, acks, ..
            } if *mine == epoch && round == 0 => {
                acks.insert(from);
                self.check_campaign(now);
            }
            Role::Leading {
                epoch: mine,
                round: current,
                round_started,
                acks,
                lease_expiry,
            } if *mine == epoch && *current == round => {
                acks.insert(from);
                if acks.len() >= majority {
                    *lease_expiry = (*lease_expiry).max(*round_started + lease);
                    let expiry = *lease_expiry;
                    self.lease_timer.set(expiry);
                }
            }
            _ => {}
        }
    }
}
