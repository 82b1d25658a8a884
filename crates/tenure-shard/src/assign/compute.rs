//! Computing the assignment ([`plan`], [`plan_reusing`]): the active nodes, their
//! fair targets (step 2), and the keep and place steps (3 and 4) over the replica
//! sets; and the replica sets alone ([`replicas_only`]).

use std::cmp::Reverse;
use std::sync::Arc;

use super::placer::Placer;
use super::replicas::{replica_sets, replica_sets_after, Zones};
use super::types::{NodeKey, NodeSpec, Plan, NONE};
use crate::hash::{key_hash, rendezvous_score};

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
