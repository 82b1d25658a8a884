//! The simulation's log of what happened to hosts, and the leader terms it yields.

use std::collections::BTreeMap;

use super::Simulation;
use crate::machine::ElectionAlgorithm;
use crate::types::{Event, Instant, PeerId};

/// Something that happened to a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happening {
    /// The host's state machine reported an event.
    Event(Event),
    /// The host crashed.
    Crashed,
    /// The host restarted with a fresh state machine.
    Restarted,
}

/// One entry of the simulation's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When.
    pub at: Instant,
    /// Where.
    pub host: PeerId,
    /// What.
    pub what: Happening,
}

/// A stretch of time during which one host considered itself leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The leader.
    pub host: PeerId,
    /// Its epoch.
    pub epoch: u64,
    /// When it started leading.
    pub from: Instant,
    /// When it stopped (crash, step-down, or following someone else); `None`
    /// while it still leads.
    pub until: Option<Instant>,
}

impl Term {
    /// Whether this term and `other` share some instant. A term that ends at
    /// the instant another starts does not overlap it.
    pub fn overlaps(&self, other: &Term) -> bool {
        let self_end = self.until.unwrap_or(Instant::from_nanos(u64::MAX));
        let other_end = other.until.unwrap_or(Instant::from_nanos(u64::MAX));
        self.from < other_end && other.from < self_end
    }
}

impl<A: ElectionAlgorithm> Simulation<A> {
    /// Every stretch during which a host considered itself leader, in order of
    /// their start.
    pub fn terms(&self) -> Vec<Term> {
        let mut open: BTreeMap<PeerId, usize> = BTreeMap::new();
        let mut terms: Vec<Term> = Vec::new();
        for record in &self.log {
            let starts = match &record.what {
                Happening::Event(Event::LeaderChanged { leader, epoch })
                    if *leader == record.host =>
                {
                    Some(*epoch)
                }
                _ => None,
            };
            if let Some(index) = open.remove(&record.host) {
                if let Some(term) = terms.get_mut(index) {
                    term.until = Some(record.at);
                }
            }
            if let Some(epoch) = starts {
                open.insert(record.host, terms.len());
                terms.push(Term {
                    host: record.host,
                    epoch,
                    from: record.at,
                    until: None,
                });
            }
        }
        terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_close_on_crash_and_do_not_overlap_when_adjacent() {
        let a = Term {
            host: PeerId(1),
            epoch: 1,
            from: Instant::from_nanos(0),
            until: Some(Instant::from_nanos(10)),
        };
        let b = Term {
            host: PeerId(2),
            epoch: 2,
            from: Instant::from_nanos(10),
            until: None,
        };
        assert!(!a.overlaps(&b));
        let c = Term {
            from: Instant::from_nanos(9),
            ..b
        };
        assert!(a.overlaps(&c));
    }
}
