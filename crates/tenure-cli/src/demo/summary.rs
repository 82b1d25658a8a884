//! What the demo reports: the spread of handover figures, each step's summary, the
//! load per node with its bars, and the whole run's summary with its table.

use super::*;

/// Graceful handoffs per second and burst, per node, for a demo of `shards` over
/// `nodes`: 200/s in bursts of 20, so a small demo can be followed by eye, and more
/// where that would make the drain of a node's share of the shards take longer than
/// about two seconds (at 10^6 shards over 10 nodes, 200/s would take 500 s).
pub fn handoff_rate(shards: usize, nodes: usize) -> (f64, u32) {
    let share = shards / nodes.max(1);
    let per_second = (share as f64 / 2.0).max(200.0);
    (per_second, (per_second / 10.0).ceil() as u32)
}

/// Min/median/max of some durations, in milliseconds (`null` without samples).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spread {
    /// Samples.
    pub count: usize,
    /// Smallest.
    pub min_ms: Option<f64>,
    /// Median.
    pub median_ms: Option<f64>,
    /// Largest.
    pub max_ms: Option<f64>,
}

pub(super) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Spread {
    pub(super) fn of(samples: &[Duration]) -> Spread {
        let f = Figure {
            name: String::new(),
            note: String::new(),
            samples: samples.to_vec(),
        };
        Spread {
            count: samples.len(),
            min_ms: f.min().map(ms),
            median_ms: f.median().map(ms),
            max_ms: f.max().map(ms),
        }
    }

    pub(super) fn show(&self) -> String {
        match (self.min_ms, self.median_ms, self.max_ms) {
            (Some(a), Some(b), Some(c)) => {
                format!("{} / {} / {}", show_ms(a), show_ms(b), show_ms(c))
            }
            _ => "–".to_string(),
        }
    }
}

pub(super) fn show_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else if v < 1000.0 {
        format!("{v:.0} ms")
    } else {
        format!("{:.2} s", v / 1e3)
    }
}

/// One crash of the script.
#[derive(Debug, Clone, Serialize)]
pub struct CrashSummary {
    /// The crashed node.
    pub node: String,
    /// Shards it led when it crashed.
    pub shards: usize,
    /// From the crash to the last of those shards acquired by another node.
    pub failover_ms: f64,
}

/// The join of the script.
#[derive(Debug, Clone, Serialize)]
pub struct JoinSummary {
    /// The new node.
    pub node: String,
    /// Shards that changed leader until the cluster settled again.
    pub moves: usize,
    /// The fewest moves possible: the newcomer's share.
    pub optimum: usize,
    /// Handoff gaps (HandedOff → Acquired) of the moves.
    pub gaps: Spread,
    /// From the start of the new node to settled.
    pub settle_ms: f64,
}

/// The drain of the script.
#[derive(Debug, Clone, Serialize)]
pub struct DrainSummary {
    /// The drained node.
    pub node: String,
    /// Shards it handed off.
    pub handoffs: usize,
    /// Handoff gaps (HandedOff → Acquired).
    pub gaps: Spread,
    /// From the drain call to its return (the node leads nothing).
    pub drain_ms: f64,
}

/// The state at the end, read from the store.
#[derive(Debug, Clone, Serialize)]
pub struct EndSummary {
    /// Shards with a leader.
    pub led: usize,
    /// Shards without one.
    pub leaderless: usize,
    /// Leaders per live node.
    pub per_node: BTreeMap<String, usize>,
    /// The most leaderships of a node.
    pub max_leaders: usize,
    /// The mean over live nodes.
    pub mean_leaders: f64,
    /// max / mean.
    pub imbalance: f64,
    /// Leaders per zone (empty without zones).
    pub per_zone: BTreeMap<String, usize>,
    /// Load per live node, the sum of the figures of the shards it leads (with
    /// `--load`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub load_per_node: BTreeMap<String, f64>,
    /// The most load of a live node over the mean (with `--load`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_imbalance: Option<f64>,
    /// The least max / mean any placement reaches over these nodes (with `--load`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_lower_bound: Option<f64>,
}

/// One node's shards and load under the count plan and after balancing by load.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeLoad {
    /// Shards it led after the cold start (the count plan; no figure published yet).
    pub shards_by_count: usize,
    /// Their load (the sum of their figures).
    pub by_count: f64,
    /// Shards it led once balancing by load was done.
    pub shards_by_load: usize,
    /// Their load.
    pub by_load: f64,
}

/// Balancing by load (`--load`): the load per node under the count plan (the leaders
/// of the cold start, before any figure was published) and after balancing by load.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadSummary {
    /// The figures: their distribution and its exponent.
    pub figures: String,
    /// The largest figure of a shard.
    pub largest: f64,
    /// The sum of every shard's figure.
    pub total: f64,
    /// Per node.
    pub per_node: BTreeMap<String, NodeLoad>,
    /// The most load of a node over the mean, by count.
    pub max_over_mean_by_count: f64,
    /// The same after balancing by load.
    pub max_over_mean_by_load: f64,
    /// max(1, largest figure / mean node load): no placement does better.
    pub lower_bound: f64,
    /// Shards that changed leader while balancing.
    pub moves: usize,
    /// From the first reports to the last of those moves.
    pub balance_ms: f64,
}

impl LoadSummary {
    /// One line per node: its load by count and by load as bars, scaled alike.
    pub fn bars(&self) -> Vec<String> {
        let top = self
            .per_node
            .values()
            .map(|n| n.by_count.max(n.by_load))
            .fold(0.0, f64::max);
        let width = self.per_node.keys().map(|k| k.len()).max().unwrap_or(0);
        let figure = |load: f64, shards: usize| {
            let plural = if shards == 1 { "" } else { "s" };
            format!("{} ({shards} shard{plural})", thousands(load))
        };
        let digits = self
            .per_node
            .values()
            .map(|n| figure(n.by_count, n.shards_by_count).chars().count())
            .max()
            .unwrap_or(0);
        self.per_node
            .iter()
            .map(|(id, n)| {
                format!(
                    "{id:<width$}  by count {} {:>digits$}   by load {} {}",
                    bar(n.by_count, top),
                    figure(n.by_count, n.shards_by_count),
                    bar(n.by_load, top),
                    figure(n.by_load, n.shards_by_load),
                )
            })
            .collect()
    }
}

/// A bar of `BAR` characters at most for `value` out of `top`, padded to `BAR`.
pub(super) fn bar(value: f64, top: f64) -> String {
    let n = if top > 0.0 && value > 0.0 {
        ((value / top * BAR as f64).round() as usize).clamp(1, BAR)
    } else {
        0
    };
    format!("{}{}", "█".repeat(n), " ".repeat(BAR - n))
}

/// `value` rounded, with thousands separated by commas (2,140).
pub(crate) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The largest of `values` over their mean (0 without values or when they sum to 0).
pub(super) fn max_over_mean(values: impl Iterator<Item = f64>) -> f64 {
    let (mut n, mut total, mut max) = (0usize, 0.0f64, 0.0f64);
    for v in values {
        n += 1;
        total += v;
        max = max.max(v);
    }
    if total > 0.0 {
        max * n as f64 / total
    } else {
        0.0
    }
}

/// max(1, largest figure / mean load of `nodes` equal nodes): the node that leads the
/// hottest shard carries at least that figure, so no placement has a lower max / mean.
pub(super) fn lower_bound(figures: &[f64], nodes: usize) -> f64 {
    let total: f64 = figures.iter().sum();
    let largest = figures.iter().copied().fold(0.0, f64::max);
    if total > 0.0 && nodes > 0 {
        (largest * nodes as f64 / total).max(1.0)
    } else {
        1.0
    }
}

/// What the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoSummary {
    /// Backend URL.
    pub backend: String,
    /// Namespace.
    pub namespace: String,
    /// Nodes at the start.
    pub nodes: usize,
    /// Shards.
    pub shards: usize,
    /// Replication factor.
    pub replication: usize,
    /// Session TTL.
    pub ttl_ms: f64,
    /// Renew interval.
    pub renew_interval_ms: f64,
    /// From starting the nodes to every shard led by its preferred node.
    pub converge_ms: f64,
    /// The crashes.
    pub crashes: Vec<CrashSummary>,
    /// The join.
    pub join: JoinSummary,
    /// The drain.
    pub drain: DrainSummary,
    /// Every HandedOff → Acquired gap of the run.
    pub handoff_gaps: Spread,
    /// Balancing by load (with `--load`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadSummary>,
    /// The end state.
    pub end: EndSummary,
    /// Wall time of the whole run (pauses included).
    pub wall_ms: f64,
}

impl DemoSummary {
    /// The summary as a Markdown table.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![
            (
                "setup".into(),
                format!(
                    "{} nodes, {} shards, replication {}, {}",
                    self.nodes, self.shards, self.replication, self.backend
                ),
            ),
            (
                "session timing".into(),
                format!(
                    "TTL {}, renew every {}",
                    show_ms(self.ttl_ms),
                    show_ms(self.renew_interval_ms)
                ),
            ),
            (
                "time to converge".into(),
                show_ms(self.converge_ms).to_string(),
            ),
        ];
        if let Some(l) = &self.load {
            rows.push((
                "load per node, max / mean: by count → by load".into(),
                format!(
                    "{:.3} → {:.3} (lower bound {:.3}); {}, total {}",
                    l.max_over_mean_by_count,
                    l.max_over_mean_by_load,
                    l.lower_bound,
                    l.figures,
                    thousands(l.total)
                ),
            ));
            rows.push((
                "balance by load".into(),
                format!("{} moves in {}", l.moves, show_ms(l.balance_ms)),
            ));
        }
        for c in &self.crashes {
            rows.push((
                format!("failover after crash of {}", c.node),
                format!(
                    "{} (its {} shards led again)",
                    show_ms(c.failover_ms),
                    c.shards
                ),
            ));
        }
        rows.push((
            format!("moves on join of {} vs optimum", self.join.node),
            format!(
                "{} moves, optimum {} (settled in {}){}",
                self.join.moves,
                self.join.optimum,
                show_ms(self.join.settle_ms),
                if self.load.is_some() {
                    "; the balancer's moves by load included"
                } else {
                    ""
                }
            ),
        ));
        rows.push((
            "handoff gaps on join, min / median / max".into(),
            self.join.gaps.show(),
        ));
        rows.push((
            format!("drain of {}", self.drain.node),
            format!(
                "{} handoffs in {}",
                self.drain.handoffs,
                show_ms(self.drain.drain_ms)
            ),
        ));
        rows.push((
            "handoff gaps on drain, min / median / max".into(),
            self.drain.gaps.show(),
        ));
        rows.push((
            "leaders per node at the end, max / mean".into(),
            format!(
                "{} / {:.1} (imbalance {:.3}); {} of {} shards led",
                self.end.max_leaders,
                self.end.mean_leaders,
                self.end.imbalance,
                self.end.led,
                self.shards
            ),
        ));
        if !self.end.per_zone.is_empty() {
            let zones: Vec<String> = self
                .end
                .per_zone
                .iter()
                .map(|(z, n)| format!("{z} {n}"))
                .collect();
            rows.push(("leaders per zone at the end".into(), zones.join(", ")));
        }
        if let (Some(imbalance), Some(bound)) = (self.end.load_imbalance, self.end.load_lower_bound)
        {
            rows.push((
                "load per node at the end, max / mean".into(),
                format!("{imbalance:.3} (lower bound {bound:.3})"),
            ));
        }
        rows.push(("wall time".into(), show_ms(self.wall_ms)));
        let mut s = String::from("| figure | value |\n|---|---|\n");
        for (k, v) in rows {
            let _ = writeln!(s, "| {k} | {v} |");
        }
        if let Some(l) = &self.load {
            let _ = writeln!(
                s,
                "\nload per node after the cold start (by count) and once balanced by load:"
            );
            for line in l.bars() {
                let _ = writeln!(s, "  {line}");
            }
        }
        s
    }
}
