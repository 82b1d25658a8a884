//! The public picture of a namespace: who leads each shard, its replicas, and the
//! balance across nodes.

use std::sync::Arc;

use tenure_core::FencingToken;

use crate::assign::{self, Plan};
use crate::config::{Layout, Shard};
use crate::state::View;

/// One shard in a [`ShardView`].
#[derive(Clone, Debug, PartialEq)]
pub struct ShardInfo {
    /// The shard.
    pub shard: Shard,
    /// The node that holds it by the members' published state (or by the store, in a
    /// [`snapshot`](crate::ShardManager::snapshot)).
    pub leader: Option<String>,
    /// The node that should hold it by the assignment.
    pub preferred: Option<String>,
    /// Its replica set, best rank first.
    pub replicas: Vec<String>,
    /// The fencing token of the current grant, where known (a node knows its own;
    /// a snapshot reads every shard's from the store).
    pub token: Option<FencingToken>,
    /// The last load figure its leaders published (as quantized: within 4%), if any.
    pub load: Option<f64>,
}

/// One member in a [`ShardView`].
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Member id.
    pub id: String,
    /// Weight.
    pub weight: u32,
    /// Whether it is draining.
    pub draining: bool,
    /// Its failure domain, if it declared one.
    pub zone: Option<String>,
    /// Shards it holds (by its published state).
    pub leads: usize,
    /// Its fair share: ⌊P·w/W⌋ or one more (targets sum to P).
    pub target: usize,
    /// Shards the assignment gives it: its target, unless the replica sets make
    /// that impossible (e.g. replication 1, or very few shards per node).
    pub planned: usize,
    /// The load of the shards it leads (sum of their last published figures).
    pub load: f64,
}

/// The whole map of a namespace at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardView {
    /// Every shard, in order.
    pub shards: Vec<ShardInfo>,
    /// The members taking part, by id.
    pub nodes: Vec<NodeInfo>,
    /// Members whose published value could not be used, with the reason.
    pub ignored: Vec<(String, String)>,
}

impl ShardView {
    pub(crate) fn build(layout: &Layout, view: &View, plan: &Plan) -> ShardView {
        let name = |n: u32| view.nodes[n as usize].id.clone();
        let shards = layout
            .shards
            .iter()
            .map(|s| ShardInfo {
                shard: s.clone(),
                leader: view.holders.get(s.index()).map(name),
                preferred: plan.preferred(s.index()).map(name),
                replicas: plan.replicas(s.index()).iter().map(|n| name(*n)).collect(),
                token: None,
                load: (view.loads.get(s.index()) > 0)
                    .then(|| crate::balance::level(view.loads.get(s.index())) as f64 / 1000.0),
            })
            .collect();
        let per_node = &view.node_load;
        let nodes = view
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeInfo {
                id: n.id.clone(),
                weight: n.weight,
                draining: n.draining,
                zone: n.zone.clone(),
                leads: view.leads[i],
                target: plan.target(i as u32) as usize,
                planned: plan.load(i as u32) as usize,
                load: per_node[i] as f64 / 1000.0,
            })
            .collect();
        ShardView {
            shards,
            nodes,
            ignored: view.ignored.clone(),
        }
    }

    /// Shards without a leader.
    pub fn leaderless(&self) -> usize {
        self.shards.iter().filter(|s| s.leader.is_none()).count()
    }

    /// Shards whose leader is not the preferred node (handoffs still to happen).
    pub fn misplaced(&self) -> usize {
        self.shards
            .iter()
            .filter(|s| s.leader.is_some() && s.leader != s.preferred)
            .count()
    }

    /// True when every shard is led by its preferred node.
    pub fn settled(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.leader.is_some() && s.leader == s.preferred)
    }

    /// The most leaderships of any active node divided by the mean over active nodes
    /// (1.0 is perfect balance; 0.0 if no node is active).
    pub fn imbalance(&self) -> f64 {
        max_over_mean(self.nodes.iter().filter(|n| !n.draining).map(|n| n.leads))
    }

    /// The most load per weight of an active node over the mean (1.0 is perfect
    /// balance; 0.0 if no load is reported).
    pub fn load_imbalance(&self) -> f64 {
        max_per_weight_over_mean(
            self.nodes
                .iter()
                .filter(|n| !n.draining)
                .map(|n| (n.weight, n.load)),
        )
    }
}

/// The largest of `leads` over their mean (0 if there are none or all are 0).
pub(crate) fn max_over_mean(leads: impl Iterator<Item = usize>) -> f64 {
    let (mut n, mut total, mut max) = (0usize, 0usize, 0usize);
    for l in leads {
        n += 1;
        total += l;
        max = max.max(l);
    }
    if total == 0 {
        0.0
    } else {
        max as f64 * n as f64 / total as f64
    }
}

/// Compute the plan for a view (shared by the manager and the read-only map).
pub(crate) fn plan_for(layout: &Layout, view: &View) -> Arc<Plan> {
    plan_after(None, layout, view)
}

/// [`plan_for`], reusing `previous`'s replica sets if the nodes are the same. By load
/// when the balancer balances by load and loads are reported (with the balancer's
/// moves), else by count.
pub(crate) fn plan_after(previous: Option<&Plan>, layout: &Layout, view: &View) -> Arc<Plan> {
    match &view.moves {
        Some(moves) if view.loads.reported > 0 => plan_by_load_with(previous, layout, view, moves),
        _ => Arc::new(assign::plan_reusing(
            previous,
            &layout.hashes,
            &view.nodes,
            layout.replication,
            &view.holders.to_vec(),
        )),
    }
}

/// `plan`, the plan by load of `old`, made to follow `new`'s moves where only the
/// moves or the figures changed (the same nodes, by load in both): each shard whose
/// move was added, changed or dropped goes to its move's target if that is an active
/// replica, else to its holder if that is one, else stays where the plan had it — what
/// [`plan_by_load`](crate::balance::plan_by_load) chooses for it, leaving aside the
/// shards without an eligible holder or move, which it places by load (a kept plan is
/// computed again once the members hold still). The figures alone choose no leader
/// there. `None` where a whole plan is needed; else the plan and the shards whose
/// leader changed. Every node of 10^6 shards planned again, O(P), for each change of
/// the balancer's moves, and moves ran at about 40 a second.
pub(crate) fn plan_with_new_moves(
    plan: &Arc<Plan>,
    old: &View,
    new: &View,
) -> Option<(Arc<Plan>, Vec<usize>)> {
    let (Some(was), Some(now)) = (&old.moves, &new.moves) else {
        return None;
    };
    if old.nodes != new.nodes || old.loads.reported == 0 || new.loads.reported == 0 {
        return None;
    }
    if was == now {
        // New figures alone: the same plan, not a copy of it (O(P) at every change).
        return Some((plan.clone(), Vec::new()));
    }
    let (plan, moved) = follow_moves(plan, &new.nodes, |s| new.holders.get(s), was, now);
    Some((Arc::new(plan), moved))
}

/// `plan` with the leaders of the shards whose move differs between `was` and `now`
/// (both sorted by shard) chosen again as [`plan_with_new_moves`] says, and those
/// shards.
pub(crate) fn follow_moves(
    plan: &Plan,
    nodes: &[crate::NodeSpec],
    holder: impl Fn(usize) -> Option<u32>,
    was: &[(usize, u32)],
    now: &[(usize, u32)],
) -> (Plan, Vec<usize>) {
    let eligible = |s: usize, n: u32| {
        nodes.get(n as usize).is_some_and(|spec| spec.active()) && plan.replicas(s).contains(&n)
    };
    let mut changes = Vec::new();
    let mut decide = |s: usize| {
        let wanted = now
            .binary_search_by(|(m, _)| m.cmp(&s))
            .ok()
            .map(|i| now[i].1)
            .filter(|n| eligible(s, *n));
        let held = holder(s).filter(|h| eligible(s, *h));
        if let Some(n) = wanted.or(held) {
            if plan.preferred(s) != Some(n) {
                changes.push((s, n));
            }
        }
    };
    // Both lists are sorted by shard: walk them together for the shards whose move
    // differs.
    let (mut i, mut j) = (0, 0);
    loop {
        match (was.get(i), now.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.0 == b.0 => {
                decide(a.0);
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                decide(a.0);
                i += 1;
            }
            (Some(_), Some(b)) | (None, Some(b)) => {
                decide(b.0);
                j += 1;
            }
            (Some(a), None) => {
                decide(a.0);
                i += 1;
            }
            (None, None) => break,
        }
    }
    let moved = changes.iter().map(|(s, _)| *s).collect();
    (plan.with_leaders_changed(&changes), moved)
}

/// The plan by load of `view` with `moves` (the balancer's, or the ones it is about
/// to publish).
pub(crate) fn plan_by_load_with(
    previous: Option<&Plan>,
    layout: &Layout,
    view: &View,
    moves: &[(usize, u32)],
) -> Arc<Plan> {
    Arc::new(crate::balance::plan_by_load(
        previous,
        &layout.hashes,
        &view.nodes,
        layout.replication,
        &view.holders.to_vec(),
        &view.loads.levels(layout.shards.len()),
        moves,
    ))
}

/// The most load per capacity of an active node over the mean (0 if no load).
pub(crate) fn load_imbalance(view: &View) -> f64 {
    max_per_weight_over_mean(
        view.nodes
            .iter()
            .zip(&view.node_load)
            .filter(|(n, _)| !n.draining)
            .map(|(n, l)| (n.weight, *l as f64)),
    )
}

/// The most load per weight over the mean, for (weight, load) of the active nodes
/// (weight 0 counts as inactive); 0 when they carry no load.
fn max_per_weight_over_mean(nodes: impl Iterator<Item = (u32, f64)>) -> f64 {
    let (mut load, mut weight, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for (w, l) in nodes.filter(|(w, _)| *w > 0) {
        load += l;
        weight += f64::from(w);
        worst = worst.max(l / f64::from(w));
    }
    if load == 0.0 {
        0.0
    } else {
        worst * weight / load
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::{level, plan_by_load, quantize, zipf};
    use crate::hash::{key_hash, test_rng};
    use crate::NodeSpec;

    /// Following new moves on a kept plan chooses the leaders a whole plan by load
    /// chooses, for every shard with a holder or a move to go by: over random move
    /// lists (some to nodes outside the shard's replicas, which neither takes), with
    /// some of the old moves made meanwhile.
    #[test]
    fn following_moves_chooses_what_a_whole_plan_chooses() {
        let p = 3000;
        let sh: Vec<u64> = (0..p).map(|i| key_hash(&format!("follow/{i}"))).collect();
        let ns: Vec<NodeSpec> = (0..10).map(|i| NodeSpec::new(format!("n{i}"))).collect();
        let loads: Vec<u64> = zipf(p, 1.1)
            .iter()
            .map(|f| level(quantize(f * 3.0)))
            .collect();
        let base = plan_by_load(None, &sh, &ns, 3, &vec![None; p], &loads, &[]);
        let start: Vec<Option<u32>> = (0..p).map(|s| base.preferred(s)).collect();
        let mut next = test_rng(0x00f0_110e);
        let mut moves = |n: usize| {
            let mut m: Vec<(usize, u32)> = (0..n)
                .map(|_| {
                    let s = next(p);
                    let to = if next(5) == 0 {
                        next(10) as u32
                    } else {
                        base.replicas(s)[next(3)]
                    };
                    (s, to)
                })
                .collect();
            m.sort_unstable();
            m.dedup_by_key(|(s, _)| *s);
            m
        };
        for round in 0..20 {
            let (was, now) = (moves(200), moves(200));
            let kept = plan_by_load(Some(&base), &sh, &ns, 3, &start, &loads, &was);
            // Half of the old moves were made (their targets hold the shards now).
            let mut holders = start.clone();
            for (i, (s, _)) in was.iter().enumerate() {
                if i % 2 == 0 {
                    holders[*s] = kept.preferred(*s);
                }
            }
            let (followed, moved) = follow_moves(&kept, &ns, |s| holders[s], &was, &now);
            let whole = plan_by_load(Some(&base), &sh, &ns, 3, &holders, &loads, &now);
            for s in 0..p {
                assert_eq!(
                    followed.preferred(s),
                    whole.preferred(s),
                    "round {round}, shard {s}: moved {}",
                    moved.contains(&s)
                );
            }
            assert_eq!(followed.loads(), whole.loads(), "round {round}");
            assert!(!moved.is_empty());
        }
    }
}
