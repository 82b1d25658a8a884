//! A seat: one election's machine, its local holder and waiters; wire priorities.

use std::collections::VecDeque;

use tenure_core::{Candidate, ElectionName, FencingToken, LeaderInfo, Result};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant as TokioInstant;

use super::handover::{HandoverAnswer, PendingHandover};
use super::Machine;
use crate::types::PeerId;
use crate::wire::{Envelope, Holding};

pub(crate) type CampaignReply = oneshot::Sender<Result<Option<FencingToken>>>;

/// A candidate's priority as the wire carries it (the core keeps it within
/// −1000..=1000).
pub(crate) fn wire_priority(c: &Candidate) -> i16 {
    let p = c.priority().clamp(i32::from(i16::MIN), i32::from(i16::MAX));
    i16::try_from(p).unwrap_or_default()
}

/// Where a waiter of priority `priority` goes in a queue ordered by
/// priority, then arrival: behind every waiter of its priority or higher.
pub(super) fn queue_position<'a>(
    priorities: impl Iterator<Item = &'a Candidate>,
    priority: i16,
) -> usize {
    let mut at = 0;
    for c in priorities {
        if wire_priority(c) < priority {
            break;
        }
        at += 1;
    }
    at
}

pub(super) struct Waiter {
    pub(super) session: u64,
    pub(super) candidate: Candidate,
    pub(super) reply: CampaignReply,
    /// For `try_campaign`: answer "not now" at this time.
    pub(super) give_up_at: Option<TokioInstant>,
}

pub(super) struct Holder {
    pub(super) session: u64,
    pub(super) candidate: Candidate,
    pub(super) token: u64,
    /// Whether its session was told it is preempted (once per grant).
    pub(super) preempted: bool,
    /// The lowest priority other nodes announced waiting since the grant:
    /// a rise above it (and above the holder's) is a candidate joining
    /// there, which preempts.
    pub(super) rival_floor: Option<i16>,
}

pub(super) struct RemoteSeat {
    pub(super) leader: PeerId,
    pub(super) epoch: u64,
    pub(super) holder: String,
    pub(super) value: String,
}

pub(super) struct Seat {
    pub(super) machine: Machine,
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) holder: Option<Holder>,
    /// The epoch last handed to a local holder; never handed out twice.
    pub(super) granted: Option<u64>,
    pub(super) remote: Option<RemoteSeat>,
    pub(super) watch: watch::Sender<Option<LeaderInfo>>,
    pub(super) hold_off_until: Option<TokioInstant>,
    pub(super) handover: Option<PendingHandover>,
}

impl Seat {
    /// The best priority among the waiting (not trying) sessions.
    pub(super) fn interest(&self) -> Option<i16> {
        self.waiters
            .iter()
            .filter(|w| w.give_up_at.is_none())
            .map(|w| wire_priority(&w.candidate))
            .max()
    }

    /// What this node answers to a handover question about the seat.
    pub(super) fn handover_answer(&self, to: Option<&str>) -> HandoverAnswer {
        let waiting = self.waiters.iter().filter(|w| {
            w.give_up_at.is_none()
                && !w.reply.is_closed()
                && to.is_none_or(|id| w.candidate.id() == id)
        });
        HandoverAnswer {
            holder: self.holder.as_ref().map(holding),
            waiter: waiting.map(|w| wire_priority(&w.candidate)).max(),
        }
    }
}

/// Who holds the seat, for the wire.
pub(super) fn holding(h: &Holder) -> Holding {
    Holding {
        epoch: h.token,
        holder: h.candidate.id().to_owned(),
        value: h.candidate.value().to_owned(),
    }
}

pub(super) fn seat_envelope(name: &ElectionName, h: &Holder) -> Envelope {
    let Holding {
        epoch,
        holder,
        value,
    } = holding(h);
    Envelope::Seat {
        channel: name.as_str().to_owned(),
        epoch,
        holder,
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, priority: i32) -> Candidate {
        Candidate::new(id)
            .and_then(|c| c.with_priority(priority))
            .unwrap()
    }

    /// Queues `joins` one after the other as `campaign` does.
    fn queue(joins: &[(&str, i32)]) -> Vec<String> {
        let mut q: VecDeque<Candidate> = VecDeque::new();
        for (id, p) in joins {
            let c = cand(id, *p);
            let at = queue_position(q.iter(), wire_priority(&c));
            q.insert(at, c);
        }
        q.iter().map(|c| c.id().to_owned()).collect()
    }

    #[test]
    fn waiters_queue_by_priority_then_arrival() {
        // The order of contract clause 14's check: 0, 5, 5, 2 → 5, 5, 2, 0.
        assert_eq!(
            queue(&[("b", 0), ("c", 5), ("d", 5), ("e", 2)]),
            ["c", "d", "e", "b"]
        );
        assert_eq!(
            queue(&[
                ("a", -1000),
                ("b", 1000),
                ("c", 0),
                ("d", -1000),
                ("e", 1000)
            ]),
            ["b", "e", "c", "a", "d"]
        );
        // One priority: first come, first served.
        assert_eq!(queue(&[("x", 3), ("y", 3), ("z", 3)]), ["x", "y", "z"]);
    }

    #[test]
    fn priorities_fit_the_wire() {
        assert_eq!(wire_priority(&cand("a", 1000)), 1000);
        assert_eq!(wire_priority(&cand("a", -1000)), -1000);
        assert_eq!(wire_priority(&cand("a", 0)), 0);
        assert_eq!(wire_priority(&Candidate::new("a").unwrap()), 0);
    }
}
