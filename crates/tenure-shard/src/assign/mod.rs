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
//!
//! [`rendezvous_score`]: crate::hash::rendezvous_score

mod compute;
mod placer;
mod replicas;
mod types;

pub(crate) use self::compute::replicas_only;
pub use self::compute::{plan, plan_reusing};
pub use self::types::{NodeSpec, Plan};

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::replicas::{insert_ranked, replica_sets, replica_sets_after, Ranked, Zones};
    use super::types::NodeKey;
    use super::*;
    use crate::hash::{key_hash, rendezvous_score};
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
