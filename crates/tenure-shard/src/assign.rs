//! The assignment: which nodes replicate each shard and which one should lead it,
//! computed by every node alike from the same view (the members, their weights and
//! drain flags, and who holds which shard now). No node coordinates the others.
//!
//! 1. **Replica sets**: a shard's replicas are the `R` active nodes with the highest
//!    [`rendezvous_score`] for it, taken so that they span as many failure domains
//!    (zones) as there are, up to `R`: the best-scoring node of each zone, the `R`
//!    best of those, and, with fewer than `R` zones, the best-scoring other nodes.
//!    Without zones that is the plain top `R`. A join or leave changes the replica
//!    sets of about `R·P/N` shards and no others.
//! 2. **Targets**: node `n` should lead `P·wₙ/W` shards, rounded by largest remainder
//!    (ties go to the node that holds more now, then by hash), so targets sum to `P`
//!    and, with equal weights, are ⌊P/N⌋ or ⌈P/N⌉. The extra ones are spread over the
//!    zones by their share of the nodes, so zones of equal size lead within one shard
//!    of each other.
//! 3. **Keep**: a holder that is still an active replica keeps its shard, up to its
//!    target; a node above its target gives up first the shards that another replica
//!    with room can take, and among those the ones where it ranks lowest.
//! 4. **Place**: every other shard goes to its best-ranked replica below target; if all
//!    its replicas are full, a shortest chain of moves through replica sets makes room
//!    (augmenting path); only if none exists does a replica exceed its target.
//!
//! Keeping holders is what makes the plan stable: with the holdings it produced, it
//! produces itself again (a balanced cluster makes no moves); after a crash only the
//! dead node's shards move; after a join about the newcomer's target moves.

use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::hash::{key_hash, rendezvous_score};

/// Marks "no node".
const NONE: u32 = u32::MAX;

/// What the replica sets depend on of a node: its id, whether it is active, its zone.
type NodeKey = (String, bool, Option<String>);

/// A node's rank for a shard: its rendezvous score, ties to the lower node number.
type Ranked = (u64, Reverse<u32>);

/// A member as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// The member id.
    pub id: String,
    /// Relative share of leaderships (1 = normal); 0 counts as draining.
    pub weight: u32,
    /// A draining node replicates and leads nothing.
    pub draining: bool,
    /// The node's failure domain (a zone, or zone and rack): replica sets span as many
    /// as there are. Nodes without one count as one domain together.
    pub zone: Option<String>,
}

impl NodeSpec {
    /// A node of weight 1, not draining, in no zone.
    pub fn new(id: impl Into<String>) -> Self {
        NodeSpec {
            id: id.into(),
            weight: 1,
            draining: false,
            zone: None,
        }
    }

    /// The same node in failure domain `zone`.
    pub fn in_zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    pub(crate) fn active(&self) -> bool {
        !self.draining && self.weight > 0
    }
}

/// The computed assignment. Node numbers index the `nodes` slice given to [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    r: usize,
    /// The node list (id, active, zone) the replica sets were computed for.
    key: Arc<Vec<NodeKey>>,
    replicas: Arc<Vec<u32>>,
    preferred: Vec<u32>,
    targets: Vec<u32>,
    loads: Vec<u32>,
}

impl Plan {
    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.preferred.len()
    }

    /// The replicas of `shard`, best rank first (empty if no node is active).
    pub fn replicas(&self, shard: usize) -> &[u32] {
        if self.r == 0 {
            return &[];
        }
        &self.replicas[shard * self.r..(shard + 1) * self.r]
    }

    /// The node that should lead `shard`, if any node is active.
    pub fn preferred(&self, shard: usize) -> Option<u32> {
        self.preferred.get(shard).copied().filter(|n| *n != NONE)
    }

    /// How many leaderships `node` should have.
    pub fn target(&self, node: u32) -> u32 {
        self.targets.get(node as usize).copied().unwrap_or(0)
    }

    /// How many leaderships the plan gives `node`.
    pub fn load(&self, node: u32) -> u32 {
        self.loads.get(node as usize).copied().unwrap_or(0)
    }

    /// Planned leaderships per node (indexed like the `nodes` slice).
    pub fn loads(&self) -> &[u32] {
        &self.loads
    }

    /// The same replica sets and fair shares with other leaders (`NONE`-free where a
    /// shard has one), the counts per node following them: what a balance other than
    /// by count chose.
    pub(crate) fn with_leaders(&self, preferred: Vec<u32>) -> Plan {
        let mut loads = vec![0u32; self.loads.len()];
        for n in &preferred {
            if let Some(l) = loads.get_mut(*n as usize) {
                *l += 1;
            }
        }
        Plan {
            r: self.r,
            key: self.key.clone(),
            replicas: self.replicas.clone(),
            preferred,
            targets: self.targets.clone(),
            loads,
        }
    }

    /// This plan with the leaders of some shards changed, `(shard, node)`: O(P) to
    /// copy, O(changes) to apply, instead of planning again.
    pub(crate) fn with_leaders_changed(&self, changes: &[(usize, u32)]) -> Plan {
        let mut plan = self.clone();
        for &(s, n) in changes {
            let Some(slot) = plan.preferred.get_mut(s) else {
                continue;
            };
            if let Some(l) = plan.loads.get_mut(*slot as usize) {
                *l = l.saturating_sub(1);
            }
            *slot = n;
            if let Some(l) = plan.loads.get_mut(n as usize) {
                *l += 1;
            }
        }
        plan
    }

    /// Shards whose planned leader differs from their current holder (shards without
    /// a holder are not counted).
    pub fn moves_from(&self, holders: &[Option<u32>]) -> usize {
        holders
            .iter()
            .enumerate()
            .filter(|(s, h)| h.is_some_and(|h| self.preferred(*s) != Some(h)))
            .count()
    }
}

/// Compute the assignment of `shard_hashes.len()` shards (hashes from
/// [`key_hash`](crate::hash::key_hash) of the shard names) over `nodes`, which every
/// caller must list in the same order (the shard manager sorts them by id), with
/// `replication` replicas per shard and `holders[s]` the node that holds shard `s` now.
pub fn plan(
    shard_hashes: &[u64],
    nodes: &[NodeSpec],
    replication: usize,
    holders: &[Option<u32>],
) -> Plan {
    plan_reusing(None, shard_hashes, nodes, replication, holders)
}

/// [`plan`], reusing the replica sets of `previous` when they were computed for the
/// same nodes (ids and drain flags), shards and replication: the common case of a
/// member publishing new holdings costs O(P) instead of O(P·N) then.
pub fn plan_reusing(
    previous: Option<&Plan>,
    shard_hashes: &[u64],
    nodes: &[NodeSpec],
    replication: usize,
    holders: &[Option<u32>],
) -> Plan {
    let p = shard_hashes.len();
    let active = active_nodes(nodes);
    let node_hash = node_hashes(nodes);
    let base = replicas_only(previous, shard_hashes, nodes, replication, holders);
    let (r, key, replicas) = (base.r, base.key, base.replicas);
    let holder = |s: usize| holder_at(holders, nodes.len(), s);
    let reps = |s: usize| &replicas[s * r..(s + 1) * r];

    // 2. Targets.
    let targets = base.targets;

    // 3. Keep holders that are still replicas, up to their targets.
    let mut preferred = vec![NONE; p];
    let mut loads = vec![0u32; nodes.len()];
    let mut kept: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    if r > 0 {
        for (s, pref) in preferred.iter_mut().enumerate() {
            if let Some(h) = holder(s) {
                if reps(s).contains(&h) {
                    *pref = h;
                    loads[h as usize] += 1;
                    kept[h as usize].push(s as u32);
                }
            }
        }
    }
    for &n in &active {
        let (load, target) = (loads[n as usize], targets[n as usize]);
        if load <= target {
            continue;
        }
        let mut mine: Vec<(bool, Reverse<usize>, u64, u32)> = kept[n as usize]
            .iter()
            .map(|&s| {
                let su = s as usize;
                let room_elsewhere = reps(su)
                    .iter()
                    .any(|&m| m != n && loads[m as usize] < targets[m as usize]);
                let rank = reps(su).iter().position(|&m| m == n).unwrap_or(r);
                (
                    !room_elsewhere,
                    Reverse(rank),
                    rendezvous_score(shard_hashes[su], node_hash[n as usize]),
                    s,
                )
            })
            .collect();
        mine.sort_unstable();
        for (_, _, _, s) in mine.iter().take((load - target) as usize) {
            preferred[*s as usize] = NONE;
            loads[n as usize] -= 1;
        }
    }

    // 4. Place the rest.
    if r > 0 {
        let mut assigned: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
        for (s, n) in preferred.iter().enumerate() {
            if *n != NONE {
                assigned[*n as usize].push(s as u32);
            }
        }
        let sticky: Vec<bool> = preferred.iter().map(|n| *n != NONE).collect();
        let mut placer = Placer {
            sticky,
            replicas: &replicas,
            r,
            preferred: &mut preferred,
            loads: &mut loads,
            targets: &targets,
            assigned,
        };
        for s in 0..p {
            if placer.preferred[s] == NONE {
                placer.place(s as u32);
            }
        }
    }

    Plan {
        r,
        key,
        replicas,
        preferred,
        targets,
        loads,
    }
}

/// The numbers of the active nodes.
fn active_nodes(nodes: &[NodeSpec]) -> Vec<u32> {
    (0..nodes.len() as u32)
        .filter(|n| nodes[*n as usize].active())
        .collect()
}

/// Each node's [`key_hash`].
fn node_hashes(nodes: &[NodeSpec]) -> Vec<u64> {
    nodes.iter().map(|n| key_hash(&n.id)).collect()
}

/// The holder of shard `s` in `holders`, if it is one of the `nodes` nodes.
fn holder_at(holders: &[Option<u32>], nodes: usize, s: usize) -> Option<u32> {
    holders
        .get(s)
        .copied()
        .flatten()
        .filter(|h| (*h as usize) < nodes)
}

/// Each node's fair share of the `p` shards: `P·wₙ/W` rounded by largest remainder
/// (ties to the node that holds more now, then by hash), the extra ones spread over
/// the zones by their share of the nodes; 0 for nodes that are not active.
fn fair_targets(p: usize, nodes: &[NodeSpec], holders: &[Option<u32>]) -> Vec<u32> {
    let active = active_nodes(nodes);
    let node_hash = node_hashes(nodes);
    let holder = |s: usize| holder_at(holders, nodes.len(), s);
    let mut targets = vec![0u32; nodes.len()];
    let mut held = vec![0u32; nodes.len()];
    for s in 0..p {
        if let Some(h) = holder(s) {
            held[h as usize] += 1;
        }
    }
    if !active.is_empty() {
        let total: u128 = active
            .iter()
            .map(|n| u128::from(nodes[*n as usize].weight))
            .sum();
        let mut rems = Vec::with_capacity(active.len());
        let mut given = 0u128;
        for &n in &active {
            let q = p as u128 * u128::from(nodes[n as usize].weight);
            targets[n as usize] = (q / total) as u32;
            given += q / total;
            rems.push((
                Reverse(q % total),
                Reverse(held[n as usize]),
                node_hash[n as usize],
                n,
            ));
        }
        rems.sort_unstable();
        // The extra shards go in that order, but spread over the zones (by their
        // share of the nodes), so that zones lead within one shard of their share as
        // well as nodes; without zones this is the plain order.
        let zones = Zones::new(nodes);
        let mut zone_nodes = vec![0usize; zones.count];
        for &n in &active {
            zone_nodes[zones.of[n as usize] as usize] += 1;
        }
        let mut zone_extras = vec![0usize; zones.count];
        let mut taken = vec![false; rems.len()];
        for _ in 0..(p as u128 - given) as usize {
            let next = (0..rems.len()).filter(|i| !taken[*i]).min_by(|a, b| {
                let (za, zb) = (
                    zones.of[rems[*a].3 as usize] as usize,
                    zones.of[rems[*b].3 as usize] as usize,
                );
                // extras_a / nodes_a against extras_b / nodes_b, exactly.
                (zone_extras[za] * zone_nodes[zb])
                    .cmp(&(zone_extras[zb] * zone_nodes[za]))
                    .then(a.cmp(b))
            });
            let Some(i) = next else {
                break;
            };
            taken[i] = true;
            let n = rems[i].3 as usize;
            zone_extras[zones.of[n] as usize] += 1;
            targets[n] += 1;
        }
    }

    targets
}

/// Steps 1 and 2 alone: the replica sets of [`plan_reusing`] (reusing `previous`'s
/// as it does) and the nodes' fair shares, with no leaders yet, for a balance other
/// than by count to choose leaders in.
pub(crate) fn replicas_only(
    previous: Option<&Plan>,
    shard_hashes: &[u64],
    nodes: &[NodeSpec],
    replication: usize,
    holders: &[Option<u32>],
) -> Plan {
    let p = shard_hashes.len();
    let active = active_nodes(nodes);
    let r = replication.max(1).min(active.len());
    let node_hash = node_hashes(nodes);
    let zones = Zones::new(nodes);
    let key: Vec<NodeKey> = nodes
        .iter()
        .map(|n| (n.id.clone(), n.active(), n.zone.clone()))
        .collect();
    let reuse =
        previous.filter(|prev| prev.r == r && prev.preferred.len() == p && *prev.key == key);
    let replicas = match reuse {
        Some(prev) => prev.replicas.clone(),
        None => Arc::new(
            previous
                .and_then(|prev| {
                    replica_sets_after(prev, shard_hashes, &key, &node_hash, &zones, r)
                })
                .unwrap_or_else(|| replica_sets(shard_hashes, &active, &node_hash, &zones, r)),
        ),
    };
    let key = match reuse {
        Some(prev) => prev.key.clone(),
        None => Arc::new(key),
    };
    Plan {
        r,
        key,
        replicas,
        preferred: vec![NONE; p],
        targets: fair_targets(p, nodes, holders),
        loads: vec![0; nodes.len()],
    }
}

/// The failure domains of the nodes, numbered in order of first appearance: `of[n]`
/// is node `n`'s (nodes without a zone share one).
struct Zones {
    of: Vec<u32>,
    count: usize,
}

impl Zones {
    fn new(nodes: &[NodeSpec]) -> Zones {
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
fn replica_sets(
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
fn replica_sets_after(
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
fn insert_ranked(best: &mut Vec<Ranked>, key: Ranked, r: usize) {
    if best.len() < r || best.last().is_some_and(|last| key > *last) {
        let at = best.partition_point(|b| *b > key);
        best.insert(at, key);
        best.truncate(r);
    }
}

struct Placer<'a> {
    /// Shards kept by their holder: chains move them only if nothing else works.
    sticky: Vec<bool>,
    replicas: &'a [u32],
    r: usize,
    preferred: &'a mut [u32],
    loads: &'a mut [u32],
    targets: &'a [u32],
    assigned: Vec<Vec<u32>>,
}

impl Placer<'_> {
    fn reps(&self, s: u32) -> &[u32] {
        let s = s as usize;
        &self.replicas[s * self.r..(s + 1) * self.r]
    }

    fn has_room(&self, n: u32) -> bool {
        self.loads[n as usize] < self.targets[n as usize]
    }

    fn put(&mut self, s: u32, n: u32) {
        self.preferred[s as usize] = n;
        self.loads[n as usize] += 1;
        self.assigned[n as usize].push(s);
    }

    fn take(&mut self, s: u32, n: u32) {
        let list = &mut self.assigned[n as usize];
        if let Some(i) = list.iter().position(|x| *x == s) {
            list.swap_remove(i);
        }
        self.loads[n as usize] -= 1;
    }

    fn place(&mut self, s: u32) {
        if let Some(&n) = self.reps(s).iter().find(|n| self.has_room(**n)) {
            self.put(s, n);
            return;
        }
        if self.augment(s, false) || self.augment(s, true) {
            return;
        }
        // No chain of moves frees a replica: the least loaded one goes over target.
        let reps = self.reps(s);
        let n = reps
            .iter()
            .enumerate()
            .min_by_key(|(rank, n)| (self.loads[**n as usize], *rank))
            .map(|(_, n)| *n)
            .unwrap_or(reps[0]);
        self.put(s, n);
    }

    /// Breadth-first search for the shortest chain `s → x₀, t₁: x₀ → x₁, …` ending at a
    /// node below target; applies it and returns true if found. Unless `move_kept`,
    /// the chain moves only shards placed in this round, not ones kept by a holder.
    fn augment(&mut self, s: u32, move_kept: bool) -> bool {
        let n = self.loads.len();
        // parent[x] = (shard that would move into x, node it comes from or NONE for s).
        let mut parent: Vec<Option<(u32, u32)>> = vec![None; n];
        let mut queue = VecDeque::new();
        for &x in self.reps(s) {
            parent[x as usize] = Some((s, NONE));
            queue.push_back(x);
        }
        let mut visited = queue.len();
        let mut end = queue.iter().copied().find(|x| self.has_room(*x));
        'search: while let Some(x) = queue.pop_front() {
            if end.is_some() || visited == n {
                break;
            }
            for &t in &self.assigned[x as usize] {
                if !move_kept && self.sticky[t as usize] {
                    continue;
                }
                for &y in self.reps(t) {
                    if y != x && parent[y as usize].is_none() {
                        parent[y as usize] = Some((t, x));
                        visited += 1;
                        if self.has_room(y) {
                            end = Some(y);
                            break 'search;
                        }
                        queue.push_back(y);
                    }
                }
                // Every node is reached: scanning more of x's shards finds nothing new.
                if visited == n {
                    break;
                }
            }
        }
        let Some(mut cur) = end else {
            return false;
        };
        while let Some((t, from)) = parent[cur as usize] {
            if from == NONE {
                self.put(t, cur);
                break;
            }
            self.take(t, from);
            self.put(t, cur);
            cur = from;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn shards(p: usize) -> Vec<u64> {
        (0..p).map(|i| key_hash(&format!("ns/{i:05}"))).collect()
    }

    fn nodes(n: usize) -> Vec<NodeSpec> {
        let mut v: Vec<_> = (0..n)
            .map(|i| NodeSpec::new(format!("node-{i:02}")))
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// The plan's leader of every shard, by node id.
    fn leaders(plan: &Plan, nodes: &[NodeSpec]) -> Vec<Option<String>> {
        (0..plan.shards())
            .map(|s| plan.preferred(s).map(|n| nodes[n as usize].id.clone()))
            .collect()
    }

    /// `leaders` as holder indices into `nodes` (ids not in `nodes` hold nothing).
    fn holders(leaders: &[Option<String>], nodes: &[NodeSpec]) -> Vec<Option<u32>> {
        leaders
            .iter()
            .map(|l| {
                l.as_ref()
                    .and_then(|id| nodes.iter().position(|n| &n.id == id))
                    .map(|i| i as u32)
            })
            .collect()
    }

    fn assert_balanced(plan: &Plan, nodes: &[NodeSpec]) {
        let p = plan.shards();
        let active: Vec<usize> = (0..nodes.len()).filter(|n| nodes[*n].active()).collect();
        let (lo, hi) = (p / active.len(), p.div_ceil(active.len()));
        for &n in &active {
            let l = plan.load(n as u32) as usize;
            assert!(
                lo <= l && l <= hi,
                "node {} leads {l}, not in [{lo}, {hi}]",
                nodes[n].id
            );
        }
        for s in 0..p {
            let lead = plan.preferred(s).expect("every shard has a leader");
            assert!(
                plan.replicas(s).contains(&lead),
                "leader outside the replica set"
            );
            assert!(nodes[lead as usize].active());
        }
    }

    #[test]
    fn cold_start_is_balanced_and_deterministic() {
        for (p, n) in [
            (256, 5),
            (64, 4),
            (1000, 10),
            (10, 4),
            (7, 7),
            (3, 5),
            (1024, 3),
        ] {
            let (sh, ns) = (shards(p), nodes(n));
            let a = plan(&sh, &ns, 3, &[]);
            assert_eq!(a, plan(&sh, &ns, 3, &[]));
            if p >= n {
                assert_balanced(&a, &ns);
            }
            for s in 0..p {
                let reps = a.replicas(s);
                assert_eq!(reps.len(), 3.min(n));
                let mut d = reps.to_vec();
                d.dedup();
                assert_eq!(d.len(), reps.len());
            }
        }
    }

    #[test]
    fn plan_with_its_own_holdings_is_a_fixpoint() {
        for (p, n) in [(256, 5), (1000, 10), (64, 4)] {
            let (sh, ns) = (shards(p), nodes(n));
            let a = plan(&sh, &ns, 3, &[]);
            let h = holders(&leaders(&a, &ns), &ns);
            let b = plan(&sh, &ns, 3, &h);
            assert_eq!(b.moves_from(&h), 0);
            assert_eq!(leaders(&a, &ns), leaders(&b, &ns));
        }
    }

    #[test]
    fn a_crash_moves_only_the_dead_nodes_shards() {
        for (p, n) in [(256, 5), (1000, 10), (64, 4), (10_000, 10)] {
            let (sh, ns) = (shards(p), nodes(n));
            let before = leaders(&plan(&sh, &ns, 3, &[]), &ns);
            for dead in 0..n {
                let survivors: Vec<NodeSpec> =
                    ns.iter().filter(|x| x.id != ns[dead].id).cloned().collect();
                let h = holders(&before, &survivors);
                let after = plan(&sh, &survivors, 3, &h);
                assert_balanced(&after, &survivors);
                let moved = after.moves_from(&h);
                assert_eq!(moved, 0, "P={p} N={n}: {moved} live shards moved");
            }
        }
    }

    #[test]
    fn a_join_moves_about_the_newcomers_target() {
        for (p, n) in [(256, 5), (1000, 10), (64, 4), (10_000, 10)] {
            let (sh, ns) = (shards(p), nodes(n));
            let before = leaders(&plan(&sh, &ns, 3, &[]), &ns);
            let mut grown = ns.clone();
            grown.push(NodeSpec::new("node-new"));
            grown.sort_by(|a, b| a.id.cmp(&b.id));
            let h = holders(&before, &grown);
            let after = plan(&sh, &grown, 3, &h);
            assert_balanced(&after, &grown);
            let new = grown.iter().position(|x| x.id == "node-new").unwrap() as u32;
            let optimum = after.target(new) as usize;
            let moved = after.moves_from(&h);
            assert!(
                moved as f64 <= optimum as f64 * 1.1,
                "P={p} N={n}: {moved} moves, optimum {optimum}"
            );
        }
    }

    #[test]
    fn drain_moves_only_the_draining_nodes_shards() {
        let (sh, mut ns) = (shards(256), nodes(5));
        let before = leaders(&plan(&sh, &ns, 3, &[]), &ns);
        ns[2].draining = true;
        let h = holders(&before, &ns);
        let after = plan(&sh, &ns, 3, &h);
        assert_eq!(after.load(2), 0);
        assert_balanced(&after, &ns);
        let theirs = h.iter().filter(|x| **x == Some(2)).count();
        assert_eq!(after.moves_from(&h), theirs);
    }

    #[test]
    fn reusing_replica_sets_gives_the_same_plan() {
        let (sh, ns) = (shards(500), nodes(6));
        let a = plan(&sh, &ns, 3, &[]);
        let h = holders(&leaders(&a, &ns), &ns);
        let mut h2 = h.clone();
        h2[3] = None;
        h2[7] = Some(0);
        let reused = plan_reusing(Some(&a), &sh, &ns, 3, &h2);
        assert!(Arc::ptr_eq(&reused.replicas, &a.replicas));
        assert_eq!(reused, plan(&sh, &ns, 3, &h2));
        let mut ns2 = ns.clone();
        ns2[1].draining = true;
        let other = plan_reusing(Some(&a), &sh, &ns2, 3, &h);
        assert!(!Arc::ptr_eq(&other.replicas, &a.replicas));
        assert_eq!(other, plan(&sh, &ns2, 3, &h));
    }

    #[test]
    fn replica_sets_worked_out_from_the_last_plan_equal_fresh_ones() {
        let sh = shards(3000);
        let mut ns = nodes(12);
        let mut prev = plan(&sh, &ns, 3, &[]);
        let mut next = crate::hash::test_rng(0x9e37_79b9_7f4a_7c15u64);
        let (mut worked_out, mut fresh_count) = (0, 0);
        let zone = |i: usize| format!("z{}", i % 3);
        for (i, n) in ns.iter_mut().enumerate() {
            if i % 4 != 0 {
                n.zone = Some(zone(i));
            }
        }
        for round in 0..120 {
            match next(5) {
                0 => ns.push(NodeSpec::new(format!("joined-{round:02}")).in_zone(zone(round))),
                1 if ns.len() > 4 => {
                    ns.remove(next(ns.len()));
                }
                2 => {
                    let n = next(ns.len());
                    ns[n].draining = !ns[n].draining;
                }
                3 => {
                    let n = next(ns.len());
                    ns[n].zone = Some(zone(round + 1));
                }
                _ => {
                    // Two at once, one in, one out.
                    ns.push(NodeSpec::new(format!("swapped-{round:02}")));
                    ns.remove(next(ns.len()));
                }
            }
            ns.sort_by(|a, b| a.id.cmp(&b.id));
            let key: Vec<NodeKey> = ns
                .iter()
                .map(|n| (n.id.clone(), n.active(), n.zone.clone()))
                .collect();
            let active: Vec<u32> = (0..ns.len() as u32)
                .filter(|n| ns[*n as usize].active())
                .collect();
            let node_hash: Vec<u64> = ns.iter().map(|n| key_hash(&n.id)).collect();
            let zones = Zones::new(&ns);
            let r = 3.min(active.len());
            let fresh = replica_sets(&sh, &active, &node_hash, &zones, r);
            match replica_sets_after(&prev, &sh, &key, &node_hash, &zones, r) {
                Some(from_prev) => {
                    assert_eq!(from_prev, fresh, "round {round}");
                    worked_out += 1;
                }
                None => fresh_count += 1,
            }
            prev = plan_reusing(Some(&prev), &sh, &ns, 3, &[]);
            assert_eq!(*prev.replicas, fresh, "round {round}");
        }
        assert!(
            worked_out >= 60,
            "{worked_out} of 120 worked out, {fresh_count} afresh"
        );
    }

    /// The replica set by its definition: nodes in score order, the first of each
    /// zone until `r`, then the best of the others.
    fn greedy(sh: u64, ns: &[NodeSpec], r: usize) -> Vec<u32> {
        let mut all: Vec<Ranked> = (0..ns.len() as u32)
            .filter(|n| ns[*n as usize].active())
            .map(|n| {
                (
                    rendezvous_score(sh, key_hash(&ns[n as usize].id)),
                    Reverse(n),
                )
            })
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        let mut picked: Vec<Ranked> = Vec::new();
        let mut zones = Vec::new();
        for k in &all {
            let z = &ns[k.1 .0 as usize].zone;
            if picked.len() < r && !zones.contains(z) {
                zones.push(z.clone());
                picked.push(*k);
            }
        }
        for k in &all {
            if picked.len() < r && !picked.contains(k) {
                picked.push(*k);
            }
        }
        picked.sort_unstable_by(|a, b| b.cmp(a));
        picked.into_iter().map(|(_, Reverse(n))| n).collect()
    }

    #[test]
    fn replica_sets_span_the_zones_and_match_their_definition() {
        let sh = shards(2000);
        let mut next = crate::hash::test_rng(0x5eed_2041);
        for (n, z, r) in [
            (9, 3, 3),
            (10, 2, 3),
            (12, 5, 3),
            (7, 1, 3),
            (6, 6, 2),
            (5, 0, 3),
        ] {
            let mut ns = nodes(n);
            if z > 0 {
                for node in ns.iter_mut() {
                    // Unequal zones: a random zone per node.
                    node.zone = Some(format!("zone-{}", next(z)));
                }
            }
            let distinct_zones = {
                let mut all: Vec<_> = ns.iter().map(|n| n.zone.clone()).collect();
                all.sort();
                all.dedup();
                all.len()
            };
            let a = plan(&sh, &ns, r, &[]);
            for (s, h) in sh.iter().enumerate() {
                let reps = a.replicas(s);
                assert_eq!(reps, greedy(*h, &ns, r).as_slice(), "n={n} z={z} shard {s}");
                let mut spanned: Vec<_> = reps.iter().map(|m| &ns[*m as usize].zone).collect();
                spanned.sort();
                spanned.dedup();
                assert_eq!(
                    spanned.len(),
                    distinct_zones.min(r),
                    "n={n} z={z} shard {s}"
                );
            }
            if z == 0 {
                // Without zones: the plain top r.
                let active: Vec<u32> = (0..n as u32).collect();
                let hashes: Vec<u64> = ns.iter().map(|x| key_hash(&x.id)).collect();
                let mut best = Vec::new();
                for (s, h) in sh.iter().enumerate() {
                    best.clear();
                    for &m in &active {
                        insert_ranked(
                            &mut best,
                            (rendezvous_score(*h, hashes[m as usize]), Reverse(m)),
                            r,
                        );
                    }
                    let top: Vec<u32> = best.iter().map(|(_, Reverse(m))| *m).collect();
                    assert_eq!(a.replicas(s), top.as_slice());
                }
            }
        }
    }

    #[test]
    fn losing_a_zone_moves_only_its_shards_and_leaves_every_shard_a_replica() {
        let sh = shards(3000);
        let ns: Vec<NodeSpec> = nodes(9)
            .into_iter()
            .enumerate()
            .map(|(i, n)| n.in_zone(format!("zone-{}", i % 3)))
            .collect();
        let before = plan(&sh, &ns, 3, &[]);
        assert_balanced(&before, &ns);
        for s in 0..sh.len() {
            let zones: HashSet<_> = before
                .replicas(s)
                .iter()
                .map(|n| &ns[*n as usize].zone)
                .collect();
            assert_eq!(zones.len(), 3, "shard {s}");
        }
        // Leaderships per zone follow the nodes per zone (each node's share is
        // rounded to a whole shard: 333 or 334 here, so a zone of three leads
        // 1000 ± 3).
        let mut per_zone: HashMap<&Option<String>, u32> = HashMap::new();
        for (n, node) in ns.iter().enumerate() {
            *per_zone.entry(&node.zone).or_default() += before.load(n as u32);
        }
        assert!(
            per_zone.values().all(|l| l.abs_diff(1000) <= 3),
            "{per_zone:?}"
        );
        let leaders_before = leaders(&before, &ns);
        let survivors: Vec<NodeSpec> = ns
            .iter()
            .filter(|n| n.zone.as_deref() != Some("zone-1"))
            .cloned()
            .collect();
        let h = holders(&leaders_before, &survivors);
        let after = plan(&sh, &survivors, 3, &h);
        assert_balanced(&after, &survivors);
        assert_eq!(after.moves_from(&h), 0, "a surviving leader moved");
        for s in 0..sh.len() {
            // Two of every shard's three replicas were outside the lost zone: each
            // had standbys queued when its leader's zone went.
            let left = before
                .replicas(s)
                .iter()
                .filter(|n| ns[**n as usize].zone.as_deref() != Some("zone-1"))
                .count();
            assert_eq!(left, 2, "shard {s}");
        }
    }

    #[test]
    fn weights_share_leaderships() {
        let (sh, mut ns) = (shards(1000), nodes(4));
        ns[0].weight = 2;
        let a = plan(&sh, &ns, 3, &[]);
        assert_eq!(a.load(0), 400);
        for n in 1..4 {
            assert_eq!(a.load(n), 200);
        }
    }

    #[test]
    fn no_active_node_means_no_leader() {
        let sh = shards(8);
        let mut ns = nodes(2);
        ns.iter_mut().for_each(|n| n.draining = true);
        let a = plan(&sh, &ns, 3, &[]);
        assert!((0..8).all(|s| a.preferred(s).is_none() && a.replicas(s).is_empty()));
        let empty = plan(&sh, &[], 3, &[Some(7)]);
        assert!(empty.preferred(0).is_none());
    }
}
