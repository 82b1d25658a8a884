//! The quorum guard: leadership only with a majority, fenced by epochs.

mod algorithm;
mod interest;
mod leadership;
mod messages;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::machine::{ElectionAlgorithm, Outbox, Relay, Timer};
use crate::message::Message;
use crate::types::{Instant, PeerId};

/// After how many leases without hearing it again another member's
/// interest ([`QuorumGuard::set_interest`]) fades.
pub const INTEREST_FADES_AFTER: u32 = 2;

#[derive(Debug)]
enum Role {
    Follower,
    Campaigning {
        epoch: u64,
        started: Instant,
        acks: BTreeSet<PeerId>,
        nacks: BTreeSet<PeerId>,
    },
    Leading {
        epoch: u64,
        round: u64,
        round_started: Instant,
        acks: BTreeSet<PeerId>,
        lease_expiry: Instant,
    },
}

/// Quorum-guarded leadership around any election algorithm.
///
/// The wrapped algorithm only proposes: when it says this process leads, the
/// guard campaigns for an epoch one above any it has seen, sending
/// `QuorumRequest` to every member. A member acknowledges (`QuorumAck`) only
/// an epoch above every epoch it has promised, and only when it holds no
/// unexpired lease for another process; otherwise it refuses (`QuorumNack`
/// with its promise). With acknowledgements from a majority of the *full*
/// membership (itself included) the process leads: it emits
/// [`Event::LeaderChanged`](crate::Event::LeaderChanged) with the epoch as
/// fencing token and sends `QuorumRenew` at once and then every
/// `renew_interval`. A member that accepts a renewal follows the leader until
/// the lease lapses.
///
/// Guarantees, for any schedule of crashes, restarts, partitions and message
/// loss, provided [`durable`](ElectionAlgorithm::durable) state survives
/// restarts:
///
/// * at most one process leads in any epoch (two majorities share a member,
///   and a member promises each epoch once);
/// * a later leader has a strictly higher epoch (the shared member refuses
///   anything not above its promise);
/// * a renewal is accepted for any epoch at least as high as the member's
///   promise: it proves its sender won that epoch, so accepting it cannot
///   help a second process win it;
/// * with one clock for everyone (the simulator) no two processes lead at the
///   same instant: a leader steps down when `lease` has passed since it sent
///   the last renewal a majority acknowledged, while each member that
///   acknowledged refuses others until `lease` after it acknowledged. A
///   restarted process refuses for one `lease` too. With real clocks the
///   margin must cover their drift; fencing by epoch covers the rest.
///
/// Under a partition only a side holding a majority can elect; a leader cut
/// off from its majority steps down within one `lease`. The guard also steps
/// down when the wrapped algorithm stops naming this process (unless
/// leadership is [sticky](Self::with_sticky_leadership)), and retries a
/// failed campaign after a rank-staggered delay. Whenever it stops leading or
/// campaigning it sends `QuorumRelease` for its epoch, which frees the
/// members bound to it at once instead of after their lease. Cost: `2(n − 1)`
/// messages per campaign and per renewal, `n − 1` per release.
///
/// # Candidacy
///
/// A process takes part in elections only while it is a candidate
/// ([`set_candidate`](Self::set_candidate); every process is one unless built
/// [`standing_by`](Self::standing_by)). Standing by, it still acknowledges
/// and follows leaders (it is a member of every majority), but the wrapped
/// algorithm is frozen: it gets no input and its timers do not run, and the
/// process answers election traffic with `Candidacy { active: false }`, which
/// the receiving guard hands to its algorithm as
/// [`peer_unreachable`](ElectionAlgorithm::peer_unreachable). So every
/// algorithm elects among the candidates only, the way it skips crashed
/// processes. Changes of candidacy are sent to every member; a process
/// coming back re-runs an election through
/// [`start_election`](ElectionAlgorithm::start_election).
#[derive(Debug)]
pub struct QuorumGuard<A> {
    inner: A,
    out: Outbox,
    role: Role,
    inner_leads: bool,
    /// Highest epoch promised to anyone (this process included).
    promised: u64,
    promised_to: Option<PeerId>,
    /// No acknowledgement for others before this.
    locked_until: Instant,
    max_seen: u64,
    campaign_timer: Timer,
    renew_timer: Timer,
    lease_timer: Timer,
    retry_timer: Timer,
    follow_timer: Timer,
    transmits: Relay,
    candidate: bool,
    inner_started: bool,
    sticky: bool,
    /// When the process started, if not when this machine did.
    process_start: Option<Instant>,
    /// Other members known to be candidates.
    candidates: BTreeSet<PeerId>,
    /// This process's interest: the best priority among its waiting
    /// sessions (see [`set_interest`](Self::set_interest)).
    interest: Option<i16>,
    /// Other members' interests, with when they were last heard.
    interests: BTreeMap<PeerId, (i16, Instant)>,
    /// When other members last withdrew their interest (or were forgotten).
    withdrawals: BTreeMap<PeerId, Instant>,
    /// Re-announces a set interest.
    refresh_timer: Timer,
}

impl<A: ElectionAlgorithm> QuorumGuard<A> {
    /// Wraps `inner`.
    pub fn new(inner: A) -> Self {
        QuorumGuard {
            inner,
            out: Outbox::default(),
            role: Role::Follower,
            inner_leads: false,
            promised: 0,
            promised_to: None,
            locked_until: Instant::ZERO,
            max_seen: 0,
            campaign_timer: Timer::default(),
            renew_timer: Timer::default(),
            lease_timer: Timer::default(),
            retry_timer: Timer::default(),
            follow_timer: Timer::default(),
            transmits: Relay::default(),
            candidate: true,
            inner_started: false,
            sticky: false,
            process_start: None,
            candidates: BTreeSet::new(),
            interest: None,
            interests: BTreeMap::new(),
            withdrawals: BTreeMap::new(),
            refresh_timer: Timer::default(),
        }
    }

    /// The process hosting this machine started at `at` (a driver that
    /// creates machines later, one per election, says so): the guard then
    /// refuses others until `at + lease` rather than for one lease after
    /// [`start`](ElectionAlgorithm::start). That restart protection is about
    /// leases acknowledged before a crash, which cannot outlive the process's
    /// start by more than a lease.
    pub fn with_process_start(mut self, at: Instant) -> Self {
        self.process_start = Some(at);
        self
    }

    /// Builds the guard standing by: not a candidate until
    /// [`set_candidate`](Self::set_candidate) makes it one.
    pub fn standing_by(mut self) -> Self {
        self.candidate = false;
        self
    }

    /// Once this process leads, it keeps leading while it is a candidate and
    /// holds its majority, whatever the wrapped algorithm proposes later: a
    /// higher rank that becomes a candidate waits instead of taking over.
    /// Others stay bound to the leader's lease, so they do not campaign
    /// meanwhile. Off by default.
    pub fn with_sticky_leadership(mut self) -> Self {
        self.sticky = true;
        self
    }

    /// Whether this process takes part in elections.
    pub fn is_candidate(&self) -> bool {
        self.candidate
    }

    /// Makes this process a candidate or makes it stand by (see the type's
    /// docs). Standing by ends any leadership or campaign (with a release);
    /// becoming a candidate starts an election. Every member is told.
    pub fn set_candidate(&mut self, now: Instant, active: bool) {
        if active == self.candidate {
            return;
        }
        self.candidate = active;
        self.announce();
        if active {
            if self.inner_started {
                self.inner.start_election(now);
            } else {
                self.inner_started = true;
                self.inner.start(now);
            }
        } else {
            // Whatever the frozen algorithm still wanted to say is void.
            while self.inner.poll_transmit().is_some() {}
            while self.inner.poll_event().is_some() {}
        }
        self.sync(now);
    }

    /// Gives up the current leadership (or campaign) of this process's own
    /// accord: it steps down and releases its members at once. If it is still
    /// a candidate that its algorithm names, it campaigns again right away,
    /// for a higher epoch.
    pub fn relinquish(&mut self, now: Instant) {
        if !matches!(self.role, Role::Follower) {
            self.step_down();
            self.release_self_lock(now);
        }
        self.retry_timer.clear();
        self.sync(now);
    }

    /// While leading, starts a renewal round now rather than at the next
    /// `renew_interval`.
    pub fn renew_now(&mut self, now: Instant) {
        if matches!(self.role, Role::Leading { .. }) {
            self.renew(now);
        }
    }

    /// While leading: the instant this leadership ends unless renewed, i.e.
    /// the send time of the last renewal round a majority acknowledged (or of
    /// the winning campaign) plus `lease`. No member acknowledges anyone else
    /// before it.
    pub fn lease_expiry(&self) -> Option<Instant> {
        match self.role {
            Role::Leading { lease_expiry, .. } => Some(lease_expiry),
            _ => None,
        }
    }

    fn participating(&self) -> bool {
        self.candidate && self.inner_started
    }

    /// The wrapped algorithm.
    pub fn get_ref(&self) -> &A {
        &self.inner
    }

    /// Unwraps the algorithm.
    pub fn into_inner(self) -> A {
        self.inner
    }

    /// The current fencing token while this process leads.
    pub fn fencing_token(&self) -> Option<u64> {
        match self.role {
            Role::Leading { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    /// The highest epoch this process has promised.
    pub fn promised_epoch(&self) -> u64 {
        self.promised
    }

    fn me(&self) -> PeerId {
        self.inner.id()
    }

    fn lease(&self) -> Duration {
        self.inner.config().timing().lease
    }

    fn send_all(&mut self, msg: &Message) {
        self.transmits.send_to_others(self.inner.config(), msg);
    }

    fn retry_delay(&self) -> Duration {
        let config = self.inner.config();
        let from_top = config
            .members()
            .iter()
            .rev()
            .position(|p| *p == config.id())
            .unwrap_or(0);
        let factor = u32::try_from(from_top).unwrap_or(u32::MAX);
        config
            .timing()
            .renew_interval
            .saturating_add(config.timing().tie_break_step.saturating_mul(factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::types::{Durable, Event};
    use crate::Bully;

    fn drain<A: ElectionAlgorithm>(m: &mut A) -> Vec<(PeerId, Message)> {
        std::iter::from_fn(|| m.poll_transmit()).collect()
    }

    fn events<A: ElectionAlgorithm>(m: &mut A) -> Vec<Event> {
        std::iter::from_fn(|| m.poll_event()).collect()
    }

    fn guard(id: u64) -> QuorumGuard<Bully> {
        let config = Config::new(PeerId(id), [1, 2, 3].map(PeerId)).unwrap();
        QuorumGuard::new(Bully::new(config))
    }

    #[test]
    fn leads_only_with_a_majority_and_steps_down_without_one() {
        let lease = crate::Timing::default().lease;
        let mut g = guard(3);
        g.start(Instant::ZERO);
        // Bully makes 3 leader at once, but a fresh process waits one lease.
        let sent = drain(&mut g);
        assert!(sent
            .iter()
            .all(|(_, m)| m.kind() == crate::MessageKind::Elected));
        assert_eq!(g.poll_timeout(), Some(Instant::ZERO + lease));
        let t = Instant::ZERO + lease;
        g.handle_timeout(t);
        let requests = drain(&mut g);
        assert_eq!(
            requests,
            vec![
                (PeerId(1), Message::QuorumRequest { epoch: 1 }),
                (PeerId(2), Message::QuorumRequest { epoch: 1 })
            ]
        );
        assert_eq!(g.leader(), None);
        g.handle_message(t, PeerId(1), Message::QuorumAck { epoch: 1, round: 0 });
        assert_eq!(g.fencing_token(), Some(1));
        assert_eq!(
            events(&mut g),
            vec![Event::LeaderChanged {
                leader: PeerId(3),
                epoch: 1
            }]
        );
        // Nobody acknowledges the renewals: the lease runs out.
        let mut now = t;
        while g.fencing_token().is_some() {
            now = g.poll_timeout().unwrap();
            g.handle_timeout(now);
            drain(&mut g);
        }
        assert_eq!(now, t + lease);
        assert_eq!(events(&mut g), vec![Event::LeaderLost { epoch: 1 }]);
    }

    #[test]
    fn interests_are_announced_refreshed_and_fade() {
        let lease = crate::Timing::default().lease;
        let mut g = guard(1).standing_by();
        g.start(Instant::ZERO);
        drain(&mut g);
        // Setting an interest tells every member, with the candidacy.
        assert!(g.set_interest(Instant::ZERO, Some(5)));
        let told = Message::Candidacy {
            active: false,
            priority: Some(5),
        };
        assert_eq!(
            drain(&mut g),
            vec![(PeerId(2), told.clone()), (PeerId(3), told.clone())]
        );
        assert!(!g.set_interest(Instant::ZERO, Some(5)));
        assert!(drain(&mut g).is_empty());
        // It is announced again every half lease.
        let refresh = Instant::ZERO + lease / 2;
        assert!(g.poll_timeout().is_some_and(|t| t <= refresh));
        g.handle_timeout(refresh);
        assert_eq!(drain(&mut g).len(), 2);
        // Others' interests: the highest counts, until it fades.
        let t = Instant::ZERO;
        g.handle_message(
            t,
            PeerId(2),
            Message::Candidacy {
                active: true,
                priority: Some(3),
            },
        );
        g.handle_message(
            t + lease,
            PeerId(3),
            Message::Candidacy {
                active: false,
                priority: Some(-2),
            },
        );
        assert_eq!(g.rival_interest(t + lease), Some(3));
        assert_eq!(g.interest_of(t + lease, PeerId(3)), Some(-2));
        let faded = t + lease * INTEREST_FADES_AFTER;
        assert_eq!(g.rival_interest(faded), Some(-2));
        assert_eq!(g.interest_of(faded, PeerId(2)), None);
        // Withdrawn, or forgotten by the driver.
        assert_eq!(g.best_rival(t + lease), Some((3, PeerId(2))));
        assert!(!g.withdrew_since(PeerId(3), t));
        g.handle_message(
            t + lease,
            PeerId(3),
            Message::Candidacy {
                active: false,
                priority: None,
            },
        );
        assert_eq!(g.rival_interest(t + lease), Some(3));
        assert!(g.withdrew_since(PeerId(3), t + lease));
        assert!(!g.withdrew_since(PeerId(3), t + lease * 2));
        g.forget_interest(t, PeerId(2));
        assert_eq!(g.rival_interest(t), None);
        assert!(g.withdrew_since(PeerId(2), t));
        // No interest: nothing to refresh.
        assert!(g.set_interest(t, None));
        let gone = Message::Candidacy {
            active: false,
            priority: None,
        };
        assert_eq!(
            drain(&mut g),
            vec![(PeerId(2), gone.clone()), (PeerId(3), gone)]
        );
    }

    #[test]
    fn members_promise_each_epoch_once_and_honour_leases() {
        let lease = crate::Timing::default().lease;
        let mut g = guard(1);
        g.start(Instant::ZERO);
        // The wrapped bully follows 3, so this process never campaigns.
        let elected = Message::Elected {
            leader: PeerId(3),
            epoch: 1,
            alternatives: Vec::new(),
        };
        g.handle_message(Instant::ZERO, PeerId(3), elected);
        drain(&mut g);
        let t = Instant::ZERO + lease;
        g.handle_timeout(t);
        drain(&mut g);
        g.handle_message(t, PeerId(2), Message::QuorumRequest { epoch: 4 });
        assert_eq!(
            drain(&mut g),
            vec![(PeerId(2), Message::QuorumAck { epoch: 4, round: 0 })]
        );
        // The same epoch again, or a later one within the lease: refused.
        g.handle_message(t, PeerId(3), Message::QuorumRequest { epoch: 4 });
        g.handle_message(t, PeerId(3), Message::QuorumRequest { epoch: 5 });
        assert_eq!(
            drain(&mut g),
            vec![
                (PeerId(3), Message::QuorumNack { epoch: 4 }),
                (PeerId(3), Message::QuorumNack { epoch: 4 })
            ]
        );
        // After the lease, a later epoch is granted.
        g.handle_message(t + lease, PeerId(3), Message::QuorumRequest { epoch: 5 });
        assert_eq!(
            drain(&mut g),
            vec![(PeerId(3), Message::QuorumAck { epoch: 5, round: 0 })]
        );
        assert_eq!(
            g.durable(),
            Durable {
                epoch: 5,
                holder: Some(PeerId(3))
            }
        );
    }
}
