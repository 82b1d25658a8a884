//! Campaigning for an epoch, leading it with renewals, and stepping down.

use std::collections::BTreeSet;

use super::{QuorumGuard, Role};
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::types::{Instant, Leader};

impl<A: ElectionAlgorithm> QuorumGuard<A> {
    /// Follows the wrapped algorithm's proposal after every input.
    pub(super) fn sync(&mut self, now: Instant) {
        while self.inner.poll_event().is_some() {}
        let me = self.me();
        self.inner_leads = self.participating() && self.inner.leader().is_some_and(|l| l.id == me);
        if self.inner_leads {
            if matches!(self.role, Role::Follower) && !self.retry_timer.is_set() {
                self.campaign(now);
            }
        } else {
            self.retry_timer.clear();
            let keep = matches!(self.role, Role::Leading { .. }) && self.sticky && self.candidate;
            if !matches!(self.role, Role::Follower) && !keep {
                self.step_down();
                self.release_self_lock(now);
            }
        }
    }

    pub(super) fn campaign(&mut self, now: Instant) {
        let me = self.me();
        if now < self.locked_until && self.promised_to != Some(me) {
            // Bound to another leader's lease: wait it out.
            self.retry_timer.set(self.locked_until);
            return;
        }
        let epoch = self.max_seen.max(self.promised).saturating_add(1);
        self.promised = epoch;
        self.promised_to = Some(me);
        self.max_seen = epoch;
        self.locked_until = now + self.lease();
        self.role = Role::Campaigning {
            epoch,
            started: now,
            acks: BTreeSet::from([me]),
            nacks: BTreeSet::new(),
        };
        self.send_all(&Message::QuorumRequest { epoch });
        self.campaign_timer
            .set(now + self.inner.config().timing().answer_timeout);
        self.check_campaign(now);
    }

    pub(super) fn check_campaign(&mut self, now: Instant) {
        let config = self.inner.config();
        let majority = config.majority();
        let members = config.members().len();
        let (epoch, started, won, lost) = match &self.role {
            Role::Campaigning {
                epoch,
                started,
                acks,
                nacks,
            } => (
                *epoch,
                *started,
                acks.len() >= majority,
                nacks.len() > members - majority,
            ),
            _ => return,
        };
        if won {
            self.campaign_timer.clear();
            self.lead(now, epoch, started);
        } else if lost {
            self.give_up(now);
        }
    }

    pub(super) fn give_up(&mut self, now: Instant) {
        self.step_down();
        self.release_self_lock(now);
        if self.inner_leads {
            self.retry_timer.set(now + self.retry_delay());
        }
    }

    pub(super) fn release_self_lock(&mut self, now: Instant) {
        if self.promised_to == Some(self.me()) {
            self.locked_until = self.locked_until.min(now);
        }
    }

    fn lead(&mut self, now: Instant, epoch: u64, started: Instant) {
        let lease_expiry = started + self.lease();
        self.role = Role::Leading {
            epoch,
            round: 0,
            round_started: started,
            acks: BTreeSet::new(),
            lease_expiry,
        };
        self.lease_timer.set(lease_expiry);
        self.follow_timer.clear();
        self.out.set_leader(Some(Leader {
            id: self.me(),
            epoch,
        }));
        self.renew(now);
    }

    pub(super) fn renew(&mut self, now: Instant) {
        let me = self.me();
        let majority = self.inner.config().majority();
        let lease = self.lease();
        let Role::Leading {
            epoch,
            round,
            round_started,
            acks,
            lease_expiry,
        } = &mut self.role
        else {
            return;
        };
        *round = round.saturating_add(1);
        *round_started = now;
        *acks = BTreeSet::from([me]);
        if acks.len() >= majority {
            *lease_expiry = (*lease_expiry).max(now + lease);
        }
        let msg = Message::QuorumRenew {
            epoch: *epoch,
            round: *round,
        };
        let expiry = *lease_expiry;
        self.lease_timer.set(expiry);
        self.locked_until = self.locked_until.max(now + lease);
        self.send_all(&msg);
        self.renew_timer
            .set(now + self.inner.config().timing().renew_interval);
    }

    /// Ends leading or campaigning and releases the members bound to this
    /// process for that epoch.
    pub(super) fn step_down(&mut self) {
        let was_leading = matches!(self.role, Role::Leading { .. });
        let released = match self.role {
            Role::Leading { epoch, .. } | Role::Campaigning { epoch, .. } => Some(epoch),
            Role::Follower => None,
        };
        if let Some(epoch) = released {
            self.send_all(&Message::QuorumRelease { epoch });
        }
        self.role = Role::Follower;
        self.campaign_timer.clear();
        self.renew_timer.clear();
        self.lease_timer.clear();
        if was_leading {
            self.out.set_leader(None);
        }
    }
}
