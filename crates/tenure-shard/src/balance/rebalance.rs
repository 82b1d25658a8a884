//! Choosing leaders by load: the policy ([`LoadPolicy`]), the placement of the count
//! plan's shards by load ([`plan_by_load`]) and the moves that bring the nodes back
//! within the tolerance ([`rebalance`]).

use super::balancer::{pinned_high, Balancer, Search, AIM};
use crate::assign::{NodeSpec, Plan};

/// How to balance by load (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadPolicy {
    /// How far from its share of the load a node may be before shards move, as a
    /// fraction (0.10: within ±10% of the capacity-weighted mean).
    pub tolerance: f64,
    /// The most moves of leaders the balancer asks for in one `window` to even out
    /// load (placing shards that have no leader is not counted), and the most moves
    /// asked for and not made yet. A move is made when the store hands the seat over,
    /// a few round trips after the ask, so the handoffs that end within one window can
    /// be up to twice this many when one window's moves finish late.
    pub max_moves: usize,
    /// The window of `max_moves`.
    pub window: std::time::Duration,
}

impl Default for LoadPolicy {
    /// ±10%, at most 1,000 moves a second.
    fn default() -> Self {
        LoadPolicy {
            tolerance: 0.10,
            max_moves: 1000,
            window: std::time::Duration::from_secs(1),
        }
    }
}

/// The plan whose leaders are, by load: each holder that is an active replica keeps
/// its shard, the leaders `moves` asks for (where they are active replicas) take
/// theirs, and the shards left go heaviest first to the replica with the lowest load
/// per capacity after taking it. `loads` are per shard in [`level`](super::level)
/// units; the replica sets are those of the count plan for the same input. No
/// rebalancing happens here: [`rebalance`] chooses the moves.
pub fn plan_by_load(
    previous: Option<&Plan>,
    shard_hashes: &[u64],
    nodes: &[NodeSpec],
    replication: usize,
    holders: &[Option<u32>],
    loads: &[u64],
    moves: &[(usize, u32)],
) -> Plan {
    let base = crate::assign::replicas_only(previous, shard_hashes, nodes, replication, holders);
    let p = base.shards();
    if base.replicas(0).is_empty() {
        return base;
    }
    let mut b = Balancer::new(&base, nodes, loads);
    let eligible = |b: &Balancer, s: usize, n: u32| {
        b.cap.get(n as usize).is_some_and(|c| *c > 0) && b.plan.replicas(s).contains(&n)
    };
    let mut wanted = vec![u32::MAX; p];
    for &(s, n) in moves {
        if s < p && eligible(&b, s, n) {
            wanted[s] = n;
        }
    }
    let mut unplaced = Vec::new();
    for (s, want) in wanted.into_iter().enumerate() {
        match holders.get(s).copied().flatten() {
            _ if want != u32::MAX => b.put(s, want),
            Some(h) if eligible(&b, s, h) => b.put(s, h),
            _ => unplaced.push(s),
        }
    }
    unplaced.sort_by(|a, c| b.loads[*c].cmp(&b.loads[*a]).then(a.cmp(c)));
    for s in unplaced {
        let best = b
            .plan
            .replicas(s)
            .iter()
            .copied()
            .filter(|m| b.cap[*m as usize] > 0)
            .min_by(|x, y| b.compare_after(*x, *y, b.loads[s]));
        if let Some(m) = best {
            b.put(s, m);
        }
    }
    base.with_leaders(b.leader)
}

/// The leader moves that bring every active node of `plan` (leaders chosen, e.g. by
/// [`plan_by_load`]) within `policy.tolerance` of its capacity-weighted share of
/// `loads`, or as near as the replica sets allow, at most `budget` of them, as
/// (shard, new leader), the moves that fix the most first. Nodes above the band, the
/// worst first, give up the shard whose
/// move takes the most load out of the band; nodes below it, the emptiest first, take
/// the shard that does the same for them; each stops once back inside the band (see
/// the module docs).
pub fn rebalance(
    plan: &Plan,
    nodes: &[NodeSpec],
    loads: &[u64],
    policy: &LoadPolicy,
    budget: usize,
) -> Vec<(usize, u32)> {
    rebalance_with(plan, nodes, loads, policy, budget, Search::Index)
}

/// [`rebalance`] scoring every shard a node leads or replicates for each move, as it
/// did before the index: the same moves, in O(P/N · R) per move (for benchmarks).
#[cfg(feature = "testing")]
pub fn rebalance_by_scan(
    plan: &Plan,
    nodes: &[NodeSpec],
    loads: &[u64],
    policy: &LoadPolicy,
    budget: usize,
) -> Vec<(usize, u32)> {
    rebalance_with(plan, nodes, loads, policy, budget, Search::Scan)
}

fn rebalance_with(
    plan: &Plan,
    nodes: &[NodeSpec],
    loads: &[u64],
    policy: &LoadPolicy,
    budget: usize,
    search: Search,
) -> Vec<(usize, u32)> {
    let mut b = Balancer::new(plan, nodes, loads);
    for s in 0..plan.shards() {
        if let Some(n) = plan.preferred(s) {
            b.put(s, n);
        }
    }
    if b.total == 0 || budget == 0 {
        return Vec::new();
    }
    b.search = search;
    b.build_index();
    let mut heaviest: Vec<usize> = (0..plan.shards()).filter(|s| b.loads[*s] > 0).collect();
    heaviest.sort_unstable_by(|x, y| b.loads[*y].cmp(&b.loads[*x]).then(x.cmp(y)));
    let active: Vec<usize> = (0..nodes.len()).filter(|n| b.cap[*n] > 0).collect();
    // The band is a little narrower than the tolerance, so that the figures (each
    // within 4% of its code) end inside the tolerance too.
    let aim = policy.tolerance * AIM;
    let (high, low) = (1.0 + aim, 1.0 - aim);
    let mut moved: Vec<(usize, u32)> = Vec::new();
    // A node outside the band is worked on until it is back inside (working it
    // further in took twice the moves, mostly small shards, for figures that the
    // band says are fine); one with no move that helps is passed over until some
    // other move changes the picture.
    let (mut giving, mut taking) = (vec![false; nodes.len()], vec![false; nodes.len()]);
    let mut stuck = vec![false; nodes.len()];
    // Every move lowers the two nodes' spread, so this ends; the bound on rounds is
    // a guard against a cycle this reasoning missed (pins move as leaders do).
    let mut rounds_left = 4 * plan.shards() + 64;
    while moved.len() < budget {
        if rounds_left == 0 {
            tracing::warn!(
                moves = moved.len(),
                "rebalancing stopped by its guard on rounds"
            );
            break;
        }
        rounds_left -= 1;
        b.pin(&heaviest);
        for &n in &active {
            let r = b.ratio(n);
            let high = match b.pinned[n] {
                Some(_) => pinned_high(policy.tolerance),
                None => high,
            };
            giving[n] = r > high;
            taking[n] = r < low;
        }
        let over = active
            .iter()
            .copied()
            .filter(|n| giving[*n] && !stuck[*n])
            .max_by(|x, y| b.compare(*x, *y).then(y.cmp(x)));
        if let Some(n) = over {
            // A pinned node sheds every other shard it leads; if another replica of
            // its big shard leads fewer, moving the big shard there sheds less.
            let relocate = b.pinned[n].and_then(|_| b.better_home_for_pinned(n));
            let single = match relocate {
                Some((s, m)) => Some((f64::INFINITY, s, m)),
                None => b.best_move_from(n, aim, None),
            };
            // When no single move fixes much of this node's excess (its big shards
            // fit nowhere), a chain of two may: a big shard to a replica, which passes
            // one of its own on; two moves instead of many small ones.
            let excess = b.excess(n, b.node_load[n], aim);
            let chain = match single {
                Some((g, _, _)) if g >= excess / 2.0 => None,
                _ if moved.len() + 2 > budget => None,
                _ => b.best_chain_from(n, aim),
            };
            let steps: Vec<(usize, usize, usize)> = match (single, chain) {
                (single, Some((g2, s, m, s2, k)))
                    if single.is_none_or(|(g1, _, _)| g2 / 2.0 > g1) =>
                {
                    vec![(s, n, m), (s2, m, k)]
                }
                (Some((_, s, m)), _) => vec![(s, n, m)],
                (None, _) => Vec::new(),
            };
            if steps.is_empty() {
                stuck[n] = true;
            }
            for (s, from, to) in steps {
                b.left[s].push(from as u32);
                b.take(s, from);
                b.put(s, to as u32);
                moved.push((s, to as u32));
                stuck.iter_mut().for_each(|x| *x = false);
            }
            continue;
        }
        let under = active
            .iter()
            .copied()
            .filter(|n| taking[*n] && !stuck[*n])
            .min_by(|x, y| b.compare(*x, *y).then(x.cmp(y)));
        let Some(n) = under else {
            break;
        };
        match b.best_move_to(n, aim) {
            Some((s, from)) => {
                b.left[s].push(from as u32);
                b.take(s, from);
                b.put(s, n as u32);
                moved.push((s, n as u32));
                stuck.iter_mut().for_each(|x| *x = false);
            }
            None => stuck[n] = true,
        }
    }
    // A shard moved twice counts once, at its last leader, in the order the shards
    // were first moved (the order that fixes the most first).
    let mut last: std::collections::HashMap<usize, u32> = Default::default();
    let mut order = Vec::new();
    for (s, n) in moved {
        if last.insert(s, n).is_none() {
            order.push(s);
        }
    }
    order
        .into_iter()
        .filter_map(|s| last.get(&s).map(|n| (s, *n)))
        .filter(|(s, n)| plan.preferred(*s) != Some(*n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::{level, lower_bound, quantize, republish, zipf, DEADBAND};
    use crate::hash::{key_hash, test_rng};

    fn shards(p: usize) -> Vec<u64> {
        (0..p).map(|i| key_hash(&format!("load/{i:05}"))).collect()
    }

    fn nodes(n: usize) -> Vec<NodeSpec> {
        (0..n)
            .map(|i| NodeSpec::new(format!("node-{i:02}")))
            .collect()
    }

    /// Leaders placed by load from `holders`, then rebalanced within the policy.
    fn balanced(
        previous: Option<&Plan>,
        sh: &[u64],
        ns: &[NodeSpec],
        holders: &[Option<u32>],
        loads: &[u64],
        policy: &LoadPolicy,
    ) -> Plan {
        let placed = plan_by_load(previous, sh, ns, 3, holders, loads, &[]);
        let moves = rebalance(&placed, ns, loads, policy, policy.max_moves);
        plan_by_load(previous, sh, ns, 3, holders, loads, &moves)
    }

    fn levels_of(codes: &[u8]) -> Vec<u64> {
        codes.iter().map(|c| level(*c)).collect()
    }

    fn holders(plan: &Plan) -> Vec<Option<u32>> {
        (0..plan.shards()).map(|s| plan.preferred(s)).collect()
    }

    /// max/mean of the node loads (equal capacities) under `plan`.
    fn max_over_mean(plan: &Plan, loads: &[u64], n: usize) -> f64 {
        let mut per = vec![0u64; n];
        for (s, l) in loads.iter().enumerate() {
            per[plan.preferred(s).expect("a leader") as usize] += l;
        }
        let total: u64 = per.iter().sum();
        *per.iter().max().unwrap() as f64 * n as f64 / total as f64
    }

    /// 1,000 shards with Zipf loads on 10 equal nodes, R = 3, starting from the count
    /// plan's leaders: max/mean ends within 10%, or within 2% of the bound where that
    /// is above 1.1 (s = 1.1: the hottest shard alone is 1.8 × the mean node load).
    #[test]
    fn zipf_loads_are_balanced_to_the_bound() {
        zipf_case(1.1);
        zipf_case(0.8);
    }

    fn zipf_case(exponent: f64) {
        let (sh, ns) = (shards(1000), nodes(10));
        let codes: Vec<u8> = zipf(1000, exponent).into_iter().map(quantize).collect();
        let loads = levels_of(&codes);
        let count = crate::assign::plan(&sh, &ns, 3, &[]);
        let before = max_over_mean(&count, &loads, 10);
        let h = holders(&count);
        let by_load = balanced(None, &sh, &ns, &h, &loads, &LoadPolicy::default());
        let after = max_over_mean(&by_load, &loads, 10);
        let bound = lower_bound(&loads, 10);
        assert!(
            after <= (1.02 * bound).max(1.10),
            "s = {exponent}: max/mean {after:.3} (count plan {before:.3}), bound {bound:.3}"
        );
        assert!(
            after <= (1.02 * bound).max(1.10),
            "max/mean {after:.3} (count plan {before:.3}), bound {bound:.3}"
        );
        // Leaders stay within their replica sets, and the plan is its own fixpoint.
        for s in 0..1000 {
            assert!(by_load.replicas(s).contains(&by_load.preferred(s).unwrap()));
        }
        let again = balanced(
            None,
            &sh,
            &ns,
            &holders(&by_load),
            &loads,
            &LoadPolicy::default(),
        );
        assert_eq!(again.moves_from(&holders(&by_load)), 0);
        // It moved fewer shards than the count plan leads (most stay).
        let moved = by_load.moves_from(&h);
        assert!(moved < 200, "{moved} moves");
        eprintln!("zipf {exponent}: max/mean {before:.3} by count, {after:.3} by load (bound {bound:.3}), {moved} moves");
    }

    /// Moves to undo a shift over 100 layouts (shard names hashed differently):
    /// from balanced leaders, the figures of the shards ranked `first..first + 10` by
    /// heat swap with the ten coldest. Returns the moves of each, sorted.
    fn shift_moves(first: usize) -> Vec<usize> {
        let ns = nodes(10);
        let figures = zipf(1000, 1.1);
        let mut by_heat: Vec<usize> = (0..1000).collect();
        by_heat.sort_by(|a, b| figures[*b].total_cmp(&figures[*a]).then(a.cmp(b)));
        let policy = LoadPolicy::default();
        let mut all = Vec::new();
        for layout in 0..100 {
            let sh: Vec<u64> = (0..1000)
                .map(|i| key_hash(&format!("layout{layout}/{i:05}")))
                .collect();
            let mut codes: Vec<u8> = figures.iter().map(|l| quantize(*l)).collect();
            let count = crate::assign::plan(&sh, &ns, 3, &[]);
            let before = balanced(
                None,
                &sh,
                &ns,
                &holders(&count),
                &levels_of(&codes),
                &policy,
            );
            for k in 0..10 {
                codes.swap(by_heat[first + k], by_heat[999 - k]);
            }
            let loads = levels_of(&codes);
            let h = holders(&before);
            let after = balanced(Some(&before), &sh, &ns, &h, &loads, &policy);
            let (ratio, bound) = (max_over_mean(&after, &loads, 10), lower_bound(&loads, 10));
            all.push((after.moves_from(&h), ratio / bound.max(1.1 / 1.02)));
        }
        // Within the aim (≤ 1.10, or ≤ 1.02 × the bound) in at least 99 layouts, and
        // never more than 5% above the bound: where the replicas of a pinned node's
        // last small shard are all full, neither a move nor a chain of two frees it
        // (1 layout in 100 ends 2.7% above).
        let off: Vec<f64> = all.iter().map(|(_, r)| *r).filter(|r| *r > 1.02).collect();
        assert!(off.len() <= 1, "layouts above the aim: {off:?}");
        assert!(
            off.iter().all(|r| *r <= 1.05),
            "layouts above the aim: {off:?}"
        );
        let mut moves: Vec<usize> = all.into_iter().map(|(m, _)| m).collect();
        moves.sort_unstable();
        moves
    }

    /// 5 nodes, 200 shards, Zipf 1.1, from the count plan's leaders, over 100
    /// layouts: every one ends within 1.10 (the bound is 1.06). Relocating a pinned
    /// shard and taking by load once passed shards back and forth in some of them
    /// until the guard on rounds stopped it, far from balanced (1.4 to 1.6 on etcd
    /// and Redis).
    #[test]
    fn small_clusters_reach_the_aim_in_every_layout() {
        let ns = nodes(5);
        let codes: Vec<u8> = zipf(200, 1.1).into_iter().map(quantize).collect();
        let loads = levels_of(&codes);
        let bound = lower_bound(&loads, 5);
        let policy = LoadPolicy::default();
        for layout in 0..100 {
            let sh: Vec<u64> = (0..200)
                .map(|i| key_hash(&format!("small{layout}/{i:03}")))
                .collect();
            let count = crate::assign::plan(&sh, &ns, 3, &[]);
            let by_load = balanced(None, &sh, &ns, &holders(&count), &loads, &policy);
            let ratio = max_over_mean(&by_load, &loads, 5);
            assert!(
                ratio <= (1.02 * bound).max(1.10),
                "layout {layout}: max/mean {ratio:.3} (bound {bound:.3})"
            );
        }
    }

    /// Ten hot shards turn cold and ten cold ones hot: back within tolerance (or the
    /// bound), with at most 3 moves per changed shard in at least 95 layouts of 100
    /// and at most 5 in every one. The hot ones are those ranked 2 to 11: the hottest
    /// (alone 1.8 × a node's mean, the bound) keeps its figure; see the next test for
    /// a shift that moves the bound.
    #[test]
    fn a_load_shift_is_undone_with_few_moves() {
        let moves = shift_moves(1);
        let within = moves.iter().filter(|m| **m <= 3 * 20).count();
        eprintln!(
            "shift of ranks 2-11: median {} moves, 90th percentile {}, most {}; {within} of 100 layouts within 60",
            moves[50], moves[90], moves[99]
        );
        assert!(
            within >= 95,
            "{within} of 100 layouts within 60 moves: {moves:?}"
        );
        assert!(moves[99] <= 5 * 20, "{moves:?}");
    }

    /// The same with the hottest shard among the ten: the node that now leads the
    /// new hottest carries its whole tail of small shards, which must go to get within
    /// 2% of the bound, so the moves are many more (measured, not bounded: this is
    /// the cost of that aim).
    #[test]
    fn a_shift_of_the_hottest_shard_still_ends_at_the_bound() {
        let moves = shift_moves(0);
        eprintln!(
            "shift of ranks 1-10: median {} moves, 90th percentile {}, most {}",
            moves[50], moves[90], moves[99]
        );
        assert!(moves[0] > 0, "a shift that moves nothing: {moves:?}");
    }

    /// Every figure jitters ±20% at random every second for 60 s, reported through
    /// the deadband: at most 1% of the shards move.
    #[test]
    fn noise_moves_almost_nothing() {
        let (sh, ns) = (shards(1000), nodes(10));
        let figures = zipf(1000, 1.1);
        let mut published: Vec<u8> = figures.iter().map(|l| quantize(*l)).collect();
        let policy = LoadPolicy::default();
        let count = crate::assign::plan(&sh, &ns, 3, &[]);
        let mut plan = balanced(
            None,
            &sh,
            &ns,
            &holders(&count),
            &levels_of(&published),
            &policy,
        );
        let mut next = test_rng(0x0015_e5ee_d001);
        let mut moves = 0;
        let mut republished = 0;
        for _second in 0..60 {
            for (s, base) in figures.iter().enumerate() {
                let jitter = 0.8 + 0.4 * next(1_000_001) as f64 / 1_000_000.0;
                if let Some(code) = republish(published[s], base * jitter, DEADBAND) {
                    published[s] = code;
                    republished += 1;
                }
            }
            let h = holders(&plan);
            plan = balanced(Some(&plan), &sh, &ns, &h, &levels_of(&published), &policy);
            moves += plan.moves_from(&h);
        }
        assert!(
            moves <= 10,
            "{moves} moves ({republished} figures republished)"
        );
        // Without the deadband, the plan's own hysteresis still keeps moves rare.
        let mut raw: Vec<u64>;
        let mut moves_raw = 0;
        for _second in 0..60 {
            raw = figures
                .iter()
                .map(|base| {
                    let jitter = 0.8 + 0.4 * next(1_000_001) as f64 / 1_000_000.0;
                    level(quantize(base * jitter))
                })
                .collect();
            let h = holders(&plan);
            plan = balanced(Some(&plan), &sh, &ns, &h, &raw, &policy);
            moves_raw += plan.moves_from(&h);
        }
        eprintln!("noise: {moves} moves through the deadband ({republished} republished), {moves_raw} on raw figures");
    }

    /// The index finds the same moves as scoring every shard: over 40 layouts of
    /// Zipf loads (from the count plan's leaders, and after a shift), with equal
    /// capacities and 1:2:4, and a small budget.
    #[test]
    fn the_index_finds_the_moves_a_full_scan_finds() {
        let policy = LoadPolicy::default();
        let figures = zipf(600, 1.1);
        let mut compared = 0;
        for layout in 0..40 {
            let sh: Vec<u64> = (0..600)
                .map(|i| key_hash(&format!("index{layout}/{i:03}")))
                .collect();
            let mut ns = nodes(4 + layout % 7);
            if layout % 3 == 0 {
                for (i, n) in ns.iter_mut().enumerate() {
                    n.weight = 1 << (i % 3);
                }
            }
            let mut codes: Vec<u8> = figures.iter().map(|l| quantize(*l)).collect();
            if layout % 2 == 1 {
                codes.rotate_left(layout);
            }
            let loads = levels_of(&codes);
            let count = crate::assign::plan(&sh, &ns, 3, &[]);
            let placed = plan_by_load(None, &sh, &ns, 3, &holders(&count), &loads, &[]);
            for budget in [usize::MAX, 7] {
                let fast = rebalance_with(&placed, &ns, &loads, &policy, budget, Search::Index);
                let slow = rebalance_with(&placed, &ns, &loads, &policy, budget, Search::Scan);
                assert_eq!(fast, slow, "layout {layout}, budget {budget}");
                compared += usize::from(!fast.is_empty());
            }
        }
        assert!(compared >= 40, "only {compared} runs moved anything");
    }

    #[test]
    fn capacities_share_the_load_and_no_load_means_the_count_plan() {
        let sh = shards(600);
        let mut ns = nodes(3);
        ns[0].weight = 2;
        let loads = vec![level(quantize(10.0)); 600];
        let count = crate::assign::plan(&sh, &ns, 3, &[]);
        let p = balanced(
            None,
            &sh,
            &ns,
            &holders(&count),
            &loads,
            &LoadPolicy::default(),
        );
        let per: Vec<u32> = (0..3).map(|n| p.load(n)).collect();
        // Equal loads: the count plan already balances them by capacity.
        assert_eq!(per, vec![300, 150, 150]);
        // A plan by load keeps each node's fair share by count as its target.
        for n in 0..3 {
            assert_eq!(p.target(n), count.target(n));
        }
        // No load at all: nothing to move.
        let h = holders(&count);
        let none = plan_by_load(None, &sh, &ns, 3, &h, &[], &[]);
        assert!(rebalance(&none, &ns, &[], &LoadPolicy::default(), usize::MAX).is_empty());
        assert_eq!(none.moves_from(&h), 0);
    }

    /// Shards with no figure yet (a cold start, where leaders are placed before the
    /// loads come in) are spread by count: with all loads equal, each went to the
    /// first of its replicas, and at 10^6 shards one node took 156,602 leaders where
    /// another took 36,158 (too many for its load codes to fit its member value).
    #[test]
    fn shards_without_load_are_placed_by_count() {
        let (sh, ns) = (shards(3000), nodes(10));
        let mut loads = vec![0u64; 3000];
        // A few figures already reported, the rest still unknown.
        for (s, l) in loads.iter_mut().enumerate().step_by(97) {
            *l = level(quantize(100.0 + s as f64));
        }
        let plan = plan_by_load(None, &sh, &ns, 3, &vec![None; 3000], &loads, &[]);
        let counts: Vec<u32> = (0..10).map(|n| plan.load(n)).collect();
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(hi - lo <= 40, "leaders per node: {counts:?}");
        // Capacities count as they do by load: twice the weight, twice the shards.
        let mut heavy = nodes(3);
        heavy[0].weight = 2;
        let plan = plan_by_load(None, &sh, &heavy, 3, &vec![None; 3000], &vec![0; 3000], &[]);
        let counts: Vec<u32> = (0..3).map(|n| plan.load(n)).collect();
        assert_eq!(counts, vec![1500, 750, 750]);
    }
}
