//! The waiting queue of an election (contract clause 14): one small blob per waiting
//! candidacy under `[prefix/]queues/<election>~/`, named by its arrival number and
//! kept alive by a lease of the waiter's session, plus an optional `handover` blob.
//! This module reads a listing of that prefix and decides who goes next; it does no
//! I/O.
//!
//! `~` cannot appear in an election name, so the prefix of one election never lists
//! another election's entries (`queues/a~/` is not a prefix of `queues/ab~/…` or of
//! `queues/a/b~/…`).

use std::collections::HashMap;

use tenure_core::Candidate;

use crate::names::{candidacy_metadata, decode, encode, META_NO_PREEMPT, META_PRIORITY};

/// Metadata field of an entry (and of a grant): the candidate id (percent-encoded).
pub(crate) const META_ID: &str = "tenureid";
/// Metadata field of the handover blob: the candidate id asked for (percent-encoded;
/// absent for "the best waiter").
pub(crate) const META_TO: &str = "tenureto";
/// Metadata field of the handover blob: the token of the grant asked to step down.
pub(crate) const META_FOR: &str = "tenurefor";

/// The name of the handover blob inside an election's queue prefix.
pub(crate) const HANDOVER: &str = "handover";

/// How many digits an arrival number has in an entry's name (so names sort as numbers).
const SEQ_DIGITS: usize = 20;

/// One blob of a queue listing, as the store reports it.
#[derive(Debug, Clone)]
pub(crate) struct Blob {
    /// The name below the queue prefix.
    pub(crate) name: String,
    pub(crate) etag: String,
    /// Whether a lease holds it (a waiter's session keeps renewing it).
    pub(crate) leased: bool,
    pub(crate) metadata: HashMap<String, String>,
}

/// One waiting candidacy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The name below the queue prefix (its arrival number, zero-padded).
    pub(crate) name: String,
    pub(crate) seq: u64,
    pub(crate) id: String,
    pub(crate) priority: i32,
    /// Whether its waiter's session still renews it; an entry whose lease lapsed (a
    /// waiter that crashed or was cut off for a lease duration) is skipped.
    pub(crate) live: bool,
}

/// A handover request: the next grant goes to `to` (or in order) and uses it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handover {
    pub(crate) to: Option<String>,
    /// The token of the grant that was asked to step down.
    pub(crate) for_token: u64,
    pub(crate) etag: String,
}

/// An election's queue as one listing showed it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Queue {
    /// In arrival order.
    pub(crate) entries: Vec<Entry>,
    pub(crate) handover: Option<Handover>,
    /// Names and etags of entry blobs whose lease is not held (lapsed, or not taken
    /// yet by a waiter that is joining).
    pub(crate) unleased: Vec<(String, String)>,
}

/// The name below the queue prefix of the entry with arrival number `seq`.
pub(crate) fn entry_name(seq: u64) -> String {
    format!("{seq:0width$}", width = SEQ_DIGITS)
}

/// The metadata of an entry for `candidate`.
pub(crate) fn entry_metadata(candidate: &Candidate) -> HashMap<String, String> {
    let mut m = candidacy_metadata(candidate);
    m.insert(META_ID.to_string(), encode(candidate.id()));
    m
}

/// The metadata of a handover request to `to` (or the best waiter) of the grant `token`.
pub(crate) fn handover_metadata(to: Option<&str>, token: u64) -> HashMap<String, String> {
    let mut m = HashMap::from([(META_FOR.to_string(), token.to_string())]);
    if let Some(id) = to {
        m.insert(META_TO.to_string(), encode(id));
    }
    m
}

/// What a grant's metadata says about its holder's candidacy: its priority (0 if the
/// grant was written without one) and whether it may be preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HolderCandidacy {
    pub(crate) priority: i32,
    pub(crate) preemptible: bool,
}

impl HolderCandidacy {
    pub(crate) fn of(metadata: &HashMap<String, String>) -> Self {
        HolderCandidacy {
            priority: metadata
                .get(META_PRIORITY)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
            preemptible: metadata.get(META_NO_PREEMPT).map(String::as_str) != Some("1"),
        }
    }

    /// Whether a waiter of priority `waiter` preempts this holder.
    pub(crate) fn preempted_by(&self, waiter: i32) -> bool {
        self.preemptible && waiter > self.priority
    }
}

impl Queue {
    /// Read a listing of the queue prefix (names relative to it). Blobs tenure did not
    /// write are ignored.
    pub(crate) fn from_listing(blobs: impl IntoIterator<Item = Blob>) -> Self {
        let mut q = Queue::default();
        for b in blobs {
            if b.name == HANDOVER {
                let for_token = b.metadata.get(META_FOR).and_then(|t| t.parse().ok());
                let to = match b.metadata.get(META_TO) {
                    None => Some(None),
                    Some(t) => decode(t).map(Some),
                };
                if let (Some(for_token), Some(to)) = (for_token, to) {
                    q.handover = Some(Handover {
                        to,
                        for_token,
                        etag: b.etag,
                    });
                }
                continue;
            }
            if b.name.len() != SEQ_DIGITS {
                continue;
            }
            let Ok(seq) = b.name.parse::<u64>() else {
                continue;
            };
            if !b.leased {
                q.unleased.push((b.name.clone(), b.etag.clone()));
            }
            let id = b.metadata.get(META_ID).and_then(|i| decode(i));
            let priority = b
                .metadata
                .get(META_PRIORITY)
                .and_then(|p| p.parse::<i32>().ok());
            let (Some(id), Some(priority)) = (id, priority) else {
                continue;
            };
            q.entries.push(Entry {
                name: b.name,
                seq,
                id,
                priority,
                live: b.leased,
            });
        }
        q.entries.sort_by_key(|e| e.seq);
        q
    }

    /// The arrival number for a newcomer: after every entry listed (live or not).
    pub(crate) fn next_seq(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.seq)
            .max()
            .map_or(1, |s| s + 1)
    }

    /// The live entry named `name`, if listed.
    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The live entries.
    pub(crate) fn live(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.live)
    }

    /// Whether a live entry other than `own` waits.
    pub(crate) fn others_wait(&self, own: Option<&str>) -> bool {
        self.live().any(|e| Some(e.name.as_str()) != own)
    }

    /// The waiter to grant next: the one a handover asked for if it waits, else the
    /// highest priority, ties in arrival order. Lapsed entries are skipped.
    pub(crate) fn best(&self) -> Option<&Entry> {
        if let Some(Handover { to: Some(to), .. }) = &self.handover {
            if let Some(e) = self.live().find(|e| &e.id == to) {
                return Some(e);
            }
        }
        // `max_by_key` keeps the last of equal keys: compare (priority, earlier seq).
        self.live()
            .max_by_key(|e| (e.priority, std::cmp::Reverse(e.seq)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(name: &str, leased: bool, meta: &[(&str, &str)]) -> Blob {
        Blob {
            name: name.to_string(),
            etag: format!("etag-{name}"),
            leased,
            metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn waiter(seq: u64, id: &str, priority: i32, leased: bool) -> Blob {
        let p = priority.to_string();
        blob(
            &entry_name(seq),
            leased,
            &[(META_ID, id), (META_PRIORITY, p.as_str())],
        )
    }

    fn order(mut q: Queue) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(best) = q.best().cloned() {
            out.push(best.id.clone());
            q.entries.retain(|e| e.name != best.name);
            q.handover = None;
        }
        out
    }

    #[test]
    fn priority_first_then_arrival() {
        // The order check of the contract: 0, 5, 5, 2 joining → 5, 5, 2, 0.
        let q = Queue::from_listing(vec![
            waiter(3, "d", 5, true),
            waiter(1, "b", 0, true),
            waiter(4, "e", 2, true),
            waiter(2, "c", 5, true),
        ]);
        assert_eq!(order(q), ["c", "d", "e", "b"]);
    }

    #[test]
    fn arrival_numbers_sort_as_numbers() {
        // 10 arrived after 9: zero-padded names, parsed as numbers.
        let q = Queue::from_listing(vec![
            waiter(10, "late", 1, true),
            waiter(9, "early", 1, true),
        ]);
        assert_eq!(order(q.clone()), ["early", "late"]);
        assert_eq!(q.next_seq(), 11);
        assert_eq!(entry_name(9).len(), SEQ_DIGITS);
        assert!(entry_name(9) < entry_name(10));
        assert_eq!(Queue::default().next_seq(), 1);
    }

    #[test]
    fn lapsed_entries_are_skipped_but_numbered_after() {
        let q = Queue::from_listing(vec![
            waiter(1, "crashed", 9, false),
            waiter(2, "alive", 0, true),
        ]);
        assert_eq!(q.best().map(|e| e.id.as_str()), Some("alive"));
        assert_eq!(
            q.unleased,
            [(entry_name(1), format!("etag-{}", entry_name(1)))]
        );
        assert_eq!(q.next_seq(), 3);
        assert!(q.others_wait(None));
        assert!(!q.others_wait(Some(&entry_name(2))));
        let gone = Queue::from_listing(vec![waiter(1, "crashed", 9, false)]);
        assert!(gone.best().is_none());
        assert!(!gone.others_wait(None));
    }

    #[test]
    fn a_handover_target_goes_first_while_it_waits() {
        let meta = handover_metadata(Some("c/ü"), 7);
        let mut listing = vec![
            waiter(1, "b", 9, true),
            waiter(2, "c/ü", 0, true),
            blob(HANDOVER, false, &[]),
        ];
        listing[2].metadata = meta;
        let q = Queue::from_listing(listing.clone());
        let h = q.handover.clone().expect("handover parsed");
        assert_eq!((h.to.as_deref(), h.for_token), (Some("c/ü"), 7));
        assert_eq!(q.best().map(|e| e.id.as_str()), Some("c/ü"));
        // The target left (its entry lapsed): back to priority order.
        listing[1].leased = false;
        let q = Queue::from_listing(listing);
        assert_eq!(q.best().map(|e| e.id.as_str()), Some("b"));
        // A handover to the best waiter names nobody.
        let any = handover_metadata(None, 3);
        let mut h = blob(HANDOVER, false, &[]);
        h.metadata = any;
        let q = Queue::from_listing(vec![h, waiter(1, "x", 0, true), waiter(2, "y", 4, true)]);
        assert_eq!(q.handover.as_ref().map(|h| h.to.clone()), Some(None));
        assert_eq!(q.best().map(|e| e.id.as_str()), Some("y"));
    }

    #[test]
    fn foreign_blobs_are_ignored() {
        let q = Queue::from_listing(vec![
            blob("notes", true, &[(META_ID, "x"), (META_PRIORITY, "1")]),
            blob(&entry_name(1), true, &[(META_PRIORITY, "1")]),
            blob(
                &entry_name(2),
                true,
                &[(META_ID, "x"), (META_PRIORITY, "high")],
            ),
            blob(HANDOVER, false, &[(META_FOR, "x")]),
        ]);
        assert!(q.entries.is_empty() && q.handover.is_none());
    }

    #[test]
    fn candidacy_round_trips_and_decides_preemption() {
        let c = Candidate::new("n-1").and_then(|c| c.with_priority(-3));
        let c = c.expect("candidate");
        let m = entry_metadata(&c);
        let q = Queue::from_listing(vec![Blob {
            name: entry_name(4),
            etag: String::new(),
            leased: true,
            metadata: m.clone(),
        }]);
        assert_eq!(q.entries[0].id, "n-1");
        assert_eq!(q.entries[0].priority, -3);
        let holder = HolderCandidacy::of(&m);
        assert_eq!(holder.priority, -3);
        assert!(holder.preemptible);
        assert!(holder.preempted_by(-2));
        assert!(!holder.preempted_by(-3), "an equal priority preempted");
        assert!(!holder.preempted_by(-4), "a lower priority preempted");
        let stays = HolderCandidacy::of(&candidacy_metadata(&c.clone().never_preempted()));
        assert!(!stays.preemptible);
        assert!(!stays.preempted_by(1000));
        // A grant written before priorities existed: priority 0, preemptible.
        let old = HolderCandidacy::of(&HashMap::new());
        assert_eq!(
            old,
            HolderCandidacy {
                priority: 0,
                preemptible: true
            }
        );
    }
}
