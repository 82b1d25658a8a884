//! What a backend declares of the election contract: the clauses ([`Clause`]) and
//! which of them it keeps, with its reasons where it does not ([`Capabilities`]).

use std::time::Duration;

/// A clause of the election contract (`docs/contract.md`), as the conformance suite and capability tables name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Clause {
    /// 1. At most one holder.
    AtMostOneHolder,
    /// 2. Monotonic tokens.
    MonotonicTokens,
    /// 3. Lost is final.
    LostIsFinal,
    /// 4. `is_leader()` is honest without I/O.
    HonestIsLeader,
    /// 5. Graceful handover.
    GracefulHandover,
    /// 6. Crash failover.
    CrashFailover,
    /// 7. No thundering herd.
    NoHerd,
    /// 8. Connection loss.
    ConnectionLoss,
    /// 9. Leader and observe.
    Observe,
    /// 10. Running work while leader.
    RunWhenLeader,
    /// 11. Stall detection.
    StallDetection,
    /// 12. Errors and bad input.
    Errors,
    /// Clause 13, membership (a tenure extension for the shard manager): register
    /// through a session, list and watch a namespace's members; a member goes with its
    /// session.
    Membership,
    /// Clause 14, priority: the highest-priority waiter is granted next, and a
    /// candidate that joins with a higher priority than the holder preempts it unless
    /// the holder opted out. Declared by [`Capabilities::priority`], not by an
    /// exception: a backend keeps it only when it says so.
    Priority,
    /// Clause 15, planned transitions: a holder asked to step down keeps the seat,
    /// held and renewed, until its work acknowledges or the step-down grace runs out;
    /// only then is the successor granted. Written in the core: every backend keeps it.
    PlannedTransitions,
    /// Clause 16, state transfer: a holder that resigns with a state (a cursor, a
    /// checkpoint) leaves it to the next grant, which reads it with the token of the
    /// grant that left it; nothing is inherited after a crash. Declared by
    /// [`Capabilities::inheriting`]: backends on the election engine keep it.
    StateTransfer,
}

impl Clause {
    /// Every clause, in contract order.
    pub const ALL: [Clause; 16] = [
        Clause::AtMostOneHolder,
        Clause::MonotonicTokens,
        Clause::LostIsFinal,
        Clause::HonestIsLeader,
        Clause::GracefulHandover,
        Clause::CrashFailover,
        Clause::NoHerd,
        Clause::ConnectionLoss,
        Clause::Observe,
        Clause::RunWhenLeader,
        Clause::StallDetection,
        Clause::Errors,
        Clause::Membership,
        Clause::Priority,
        Clause::PlannedTransitions,
        Clause::StateTransfer,
    ];

    /// The clause's number in the contract (`docs/contract.md`).
    pub fn number(self) -> u8 {
        Clause::ALL
            .iter()
            .position(|c| *c == self)
            .map_or(0, |i| i as u8 + 1)
    }
}

/// What a backend declares about itself; decides which conformance checks apply and
/// with which bounds.
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    /// `None` if a resign wakes the next waiter by notification; `Some(interval)` if
    /// waiters poll, so handover takes up to one poll interval.
    pub handover_poll: Option<Duration>,
    /// `None` if observers are notified; `Some(interval)` if they poll.
    pub observe_poll: Option<Duration>,
    /// Clauses this backend cannot keep, each with the reason.
    pub exceptions: Vec<(Clause, &'static str)>,
    /// `Some(n)` if [`BackendSession::try_campaign_many`](super::BackendSession::try_campaign_many) asks for up to `n` seats in
    /// one store round trip; `None` if it asks seat by seat (the default).
    pub batch: Option<usize>,
    /// True if the backend keeps candidate priorities and preemption (contract clause
    /// 14). False (the default): the core refuses a campaign whose candidate has a
    /// priority other than 0 with `Unsupported`, before the backend sees it, so a
    /// priority is never ignored silently. A backend that cannot keep them for a
    /// reason (not merely "not yet") says why with
    /// `except(Clause::Priority, reason)`, and the refusal names the reason.
    pub priority: bool,
    /// True if a holder can leave its successor a state (contract clause 16); false
    /// (the default): [`BackendSession::resign_with`](super::BackendSession::resign_with) answers `Unsupported`.
    pub state_transfer: bool,
    /// True if a resign completes on the holder itself, with no store to answer it
    /// (peer mode: the holder's node releases the seat and the other nodes learn it
    /// or time it out), so a resign through a session cut off from the others
    /// succeeds. False (the default): such a resign fails with the store's error and
    /// the release goes on once the store answers (contract clause 2).
    pub resign_local: bool,
}

/// What a backend that does not keep clause 16 says of it.
pub const STATE_NOT_YET: &str =
    "state transfer: not yet (only backends on the election engine keep it; resign_with answers Unsupported)";

/// What a backend that does not keep priorities says of clause 14, in the suite's
/// report and in the `Unsupported` error of a campaign with a priority.
pub const PRIORITY_NOT_YET: &str =
    "priority: not yet (a candidate with a priority other than 0 is rejected with Unsupported)";

impl Capabilities {
    /// A backend that keeps every clause and notifies, except priority (clause 14),
    /// which a backend declares with [`prioritized`](Self::prioritized) once it keeps it.
    pub fn full() -> Self {
        Capabilities::default()
    }

    /// Declare that `clause` does not hold, with the reason.
    pub fn except(mut self, clause: Clause, reason: &'static str) -> Self {
        self.exceptions.push((clause, reason));
        self
    }

    /// Declare that [`BackendSession::try_campaign_many`](super::BackendSession::try_campaign_many) asks for up to `seats` seats
    /// in one store round trip (sets [`batch`](Self::batch)).
    pub fn batched(mut self, seats: usize) -> Self {
        self.batch = Some(seats);
        self
    }

    /// Declare that the backend keeps candidate priorities and preemption (clause 14;
    /// sets [`priority`](Self::priority)).
    pub fn prioritized(mut self) -> Self {
        self.priority = true;
        self
    }

    /// Declare that a holder can leave its successor a state (clause 16; sets
    /// [`state_transfer`](Self::state_transfer)).
    pub fn inheriting(mut self) -> Self {
        self.state_transfer = true;
        self
    }

    /// Declare that a resign completes on the holder itself (sets
    /// [`resign_local`](Self::resign_local)).
    pub fn resigning_locally(mut self) -> Self {
        self.resign_local = true;
        self
    }

    /// Declare that waiters and observers poll the store every `interval` (sets
    /// [`handover_poll`](Self::handover_poll) and [`observe_poll`](Self::observe_poll)).
    pub fn polling(mut self, interval: Duration) -> Self {
        self.handover_poll = Some(interval);
        self.observe_poll = Some(interval);
        self
    }

    /// `Ok` if `clause` holds, else the declared reason (for clause 14 on a backend
    /// that does not declare [`priority`](Self::priority): the reason it gave with
    /// [`except`](Self::except), else [`PRIORITY_NOT_YET`]).
    pub fn supports(&self, clause: Clause) -> std::result::Result<(), &'static str> {
        let declared = self.exceptions.iter().find(|(c, _)| *c == clause);
        match declared {
            Some((_, why)) => Err(why),
            None if clause == Clause::Priority && !self.priority => Err(PRIORITY_NOT_YET),
            None if clause == Clause::StateTransfer && !self.state_transfer => Err(STATE_NOT_YET),
            None => Ok(()),
        }
    }

    /// Whether a priority other than 0 and a handover are taken: `Ok` if the backend
    /// keeps clause 14, `Err(Some(reason))` if it declared why it cannot
    /// ([`except`](Self::except)), `Err(None)` if it does not keep it yet.
    pub(crate) fn priority_refusal(&self) -> std::result::Result<(), Option<&'static str>> {
        if self.priority {
            return Ok(());
        }
        let declared = self.exceptions.iter().find(|(c, _)| *c == Clause::Priority);
        Err(declared.map(|(_, why)| *why))
    }
}
