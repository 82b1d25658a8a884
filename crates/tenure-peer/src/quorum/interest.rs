//! Candidacy and interest announcements: what other members want, and its fading.

use super::{QuorumGuard, INTEREST_FADES_AFTER};
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::types::{Instant, PeerId};

impl<A: ElectionAlgorithm> QuorumGuard<A> {
    /// Announces this process's candidacy and interest to every member.
    pub(super) fn announce(&mut self) {
        let msg = Message::Candidacy {
            active: self.candidate,
            priority: self.interest,
        };
        self.send_all(&msg);
    }

    /// Sets this process's interest (contract clause 14): the best priority
    /// among its waiting sessions, `None` if none waits. Every member is told
    /// when it changes, and again every half lease while it is set, so that
    /// the interest of a process that crashed fades after
    /// [`INTEREST_FADES_AFTER`] leases. Interests only tell drivers who to
    /// let stand for election; they play no part in who may lead. Returns
    /// whether it changed.
    pub fn set_interest(&mut self, now: Instant, interest: Option<i16>) -> bool {
        if interest == self.interest {
            return false;
        }
        self.interest = interest;
        self.announce();
        if interest.is_some() {
            self.refresh_timer.set(now + self.lease() / 2);
        } else {
            self.refresh_timer.clear();
        }
        true
    }

    /// The highest interest another member announced within the last
    /// [`INTEREST_FADES_AFTER`] leases, if any.
    pub fn rival_interest(&self, now: Instant) -> Option<i16> {
        self.best_rival(now).map(|(p, _)| p)
    }

    /// The highest interest another member announced within the last
    /// [`INTEREST_FADES_AFTER`] leases and that member (the highest id among
    /// equals), if any.
    pub fn best_rival(&self, now: Instant) -> Option<(i16, PeerId)> {
        self.interests
            .keys()
            .filter_map(|p| self.interest_of(now, *p).map(|i| (i, *p)))
            .max()
    }

    /// Whether `peer` withdrew its interest (announced none, or was
    /// forgotten) at or after `since`.
    pub fn withdrew_since(&self, peer: PeerId, since: Instant) -> bool {
        self.withdrawals.get(&peer).is_some_and(|t| *t >= since)
    }

    /// The interest `peer` announced, unless it faded.
    pub fn interest_of(&self, now: Instant, peer: PeerId) -> Option<i16> {
        let fade = self.lease().saturating_mul(INTEREST_FADES_AFTER);
        self.interests
            .get(&peer)
            .filter(|(_, heard)| now.saturating_duration_since(*heard) < fade)
            .map(|(p, _)| *p)
    }

    /// Forgets the interest of `peer` (a driver that could not reach it) as
    /// if it had withdrawn it at `now`.
    pub fn forget_interest(&mut self, now: Instant, peer: PeerId) {
        self.interests.remove(&peer);
        self.withdrawals.insert(peer, now);
    }

    /// Other members that announced themselves as candidates (or sent
    /// election traffic) and have not withdrawn since.
    pub fn known_candidates(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.candidates.iter().copied()
    }
}
