//! Balance by load: where shards are not equal, choose leaders so that no node carries
//! much more than its share of the reported load, moving as few shards as it can.
//!
//! Loads are reported per shard in a unit the application picks and kept as one byte
//! each ([`quantize`]: a log scale of 8% steps from 0.01 to about 3·10^6, and 0), so a
//! figure costs the same to publish whatever it is, and every node computes with the
//! same integers ([`level`], in thousandths of the unit).
//!
//! [`plan_by_load`] takes the replica sets of the count plan and chooses leaders:
//! a holder that is an active replica keeps its shard, the moves asked for (by the
//! balancer, see the shard manager) take theirs, and the other shards, heaviest
//! first, go to the replica with the lowest load per capacity after taking them.
//!
//! [`rebalance`] chooses the moves, at most a budget of them. A node whose largest
//! shard alone is above its share is pinned to that shard (it aims at carrying it
//! alone; the others share the rest; if another replica of that shard leads fewer
//! and lighter shards, the big shard moves there instead of the rest moving away).
//! A node above `(1 + tolerance)` of its share (a pinned node: a tenth of the
//! tolerance above its shard), worst first, gives up the shard whose move takes the
//! most load out of the band, counting both nodes' excess (so one move fixes as much
//! as it can, and small shards move only when nothing bigger fits); then a node below
//! `(1 − tolerance)` takes the shard that does the same for it; each until it is back
//! inside the band or no move helps (the band is 0.9 of the tolerance, as figures are
//! quantized to within 4%). No shard goes back to a node it left in one rebalance,
//! so the search ends. Nodes inside the band are left alone, and together with the
//! reporters' deadband ([`republish`]) that keeps figures that drift from causing
//! churn.
//!
//! Reports that jitter are kept out before they reach the plan: [`republish`] lets a
//! new figure through only when it differs from the published one by more than a
//! factor (1.5 by default, [`DEADBAND`]), so noise of ±20% around a steady load
//! publishes nothing while a shard turning hot or cold is published at once.
//!
//! A node that leads shard `s` carries at least `load(s)`, so no placement does better
//! than max(1, largest shard ÷ mean node load) as max/mean ([`lower_bound`]); with
//! replication R a shard can only go to its R replicas, which can make the best
//! reachable figure higher still.
//!
//! Cost: O(P log P) for the placement order and O(P · R log P) for an index of the
//! shards by (leader, replica) ordered by load, then O(N log P) per move: the gain of
//! a move is concave in the load moved, so each pair of nodes needs two lookups
//! (see `best_of_pair`); `max_moves` bounds the moves asked for per window.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

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

/// The first level above 0, in thousandths of the unit (0.01).
const FIRST_LEVEL: u64 = 10;

/// The level of each code (thousandths of the unit): 0, then 0.01 growing by 8% a
/// step (integer arithmetic, so every platform has the same table).
fn levels() -> &'static [u64; 256] {
    static LEVELS: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    LEVELS.get_or_init(|| {
        let mut t = [0u64; 256];
        t[1] = FIRST_LEVEL;
        for k in 2..256 {
            t[k] = t[k - 1] + (t[k - 1] * 8 / 100).max(1);
        }
        t
    })
}

/// The one-byte code of a load figure: the level nearest to it on the log scale
/// (negative, NaN and 0 are 0; figures above the top level are the top level).
pub fn quantize(load: f64) -> u8 {
    if load.is_nan() || load <= 0.0 {
        return 0;
    }
    let milli = load * 1000.0;
    let t = levels();
    if milli <= t[1] as f64 {
        return if milli < t[1] as f64 / 2.0 { 0 } else { 1 };
    }
    // The first level at or above, then whichever neighbour is nearer in ratio.
    let above = t.partition_point(|&l| (l as f64) < milli).min(255);
    if above <= 1 {
        return above as u8;
    }
    let (lo, hi) = (t[above - 1] as f64, t[above] as f64);
    if milli / lo < hi / milli {
        (above - 1) as u8
    } else {
        above as u8
    }
}

/// The factor by which a reported load must differ from the published one before it
/// is published again ([`republish`]).
pub const DEADBAND: f64 = 1.5;

/// The code to publish for a shard whose published code is `published` when `load`
/// is reported: `None` while the report is within a factor `deadband` of the
/// published figure (both ways), else the report's code.
pub fn republish(published: u8, load: f64, deadband: f64) -> Option<u8> {
    let code = quantize(load);
    let (now, was) = (level(code) as f64, level(published) as f64);
    let within = if was == 0.0 || now == 0.0 {
        code == published
    } else {
        now <= was * deadband && was <= now * deadband
    };
    (!within).then_some(code)
}

/// The load a code stands for, in thousandths of the unit.
pub fn level(code: u8) -> u64 {
    levels()[code as usize]
}

/// Zipf-distributed figures for `p` shards, as demos and benchmarks use: the hottest
/// is 1000, the one of rank k (from 1) 1000 / k^`exponent`, ranks shuffled over the
/// shards by hash so that heat does not follow the shard order.
pub fn zipf(p: usize, exponent: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p).collect();
    order.sort_by_key(|i| crate::hash::key_hash(&format!("rank/{i}")));
    let mut figures = vec![0.0; p];
    for (rank, shard) in order.into_iter().enumerate() {
        figures[shard] = 1000.0 / ((rank + 1) as f64).powf(exponent);
    }
    figures
}

/// max(1, largest load ÷ mean node load) over `active` nodes of equal capacity: no
/// placement of these loads has a lower max/mean.
pub fn lower_bound(loads: &[u64], nodes: usize) -> f64 {
    let total: u64 = loads.iter().sum();
    let largest = loads.iter().copied().max().unwrap_or(0);
    if total == 0 || nodes == 0 {
        return 1.0;
    }
    (largest as f64 * nodes as f64 / total as f64).max(1.0)
}

/// The plan whose leaders are, by load: each holder that is an active replica keeps
/// its shard, the leaders `moves` asks for (where they are active replicas) take
/// theirs, and the shards left go heaviest first to the replica with the lowest load
/// per capacity after taking it. `loads` are per shard in [`level`] units; the replica
/// sets are those of the count plan for the same input. No rebalancing happens here:
/// [`rebalance`] chooses the moves.
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

/// How [`Balancer`] finds a node's best move.
#[derive(Clone, Copy, PartialEq)]
enum Search {
    /// Two shards per pair of nodes, either side of the gain's peak ([`Index`]).
    Index,
    /// Every shard the node leads or replicates: the reference the index is checked
    /// against.
    #[cfg(any(test, feature = "testing"))]
    Scan,
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

/// The part of the tolerance the balancer keeps nodes within.
const AIM: f64 = 0.9;

/// How far above its big shard a pinned node may carry, as a ratio: a tenth of the
/// tolerance (1% by default). A pinned node's load sets max/mean, which is meant to end
/// within 2% of the lower bound; figures are quantized to within 4% each, so aiming at
/// 2% on the codes could end above it on the figures.
fn pinned_high(tolerance: f64) -> f64 {
    1.0 + tolerance / 10.0
}

struct Balancer<'a> {
    plan: &'a Plan,
    cap: Vec<u64>,
    total: u128,
    total_cap: u128,
    /// The load of the shard a node is pinned to ([`Self::pin`]).
    pinned: Vec<Option<u64>>,
    /// The sum of all loads (`total` leaves the pinned shards out).
    all_load: u128,
    /// (shard, node) for every shard that left a node in this rebalance: it never
    /// goes back there, so no sequence of moves can cycle (pins move as leaders do,
    /// so the excess alone does not rule that out: relocating a pinned shard and
    /// taking by load once passed one shard back and forth until a guard stopped it,
    /// 864 moves for 4 net).
    left: Vec<Vec<u32>>,
    /// Each node's share of `total` (by capacity), as of the last [`Self::pin`].
    share: Vec<f64>,
    node_load: Vec<u64>,
    leader: Vec<u32>,
    /// Shards led by each node (unordered; a moved shard is swapped out), and each
    /// shard's place in its leader's list (a move costs O(1), not O(P/N)).
    led: Vec<Vec<usize>>,
    pos: Vec<usize>,
    loads: Vec<u64>,
    /// How many shards with load each node leads.
    loaded: Vec<usize>,
    /// The shards with load by leader and replica, once [`Self::build_index`] ran
    /// (kept up to date by every move from then on).
    index: Option<Index>,
    search: Search,
}

/// The shards with load, by (leader, another replica), each set ordered by (load,
/// shard): the moves open between two nodes. The gain of moving load `l` between
/// two given nodes is concave in `l`, rising up to a peak (see
/// `Balancer::best_of_pair`), so the best of a set is next to the peak: two lookups
/// per pair of nodes instead of a score for every shard a node leads.
struct Index {
    /// `out[n][m]`: the shards `n` leads that `m` replicates.
    out: Vec<BTreeMap<u32, BTreeSet<(u64, usize)>>>,
    /// `into[m]`: the nodes `n` with an `out[n][m]`.
    into: Vec<BTreeSet<u32>>,
}

impl<'a> Balancer<'a> {
    /// No leaders yet.
    fn new(plan: &'a Plan, nodes: &[NodeSpec], loads: &[u64]) -> Self {
        let p = plan.shards();
        let cap: Vec<u64> = nodes
            .iter()
            .map(|n| if n.draining { 0 } else { u64::from(n.weight) })
            .collect();
        let loads: Vec<u64> = (0..p).map(|s| loads.get(s).copied().unwrap_or(0)).collect();
        Balancer {
            plan,
            total: loads.iter().map(|l| u128::from(*l)).sum(),
            all_load: loads.iter().map(|l| u128::from(*l)).sum(),
            total_cap: cap.iter().map(|c| u128::from(*c)).sum(),
            cap,
            node_load: vec![0; nodes.len()],
            pinned: vec![None; nodes.len()],
            left: vec![Vec::new(); p],
            share: vec![0.0; nodes.len()],
            leader: vec![u32::MAX; p],
            led: vec![Vec::new(); nodes.len()],
            pos: vec![0; p],
            loads,
            loaded: vec![0; nodes.len()],
            index: None,
            search: Search::Index,
        }
    }

    /// Index the shards by leader and replica ([`Index`]); O(P · R log P).
    fn build_index(&mut self) {
        let n = self.cap.len();
        self.index = Some(Index {
            out: vec![BTreeMap::new(); n],
            into: vec![BTreeSet::new(); n],
        });
        for s in 0..self.leader.len() {
            if self.leader[s] != u32::MAX {
                self.file(s, self.leader[s], true);
            }
        }
    }

    /// Adds shard `s`, led by `n`, to the index, or removes it.
    fn file(&mut self, s: usize, n: u32, on: bool) {
        let (plan, l) = (self.plan, self.loads[s]);
        let Some(index) = self.index.as_mut().filter(|_| l > 0) else {
            return;
        };
        for &m in plan.replicas(s) {
            if m == n {
                continue;
            }
            if on {
                index.out[n as usize].entry(m).or_default().insert((l, s));
                index.into[m as usize].insert(n);
            } else if let Some(set) = index.out[n as usize].get_mut(&m) {
                set.remove(&(l, s));
            }
        }
    }

    fn put(&mut self, s: usize, n: u32) {
        self.leader[s] = n;
        self.node_load[n as usize] += self.loads[s];
        self.pos[s] = self.led[n as usize].len();
        self.led[n as usize].push(s);
        if self.loads[s] > 0 {
            self.loaded[n as usize] += 1;
            self.file(s, n, true);
        }
    }

    fn take(&mut self, s: usize, n: usize) {
        if self.loads[s] > 0 {
            self.loaded[n] -= 1;
            self.file(s, n as u32, false);
        }
        self.node_load[n] -= self.loads[s];
        let i = self.pos[s];
        if self.led[n].get(i) == Some(&s) {
            self.led[n].swap_remove(i);
            if let Some(&moved) = self.led[n].get(i) {
                self.pos[moved] = i;
            }
        }
        self.leader[s] = u32::MAX;
    }

    /// Node `n`'s load over its share of the total (1.0: exactly its share).
    fn ratio(&self, n: usize) -> f64 {
        if let Some(l) = self.pinned[n] {
            return self.node_load[n] as f64 / l as f64;
        }
        let share = self.total * u128::from(self.cap[n]);
        if share == 0 {
            return 0.0;
        }
        (u128::from(self.node_load[n]) * self.total_cap) as f64 / share as f64
    }

    /// Pin the nodes whose largest shard alone is more than their share: no placement
    /// gets such a node below that shard, so its aim is to carry that shard alone, and
    /// the others share what is left (`total` and `total_cap` then leave it out).
    /// `heaviest` lists the shards by load, heaviest first; the pins are computed
    /// again from the leaders now (after a move), looking only as far down the list as
    /// shards still pin.
    fn pin(&mut self, heaviest: &[usize]) {
        self.pinned.iter_mut().for_each(|p| *p = None);
        self.total = self.all_load;
        self.total_cap = self.cap.iter().map(|c| u128::from(*c)).sum();
        for &s in heaviest {
            let (l, n) = (self.loads[s], self.leader[s]);
            if n == u32::MAX {
                continue;
            }
            let n = n as usize;
            if self.pinned[n].is_some() {
                continue;
            }
            // l > total × cap_n / total_cap: this shard alone is above n's share.
            if u128::from(l) * self.total_cap <= self.total * u128::from(self.cap[n]) {
                break;
            }
            self.pinned[n] = Some(l.max(1));
            self.total -= u128::from(l);
            self.total_cap -= u128::from(self.cap[n]);
        }
        for n in 0..self.cap.len() {
            self.share[n] = if self.total_cap == 0 {
                0.0
            } else {
                self.total as f64 * self.cap[n] as f64 / self.total_cap as f64
            };
        }
    }

    /// For a node pinned to its largest shard: the replica of that shard, not pinned
    /// itself, that leads the fewest shards with load, if it leads at least two fewer
    /// than `n` does besides that shard and no more load (so neither this rule nor a
    /// node below the band taking it moves the shard back): (shard, node).
    fn better_home_for_pinned(&self, n: usize) -> Option<(usize, usize)> {
        let big = *self.heaviest_led(n, 1).first()?;
        let loaded = |m: usize| self.loaded[m];
        let others = loaded(n).saturating_sub(1);
        let other_load = self.node_load[n] - self.loads[big];
        self.plan
            .replicas(big)
            .iter()
            .map(|m| *m as usize)
            .filter(|m| {
                *m != n
                    && !self.left[big].contains(&(*m as u32))
                    && self.cap[*m] > 0
                    && self.pinned[*m].is_none()
                    && self.node_load[*m] * self.cap[n] <= other_load * self.cap[*m]
            })
            .map(|m| (loaded(m), m))
            .min()
            .filter(|(count, _)| count + 2 <= others)
            .map(|(_, m)| (big, m))
    }

    /// Compares the load per capacity of `a` and `b` exactly.
    fn compare(&self, a: usize, b: usize) -> Ordering {
        let (la, lb) = (u128::from(self.node_load[a]), u128::from(self.node_load[b]));
        (la * u128::from(self.cap[b])).cmp(&(lb * u128::from(self.cap[a])))
    }

    /// Which of `a` and `b` would have the lower load per capacity after taking
    /// `extra`; on a tie, the fewer leaders per capacity; then `a`, the better-ranked.
    /// A shard without a figure (`extra` 0: not reported yet, as at a cold start)
    /// changes no node's load, so it goes by leaders per capacity alone: by load, every
    /// such shard went to the least loaded of its replicas, and at 10^6 shards one node
    /// led 156,602 shards where another led 36,158.
    fn compare_after(&self, a: u32, b: u32, extra: u64) -> Ordering {
        let (a, b) = (a as usize, b as usize);
        let per_cap =
            |x: u128, y: u128| (x * u128::from(self.cap[b])).cmp(&(y * u128::from(self.cap[a])));
        let by_count = per_cap(self.led[a].len() as u128 + 1, self.led[b].len() as u128 + 1);
        if extra == 0 {
            return by_count;
        }
        per_cap(
            u128::from(self.node_load[a] + extra),
            u128::from(self.node_load[b] + extra),
        )
        .then(by_count)
    }

    /// How far load `load` on node `n` is outside its band, in load units: above
    /// `(1 + tolerance)` of its share or below `(1 − tolerance)` of it (a pinned node:
    /// above [`pinned_high`] of its shard; `tolerance` here is the aim).
    fn excess(&self, n: usize, load: u64, tolerance: f64) -> f64 {
        let load = load as f64;
        let (high, low) = self.band(n, tolerance);
        (load - high).max(0.0) + low.map_or(0.0, |low| (low - load).max(0.0))
    }

    /// How much moving load `l` from `from` to `to` takes out of the band's excess.
    fn gain(&self, from: usize, to: usize, l: u64, tolerance: f64) -> f64 {
        let (a, b) = (self.node_load[from], self.node_load[to]);
        self.excess(from, a, tolerance) + self.excess(to, b, tolerance)
            - self.excess(from, a - l, tolerance)
            - self.excess(to, b + l, tolerance)
    }

    /// Whether a move of `l` with gain `g` beats the best so far (more gain; on a tie,
    /// the lighter shard, then the lower numbers).
    fn beats(best: Option<(f64, u64, usize, usize)>, g: f64, l: u64, s: usize, m: usize) -> bool {
        g > 1e-9
            && best.is_none_or(|(bg, bl, bs, bm)| {
                g > bg + 1e-9 || ((g - bg).abs() <= 1e-9 && (l, s, m) < (bl, bs, bm))
            })
    }

    /// The move off node `n` that takes the most load out of the band (so each move
    /// fixes as much as it can, and small shards move only when nothing bigger fits):
    /// (shard, new node), or `None` if no move helps.
    fn best_move_from(
        &self,
        n: usize,
        tolerance: f64,
        except: Option<usize>,
    ) -> Option<(f64, usize, usize)> {
        let index = match &self.index {
            Some(index) if self.search == Search::Index => index,
            _ => return self.scan_move_from(n, tolerance, except),
        };
        let mut best: Option<(f64, u64, usize, usize)> = None;
        for (&m, set) in &index.out[n] {
            let m = m as usize;
            if self.cap[m] == 0 {
                continue;
            }
            let ok = |s: usize| Some(s) != except && !self.left[s].contains(&(m as u32));
            self.best_of_pair(set, (n, m), m, tolerance, ok, &mut best);
        }
        best.map(|(g, _, s, m)| (g, s, m))
    }

    /// The best move of a shard of `set` from `pair.0` to `pair.1` that `ok` allows,
    /// folded into `best` (`tie`, the other node, breaks ties as in [`Self::beats`]).
    ///
    /// Each node's excess is convex in its load, so the gain is concave in the load
    /// moved: it rises (by one per unit while `from` is above its band or `to` below
    /// its own, by two while both) up to a peak, then stays or falls. The best shard
    /// is the heaviest one up to the peak (of that load, the lowest-numbered) or the
    /// lightest one past it: two lookups per pair of nodes.
    fn best_of_pair(
        &self,
        set: &BTreeSet<(u64, usize)>,
        (from, to): (usize, usize),
        tie: usize,
        tolerance: f64,
        ok: impl Fn(usize) -> bool,
        best: &mut Option<(f64, u64, usize, usize)>,
    ) {
        // Loads up to ⌊peak⌋ are on the rising side, loads from ⌊peak⌋ + 1 past it.
        let cut = self.peak(from, to, tolerance).floor() as u64;
        let mut consider = |(l, s): (u64, usize)| {
            let g = self.gain(from, to, l, tolerance);
            if Self::beats(*best, g, l, s, tie) {
                *best = Some((g, l, s, tie));
            }
        };
        let rising = set.range(..=(cut, usize::MAX)).rev().find(|(_, s)| ok(*s));
        if let Some(&(top, _)) = rising {
            let lowest = set
                .range((top, 0)..=(top, usize::MAX))
                .copied()
                .find(|(_, s)| ok(*s));
            lowest.into_iter().for_each(&mut consider);
        }
        let past = set
            .range((cut.saturating_add(1), 0)..)
            .copied()
            .find(|(_, s)| ok(*s));
        past.into_iter().for_each(&mut consider);
    }

    /// The load moved from `from` to `to` past which the gain rises no more (see
    /// [`Self::best_of_pair`]), 0 if it never rises.
    fn peak(&self, from: usize, to: usize, tolerance: f64) -> f64 {
        let (a, b) = (self.node_load[from] as f64, self.node_load[to] as f64);
        let (high_from, low_from) = self.band(from, tolerance);
        let (high_to, low_to) = self.band(to, tolerance);
        // The gain's slope just past moving `x`: +1 while `from` is still above its
        // band and while `to` is still below its own, −1 once `from` is below its
        // band and once `to` is above its own.
        let slope = |x: f64| {
            i32::from(x < a - high_from) - i32::from(low_from.is_some_and(|l| x >= a - l))
                + i32::from(low_to.is_some_and(|l| x < l - b))
                - i32::from(x >= high_to - b)
        };
        let mut kinks = [
            Some(0.0),
            Some(a - high_from),
            low_from.map(|l| a - l),
            low_to.map(|l| l - b),
            Some(high_to - b),
        ];
        kinks.sort_by(|x, y| {
            x.unwrap_or(f64::INFINITY)
                .total_cmp(&y.unwrap_or(f64::INFINITY))
        });
        kinks
            .into_iter()
            .flatten()
            .filter(|x| *x >= 0.0)
            .find(|x| slope(*x) <= 0)
            .unwrap_or(0.0)
    }

    /// The edges of node `n`'s band as loads (high, low): where its
    /// [`excess`](Self::excess) starts; a pinned node has no low edge.
    fn band(&self, n: usize, tolerance: f64) -> (f64, Option<f64>) {
        match self.pinned[n] {
            Some(pin) => (pinned_high(tolerance) * pin as f64, None),
            None => (
                (1.0 + tolerance) * self.share[n],
                Some((1.0 - tolerance) * self.share[n]),
            ),
        }
    }

    /// Up to `k` of the shards with load that `n` leads, the heaviest first (equal
    /// loads: the lowest-numbered first).
    fn heaviest_led(&self, n: usize, k: usize) -> Vec<usize> {
        // Only rebalancing asks, after `build_index`.
        let Some(index) = &self.index else {
            return Vec::new();
        };
        // Load by load from the top, the lowest-numbered k of each load over all of
        // n's sets (a shard stands in one set per other replica).
        let mut top: Vec<usize> = Vec::with_capacity(k);
        let mut below = u64::MAX;
        while top.len() < k {
            let next = index.out[n]
                .values()
                .filter_map(|set| set.range(..=(below, usize::MAX)).next_back())
                .map(|(l, _)| *l)
                .max();
            let Some(l) = next else { break };
            let mut same: Vec<usize> = index.out[n]
                .values()
                .flat_map(|set| set.range((l, 0)..=(l, usize::MAX)).take(k).map(|(_, s)| *s))
                .collect();
            same.sort_unstable();
            same.dedup();
            top.extend(same.into_iter().take(k - top.len()));
            if l == 0 {
                break;
            }
            below = l - 1;
        }
        top
    }

    /// [`Self::best_move_from`] by scoring every shard `n` leads.
    fn scan_move_from(
        &self,
        n: usize,
        tolerance: f64,
        except: Option<usize>,
    ) -> Option<(f64, usize, usize)> {
        let mut best: Option<(f64, u64, usize, usize)> = None;
        for &s in &self.led[n] {
            let l = self.loads[s];
            if l == 0 || Some(s) == except {
                continue;
            }
            for &m in self.plan.replicas(s) {
                let m = m as usize;
                if m == n || self.cap[m] == 0 || self.left[s].contains(&(m as u32)) {
                    continue;
                }
                let g = self.gain(n, m, l, tolerance);
                if Self::beats(best, g, l, s, m) {
                    best = Some((g, l, s, m));
                }
            }
        }
        best.map(|(g, _, s, m)| (g, s, m))
    }

    /// The sum of every active node's [`excess`](Self::excess).
    fn total_excess(&self, tolerance: f64) -> f64 {
        (0..self.cap.len())
            .filter(|n| self.cap[*n] > 0)
            .map(|n| self.excess(n, self.node_load[n], tolerance))
            .sum()
    }

    /// The best chain of two moves off node `n`: one of its eight heaviest shards to
    /// a replica `m`, then `m`'s best move of another shard; (total gain, shard, `m`,
    /// second shard, its new node).
    fn best_chain_from(
        &mut self,
        n: usize,
        tolerance: f64,
    ) -> Option<(f64, usize, usize, usize, usize)> {
        let top = self.heaviest_led(n, 8);
        let before = self.total_excess(tolerance);
        let mut best: Option<(f64, usize, usize, usize, usize)> = None;
        for s in top {
            let replicas: Vec<usize> = self.plan.replicas(s).iter().map(|m| *m as usize).collect();
            for m in replicas {
                if m == n || self.cap[m] == 0 || self.left[s].contains(&(m as u32)) {
                    continue;
                }
                self.take(s, n);
                self.put(s, m as u32);
                if let Some((_, s2, k)) = self.best_move_from(m, tolerance, Some(s)) {
                    self.take(s2, m);
                    self.put(s2, k as u32);
                    let g = before - self.total_excess(tolerance);
                    self.take(s2, k);
                    self.put(s2, m as u32);
                    if g > 1e-9 && best.is_none_or(|(bg, ..)| g > bg + 1e-9) {
                        best = Some((g, s, m, s2, k));
                    }
                }
                self.take(s, m);
                self.put(s, n as u32);
            }
        }
        best
    }

    /// The move onto node `n` (of the shards it replicates) that takes the most load
    /// out of the band: (shard, old leader), or `None` if none helps.
    fn best_move_to(&self, n: usize, tolerance: f64) -> Option<(usize, usize)> {
        let index = match &self.index {
            Some(index) if self.search == Search::Index => index,
            _ => return self.scan_move_to(n, tolerance),
        };
        let mut best: Option<(f64, u64, usize, usize)> = None;
        let ok = |s: usize| !self.left[s].contains(&(n as u32));
        for &h in &index.into[n] {
            if let Some(set) = index.out[h as usize].get(&(n as u32)) {
                let h = h as usize;
                self.best_of_pair(set, (h, n), h, tolerance, ok, &mut best);
            }
        }
        best.map(|(_, _, s, h)| (s, h))
    }

    /// [`Self::best_move_to`] by scoring every shard `n` replicates.
    fn scan_move_to(&self, n: usize, tolerance: f64) -> Option<(usize, usize)> {
        let mut best: Option<(f64, u64, usize, usize)> = None;
        for s in (0..self.plan.shards()).filter(|s| self.plan.replicas(*s).contains(&(n as u32))) {
            let (l, h) = (self.loads[s], self.leader[s]);
            if l == 0 || h == u32::MAX || h as usize == n || self.left[s].contains(&(n as u32)) {
                continue;
            }
            let h = h as usize;
            let g = self.gain(h, n, l, tolerance);
            if Self::beats(best, g, l, s, h) {
                best = Some((g, l, s, h));
            }
        }
        best.map(|(_, _, s, h)| (s, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn codes_follow_the_figure_within_four_percent_and_keep_the_order() {
        assert_eq!(quantize(0.0), 0);
        assert_eq!(quantize(-3.0), 0);
        assert_eq!(quantize(f64::NAN), 0);
        assert_eq!(quantize(0.001), 0);
        assert_eq!(level(0), 0);
        let mut last = 0;
        let mut x = 0.01;
        while x < 2e6 {
            let c = quantize(x);
            assert!(c >= last, "{x}: code {c} after {last}");
            last = c;
            let back = level(c) as f64 / 1000.0;
            assert!((back / x - 1.0).abs() <= 0.045, "{x} -> {c} -> {back}");
            x *= 1.013;
        }
        assert_eq!(quantize(1e12), 255);
    }

    #[test]
    fn a_report_within_the_deadband_is_not_published() {
        let published = quantize(100.0);
        for jitter in [0.8, 0.9, 1.0, 1.1, 1.2] {
            assert_eq!(republish(published, 100.0 * jitter, DEADBAND), None);
        }
        assert_eq!(
            republish(published, 1000.0, DEADBAND),
            Some(quantize(1000.0))
        );
        assert_eq!(republish(published, 10.0, DEADBAND), Some(quantize(10.0)));
        assert_eq!(republish(published, 0.0, DEADBAND), Some(0));
        assert_eq!(republish(0, 0.0, DEADBAND), None);
        assert_eq!(republish(0, 5.0, DEADBAND), Some(quantize(5.0)));
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
