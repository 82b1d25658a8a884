//! The queue of scheduled actions: deliveries, unreachable notices, timers.

use std::cmp::{Ordering, Reverse};

use super::Simulation;
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::types::{Instant, PeerId};

#[derive(Debug)]
pub(super) enum Action {
    Deliver {
        from: PeerId,
        to: PeerId,
        incarnation: u64,
        msg: Message,
    },
    Unreachable {
        host: PeerId,
        peer: PeerId,
        incarnation: u64,
    },
    Timer {
        host: PeerId,
        generation: u64,
    },
}

#[derive(Debug)]
pub(super) struct Scheduled {
    pub(super) at: Instant,
    pub(super) seq: u64,
    pub(super) action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<A: ElectionAlgorithm> Simulation<A> {
    pub(super) fn schedule(&mut self, at: Instant, action: Action) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            action,
        }));
    }
}
