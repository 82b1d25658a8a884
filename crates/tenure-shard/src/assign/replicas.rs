//! Step 1 of the assignment: each shard's replica set, the `R` active nodes with the
//! highest rendezvous scores for it, spread over the failure domains.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::types::{NodeKey, NodeSpec, Plan, NONE};
use crate::hash::rendezvous_score;

/// A node's rank for a shard: its rendezvous score, ties to the lower node number.
pub(super) type Ranked = (u64, Reverse<u32>);

/// The failure domains of the nodes, numbered in order of first appearance: `of[n]`
/// is node `n`'s (nodes without a zone share one).
pub(super) struct Zones {
    pub(super) of: Vec<u32>,
    pub(super) count: usize,
}

impl Zones {
    pub(super) fn new(nodes: &[NodeSpec]) -> Zones {
        let mut numbers: HashMap<Option<&str>, u32> = HashMap::new();
        let of = nodes
            .iter()
            .map(|n| {
                let next = numbers.len() as u32;
                *numbers.entry(n.zone.as_deref()).or_insert(next)
            })
            .collect();
        Zones {
            of,
            count: numbers.len(),
        }
    }
}

/// Picks a shard's replica set from candidate nodes (see the module docs), reusing its
/// buffers from shard to shard.
struct Selector<'a> {
    node_hash: &'a [u64],
    zones: &'a Zones,
    r: usize,
    /// The best `2r` candidates, highest first: enough to fill up after one per zone.
    top: Vec<Ranked>,
    best_in_zone: Vec<Option<Ranked>>,
    /// Zones with an entry in `best_in_zone` for the current shard.
    seen: Vec<u32>,
}

impl<'a> Selector<'a> {
    fn new(node_hash: &'a [u64], zones: &'a Zones, r: usize) -> Self {
        Selector {
            node_hash,
            zones,
            r,
            top: Vec::with_capacity(2 * r + 1),
            best_in_zone: vec![None; zones.count],
            seen: Vec::new(),
        }
    }

    /// The replica set of the shard with hash `sh` among `candidates`, into `out`
    /// (highest rank first). With one zone (or none) it is the top `r`; otherwise
    /// the best of each zone, the `r` best of those, filled up with the best others
    /// when there are fewer than `r` zones. Picking from a set that holds the pick
    /// of a larger set gives that pick: dropping a node that was not picked changes
    /// nothing (it was below its zone's best, or below the fill), which is what lets
    /// a join be scored against the last replica sets alone.
    fn select(&mut self, sh: u64, candidates: impl Iterator<Item = u32>, out: &mut Vec<Ranked>) {
        out.clear();
        let rank = |n: u32| (rendezvous_score(sh, self.node_hash[n as usize]), Reverse(n));
        if self.zones.count <= 1 {
            for n in candidates {
                insert_ranked(out, rank(n), self.r);
            }
            return;
        }
        for z in self.seen.drain(..) {
            self.best_in_zone[z as usize] = None;
        }
        self.top.clear();
        for n in candidates {
            let key = rank(n);
            insert_ranked(&mut self.top, key, 2 * self.r);
            let z = self.zones.of[n as usize];
            let slot = &mut self.best_in_zone[z as usize];
            if slot.is_none() {
                self.seen.push(z);
            }
            if slot.is_none_or(|best| key > best) {
                *slot = Some(key);
            }
        }
        for z in &self.seen {
            if let Some(key) = self.best_in_zone[*z as usize] {
                insert_ranked(out, key, self.r);
            }
        }
        if out.len() < self.r {
            for key in &self.top {
                if out.len() == self.r {
                    break;
                }
                if !out.contains(key) {
                    out.push(*key);
                }
            }
            out.sort_unstable_by(|a, b| b.cmp(a));
        }
    }
}

/// The replica set of every shard among `active` (flat, `r` per shard).
pub(super) fn replica_sets(
    shard_hashes: &[u64],
    active: &[u32],
    node_hash: &[u64],
    zones: &Zones,
    r: usize,
) -> Vec<u32> {
    let mut replicas = vec![NONE; shard_hashes.len() * r];
    if r == 0 {
        return replicas;
    }
    let mut selector = Selector::new(node_hash, zones, r);
    let mut best: Vec<Ranked> = Vec::with_capacity(r + 1);
    for (s, sh) in shard_hashes.iter().enumerate() {
        selector.select(*sh, active.iter().copied(), &mut best);
        for (i, (_, Reverse(n))) in best.iter().enumerate() {
            replicas[s * r + i] = *n;
        }
    }
    replicas
}

/// The replica sets for the nodes `key` (sorted ids with their active flags and
/// zones), worked out from those of `prev` for other nodes: a shard none of whose
/// replicas left keeps them and only the nodes that came (or became active, or moved
/// zone) are scored with them; a shard that lost a replica is scored afresh. A join
/// then costs O(P·R), not O(P·N). The result equals [`replica_sets`] for the same
/// nodes (see [`Selector::select`]; ties are broken by node number, whose order
/// among the nodes both lists have is their id order in both). `None` (work it out
/// afresh) where the replication or the shards differ, or where so many nodes came
/// or went that scoring every node is about as cheap.
pub(super) fn replica_sets_after(
    prev: &Plan,
    shard_hashes: &[u64],
    key: &[NodeKey],
    node_hash: &[u64],
    zones: &Zones,
    r: usize,
) -> Option<Vec<u32>> {
    if r == 0 || prev.r != r || prev.preferred.len() != shard_hashes.len() {
        return None;
    }
    // Active nodes by id, with their number and zone, in both lists.
    let now: HashMap<&str, (u32, &Option<String>)> = key
        .iter()
        .enumerate()
        .filter(|(_, (_, active, _))| *active)
        .map(|(n, (id, _, zone))| (id.as_str(), (n as u32, zone)))
        .collect();
    let before: HashMap<&str, &Option<String>> = prev
        .key
        .iter()
        .filter(|(_, active, _)| *active)
        .map(|(id, _, zone)| (id.as_str(), zone))
        .collect();
    // Old node number → new one, for the nodes active in both lists in one zone.
    let kept: Vec<Option<u32>> = prev
        .key
        .iter()
        .map(|(id, active, zone)| {
            let (n, z) = now.get(id.as_str()).copied()?;
            (*active && z == zone).then_some(n)
        })
        .collect();
    let came: Vec<u32> = key
        .iter()
        .enumerate()
        .filter(|(_, (id, active, zone))| *active && before.get(id.as_str()) != Some(&zone))
        .map(|(n, _)| n as u32)
        .collect();
    let stayed = kept.iter().flatten().count();
    let went = before.len() - stayed;
    if 2 * (came.len() + went) > now.len() {
        return None;
    }
    let active: Vec<u32> = now.values().map(|(n, _)| *n).collect();
    let mut replicas = vec![NONE; shard_hashes.len() * r];
    let mut selector = Selector::new(node_hash, zones, r);
    let mut best: Vec<Ranked> = Vec::with_capacity(r + 1);
    let mut candidates: Vec<u32> = Vec::with_capacity(r + came.len());
    for (s, sh) in shard_hashes.iter().enumerate() {
        let old = &prev.replicas[s * r..(s + 1) * r];
        candidates.clear();
        for &n in old {
            match kept.get(n as usize).copied().flatten() {
                Some(n) => candidates.push(n),
                None => break,
            }
        }
        if candidates.len() == old.len() {
            candidates.extend_from_slice(&came);
            selector.select(*sh, candidates.iter().copied(), &mut best);
        } else {
            selector.select(*sh, active.iter().copied(), &mut best);
        }
        for (i, (_, Reverse(n))) in best.iter().enumerate() {
            replicas[s * r + i] = *n;
        }
    }
    Some(replicas)
}

/// Puts `key` into `best` (highest first, at most `r` long) if it ranks there.
pub(super) fn insert_ranked(best: &mut Vec<Ranked>, key: Ranked, r: usize) {
    if best.len() < r || best.last().is_some_and(|last| key > *last) {
        let at = best.partition_point(|b| *b > key);
        best.insert(at, key);
        best.truncate(r);
    }
}
