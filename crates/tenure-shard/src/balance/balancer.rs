//! The search behind `rebalance` and `plan_by_load`: each node's load and share,
//! the pins of nodes whose largest shard exceeds their share, and the index of the
//! shards by (leader, replica) that finds the best move between two nodes in two
//! lookups.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use crate::assign::{NodeSpec, Plan};

/// How [`Balancer`] finds a node's best move.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Search {
    /// Two shards per pair of nodes, either side of the gain's peak ([`Index`]).
    Index,
    /// Every shard the node leads or replicates: the reference the index is checked
    /// against.
    #[cfg(any(test, feature = "testing"))]
    Scan,
}

/// The part of the tolerance the balancer keeps nodes within.
pub(super) const AIM: f64 = 0.9;

/// How far above its big shard a pinned node may carry, as a ratio: a tenth of the
/// tolerance (1% by default). A pinned node's load sets max/mean, which is meant to end
/// within 2% of the lower bound; figures are quantized to within 4% each, so aiming at
/// 2% on the codes could end above it on the figures.
pub(super) fn pinned_high(tolerance: f64) -> f64 {
    1.0 + tolerance / 10.0
}

pub(super) struct Balancer<'a> {
    pub(super) plan: &'a Plan,
    pub(super) cap: Vec<u64>,
    pub(super) total: u128,
    total_cap: u128,
    /// The load of the shard a node is pinned to ([`Self::pin`]).
    pub(super) pinned: Vec<Option<u64>>,
    /// The sum of all loads (`total` leaves the pinned shards out).
    all_load: u128,
    /// (shard, node) for every shard that left a node in this rebalance: it never
    /// goes back there, so no sequence of moves can cycle (pins move as leaders do,
    /// so the excess alone does not rule that out: relocating a pinned shard and
    /// taking by load once passed one shard back and forth until a guard stopped it,
    /// 864 moves for 4 net).
    pub(super) left: Vec<Vec<u32>>,
    /// Each node's share of `total` (by capacity), as of the last [`Self::pin`].
    share: Vec<f64>,
    pub(super) node_load: Vec<u64>,
    pub(super) leader: Vec<u32>,
    /// Shards led by each node (unordered; a moved shard is swapped out), and each
    /// shard's place in its leader's list (a move costs O(1), not O(P/N)).
    led: Vec<Vec<usize>>,
    pos: Vec<usize>,
    pub(super) loads: Vec<u64>,
    /// How many shards with load each node leads.
    loaded: Vec<usize>,
    /// The shards with load by leader and replica, once [`Self::build_index`] ran
    /// (kept up to date by every move from then on).
    index: Option<Index>,
    pub(super) search: Search,
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
    pub(super) fn new(plan: &'a Plan, nodes: &[NodeSpec], loads: &[u64]) -> Self {
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
    pub(super) fn build_index(&mut self) {
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

    pub(super) fn put(&mut self, s: usize, n: u32) {
        self.leader[s] = n;
        self.node_load[n as usize] += self.loads[s];
        self.pos[s] = self.led[n as usize].len();
        self.led[n as usize].push(s);
        if self.loads[s] > 0 {
            self.loaded[n as usize] += 1;
            self.file(s, n, true);
        }
    }

    pub(super) fn take(&mut self, s: usize, n: usize) {
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
    pub(super) fn ratio(&self, n: usize) -> f64 {
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
    pub(super) fn pin(&mut self, heaviest: &[usize]) {
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
    pub(super) fn better_home_for_pinned(&self, n: usize) -> Option<(usize, usize)> {
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
    pub(super) fn compare(&self, a: usize, b: usize) -> Ordering {
        let (la, lb) = (u128::from(self.node_load[a]), u128::from(self.node_load[b]));
        (la * u128::from(self.cap[b])).cmp(&(lb * u128::from(self.cap[a])))
    }

    /// Which of `a` and `b` would have the lower load per capacity after taking
    /// `extra`; on a tie, the fewer leaders per capacity; then `a`, the better-ranked.
    /// A shard without a figure (`extra` 0: not reported yet, as at a cold start)
    /// changes no node's load, so it goes by leaders per capacity alone: by load, every
    /// such shard went to the least loaded of its replicas, and at 10^6 shards one node
    /// led 156,602 shards where another led 36,158.
    pub(super) fn compare_after(&self, a: u32, b: u32, extra: u64) -> Ordering {
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
    pub(super) fn excess(&self, n: usize, load: u64, tolerance: f64) -> f64 {
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
    pub(super) fn best_move_from(
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
    pub(super) fn best_chain_from(
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
    pub(super) fn best_move_to(&self, n: usize, tolerance: f64) -> Option<(usize, usize)> {
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
