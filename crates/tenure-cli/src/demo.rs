//! `tenure demo`: N shard managers in one process, a script (converge, crash a node,
//! add a node, drain a node), a live view and a summary.
//!
//! With `--load zipf` every node balances by load and reports, for each shard it
//! leads, that shard's Zipf figure ([`balance::zipf`]). Reports start only once the
//! cold start has converged, so the leaders then are the count plan's: their load per
//! node is the baseline, shown as bars beside the load per node once the balancer is
//! done (a step of its own before the crash); each later step also waits for it.
//!
//! Every node is a [`ShardManager`] with its own session on one backend handle. Times
//! are taken when this process receives a manager's event, so they include the event
//! delivery (microseconds) and nothing else.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tenure::shard::balance::{self, LoadPolicy};
use tenure::shard::{
    Layout, LoadReporter, ShardEvent, ShardEvents, ShardManager, ShardStatus, ShardView,
};
use tenure::{DynBackend, Error, ErrorKind, Result, Timing};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::args::DemoLoad;
use crate::bench::Figure;

/// The exponent of the figures of `--load zipf`.
pub const ZIPF_EXPONENT: f64 = 1.1;

/// How often a leader reports the figures of its shards under `--load`.
const REPORT_EVERY: Duration = Duration::from_millis(500);

/// Under `--load`, a step is over once every figure is published and no shard has
/// changed hands for this long: the balancer acts once the figures have held still
/// for a load interval (1 s) and nodes publish up to an interval apart, so three
/// intervals leave it time to have acted.
const LOAD_QUIET: Duration = Duration::from_secs(3);

/// Width of the bars of the load per node, in characters.
const BAR: usize = 24;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Backend URL, shown in the output.
    pub backend_url: String,
    /// Membership namespace (also the shards' election prefix).
    pub namespace: String,
    /// Nodes at the start.
    pub nodes: usize,
    /// Shards.
    pub shards: usize,
    /// Replication factor.
    pub replication: usize,
    /// Session timing of every node.
    pub timing: Timing,
    /// Graceful handoffs per second and burst, per node.
    pub handoff_rate: (f64, u32),
    /// Pause between the script's steps (so a viewer can follow; 0 in tests).
    pub pause: Duration,
    /// Failure domains: with N > 0, the nodes are dealt round-robin into zones
    /// `zone-1` … `zone-N` and every shard's replicas span them.
    pub zones: usize,
    /// How long a step may go without progress (no node taking, giving up or asking
    /// for a shard) before the demo gives up on it.
    pub step_limit: Duration,
    /// The load figures the nodes report (none: they balance by count).
    pub load: DemoLoad,
}

impl DemoOptions {
    /// The defaults of `tenure demo`: 5 nodes, 256 shards, replication 3, TTL 2 s.
    pub fn new(backend_url: &str) -> DemoOptions {
        DemoOptions {
            backend_url: backend_url.to_string(),
            namespace: format!("demo-{}", std::process::id()),
            nodes: 5,
            shards: 256,
            replication: 3,
            timing: Timing::from_ttl(Duration::from_secs(2)),
            handoff_rate: (200.0, 20),
            pause: Duration::from_secs(1),
            step_limit: Duration::from_secs(30),
            zones: 0,
            load: DemoLoad::None,
        }
    }
}

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

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Spread {
    fn of(samples: &[Duration]) -> Spread {
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

    fn show(&self) -> String {
        match (self.min_ms, self.median_ms, self.max_ms) {
            (Some(a), Some(b), Some(c)) => {
                format!("{} / {} / {}", show_ms(a), show_ms(b), show_ms(c))
            }
            _ => "–".to_string(),
        }
    }
}

fn show_ms(v: f64) -> String {
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
fn bar(value: f64, top: f64) -> String {
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
fn max_over_mean(values: impl Iterator<Item = f64>) -> f64 {
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
fn lower_bound(figures: &[f64], nodes: usize) -> f64 {
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

/// The script's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Balance,
    Crash,
    Join,
    Drain,
    Done,
}

impl Phase {
    /// The step as the live view shows it; `load`: with the step that balances by load.
    fn label(self, load: bool) -> &'static str {
        match (self, load) {
            (Phase::Start, false) => "1/4 start and converge",
            (Phase::Crash, false) => "2/4 crash a node",
            (Phase::Join, false) => "3/4 add a node",
            (Phase::Drain, false) => "4/4 drain a node",
            (Phase::Start, true) => "1/5 start and converge",
            (Phase::Balance, _) => "2/5 balance by load",
            (Phase::Crash, true) => "3/5 crash a node",
            (Phase::Join, true) => "4/5 add a node",
            (Phase::Drain, true) => "5/5 drain a node",
            (Phase::Done, _) => "done",
        }
    }
}

/// A shard changing hands, for the live view.
#[derive(Debug, Clone)]
struct Handover {
    shard: String,
    from: Arc<str>,
    to: Arc<str>,
    gap: Duration,
    why: &'static str,
}

/// Why and when a shard was let go, by whom.
#[derive(Debug, Clone)]
struct Released {
    at: Instant,
    from: Arc<str>,
    why: &'static str,
}

/// What the event readers record.
struct Record {
    phase: Phase,
    leaders: Vec<Option<Arc<str>>>,
    /// Shards led per node as its own events read so far say (acquired minus given
    /// up: one node's events arrive in order, while events of different nodes can be
    /// read in any order), so comparing it with each manager's status tells whether
    /// every event was read.
    led: HashMap<Arc<str>, usize>,
    acquired_at: Vec<Option<Instant>>,
    released: HashMap<usize, Released>,
    recent: VecDeque<Handover>,
    /// (phase, shard, at, node) of every acquisition.
    acquisitions: Vec<(Phase, usize, Instant, Arc<str>)>,
    /// (phase, why, gap, from) of every shard that changed hands after a release by
    /// node `from`.
    gaps: Vec<(Phase, &'static str, Duration, Arc<str>)>,
    crashed: Vec<String>,
    note: String,
}

type Shared = Arc<Mutex<Record>>;

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Record> {
    match r.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Record {
    fn new(shards: usize) -> Record {
        Record {
            phase: Phase::Start,
            leaders: vec![None; shards],
            led: HashMap::new(),
            acquired_at: vec![None; shards],
            released: HashMap::new(),
            recent: VecDeque::new(),
            acquisitions: Vec::new(),
            gaps: Vec::new(),
            crashed: Vec::new(),
            note: String::new(),
        }
    }

    fn push_recent(&mut self, h: Handover) {
        if self.recent.len() == 6 {
            self.recent.pop_front();
        }
        self.recent.push_back(h);
    }

    fn on_event(&mut self, node: &Arc<str>, at: Instant, event: ShardEvent) {
        let count = self.led.entry(node.clone()).or_default();
        match &event {
            ShardEvent::Acquired { .. } => *count += 1,
            ShardEvent::Lost { .. } | ShardEvent::HandedOff { .. } => {
                *count = count.saturating_sub(1)
            }
        }
        match event {
            ShardEvent::Acquired { shard, .. } => {
                let i = shard.index();
                self.acquisitions.push((self.phase, i, at, node.clone()));
                if let Some(r) = self.released.remove(&i) {
                    let gap = at.saturating_duration_since(r.at);
                    self.gaps.push((self.phase, r.why, gap, r.from.clone()));
                    self.push_recent(Handover {
                        shard: shard.name().to_string(),
                        from: r.from,
                        to: node.clone(),
                        gap,
                        why: r.why,
                    });
                }
                self.leaders[i] = Some(node.clone());
                self.acquired_at[i] = Some(at);
            }
            ShardEvent::HandedOff { shard, .. } => {
                self.on_release(node, at, shard.index(), "handoff")
            }
            ShardEvent::Lost { shard, .. } => self.on_release(node, at, shard.index(), "lost"),
        }
    }

    fn on_release(&mut self, node: &Arc<str>, at: Instant, i: usize, why: &'static str) {
        match &self.leaders[i] {
            Some(l) if l == node => {
                self.leaders[i] = None;
                self.released.insert(
                    i,
                    Released {
                        at,
                        from: node.clone(),
                        why,
                    },
                );
            }
            // Another node's grant was seen first (events of different nodes race on
            // the way here): the gap was at most the delivery skew.
            Some(_) => {
                let acquired = self.acquired_at[i].unwrap_or(at);
                let gap = acquired.saturating_duration_since(at);
                self.gaps.push((self.phase, why, gap, node.clone()));
            }
            None => {}
        }
    }

    fn crash(&mut self, node: &str, at: Instant) -> usize {
        self.crashed.push(node.to_string());
        let node: Arc<str> = node.into();
        self.led.remove(&node);
        let mut n = 0;
        for i in 0..self.leaders.len() {
            if self.leaders[i].as_ref() == Some(&node) {
                n += 1;
                self.on_release(&node, at, i, "crash");
            }
        }
        n
    }

    /// Shards led by `node` as the events read so far say.
    fn led_by(&self, node: &str) -> usize {
        self.led.get(node).copied().unwrap_or(0)
    }

    /// Whether every node (id, status) sees all of them, has nothing pending, has every
    /// shard with its preferred node, and this record has read all of its events.
    fn all_read_and_settled(&self, nodes: &[(&str, ShardStatus)]) -> bool {
        nodes
            .iter()
            .all(|(id, s)| s.is_quiet(nodes.len()) && self.led_by(id) == s.held)
    }
}

/// Where the demo's progress goes.
pub enum Display {
    /// Redraw a live view with ANSI escapes (a terminal).
    Live(Box<dyn Write + Send>),
    /// One plain line per step.
    Lines(Box<dyn Write + Send>),
}

struct View {
    display: Mutex<Display>,
    drawn: Mutex<usize>,
}

impl View {
    fn line(&self, text: &str) {
        let mut d = match self.display.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Display::Lines(w) = &mut *d {
            let _ = writeln!(w, "{text}");
            let _ = w.flush();
        }
    }

    fn is_live(&self) -> bool {
        matches!(
            *match self.display.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            },
            Display::Live(_)
        )
    }

    fn draw(&self, frame: &str) {
        let mut d = match self.display.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut drawn = match self.drawn.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Display::Live(w) = &mut *d {
            let mut out = String::new();
            if *drawn > 0 {
                // Back to the first line of the last frame, clear to the end.
                let _ = write!(out, "\x1b[{}F\x1b[J", *drawn);
            }
            out.push_str(frame);
            let _ = w.write_all(out.as_bytes());
            let _ = w.flush();
            *drawn = frame.lines().count();
        }
    }
}

struct Node {
    id: String,
    manager: Arc<ShardManager>,
}

/// The nodes of the demo and what they did.
struct Demo {
    backend: DynBackend,
    layout: Layout,
    options: DemoOptions,
    nodes: Vec<Node>,
    /// Nodes started so far (they are dealt into zones in this order).
    added: usize,
    record: Shared,
    started: Instant,
    /// Each shard's load figure (with `--load`).
    figures: Option<Arc<[f64]>>,
    /// Whether the nodes report their figures yet (not during the cold start, so that
    /// it shows the count plan's leaders).
    reporting: Arc<AtomicBool>,
}

/// What a node reports under `--load`: each shard's figure, once `on`.
struct Reports {
    figures: Arc<[f64]>,
    reporter: LoadReporter,
    on: Arc<AtomicBool>,
    layout: Layout,
}

impl Reports {
    /// Report the figure of every shard in `led` whose leadership lasts, if reporting
    /// is on. False once the manager has stopped.
    fn report(&self, led: &HashMap<usize, CancellationToken>) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return true;
        }
        for (&i, lost) in led {
            if lost.is_cancelled() {
                continue;
            }
            let (Some(shard), Some(figure)) = (self.layout.shards().get(i), self.figures.get(i))
            else {
                continue;
            };
            if let Err(e) = self.reporter.report(shard, *figure) {
                tracing::debug!(error = %e, "load reports stopped");
                return false;
            }
        }
        true
    }
}

/// Read one node's events into the record. Under `--load`, also report, every
/// [`REPORT_EVERY`], the figure of each shard the node leads by its events (until the
/// leadership's `lost` is cancelled), as an application's shard workers would: one
/// timer per node rather than a task per shard, so that large demos stay cheap.
async fn read_events(
    mut events: ShardEvents,
    record: Shared,
    node: Arc<str>,
    mut reports: Option<Reports>,
) {
    // Read what has queued up in one go: at 10^5–10^6 shards a step brings events in
    // bursts, and one lock per event would let the reader fall behind.
    let mut batch = Vec::with_capacity(1024);
    let mut led: HashMap<usize, CancellationToken> = HashMap::new();
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            n = events.recv_many(&mut batch, 1024) => {
                if n == 0 {
                    return;
                }
                let at = Instant::now();
                if reports.is_some() {
                    for event in &batch {
                        match event {
                            ShardEvent::Acquired { shard, lost, .. } => {
                                led.insert(shard.index(), lost.clone());
                            }
                            ShardEvent::Lost { shard, .. } | ShardEvent::HandedOff { shard, .. } => {
                                led.remove(&shard.index());
                            }
                        }
                    }
                }
                let mut r = lock(&record);
                for event in batch.drain(..) {
                    r.on_event(&node, at, event);
                }
            }
            _ = tick.tick(), if reports.is_some() => {
                if reports.as_ref().is_some_and(|r| !r.report(&led)) {
                    reports = None;
                }
            }
        }
    }
}

/// Shards and load per node of `nodes` (and any other leader) by the leaders of `snap`.
fn leaders_load(
    snap: &ShardView,
    nodes: &[Node],
    figures: &[f64],
) -> BTreeMap<String, (usize, f64)> {
    let mut per: BTreeMap<String, (usize, f64)> =
        nodes.iter().map(|n| (n.id.clone(), (0, 0.0))).collect();
    for s in &snap.shards {
        if let Some(l) = &s.leader {
            let e = per.entry(l.clone()).or_default();
            e.0 += 1;
            e.1 += figures.get(s.shard.index()).copied().unwrap_or(0.0);
        }
    }
    per
}

impl Demo {
    async fn add(&mut self, id: &str) -> Result<()> {
        let mut builder = ShardManager::builder(self.backend.clone())
            .layout(self.layout.clone())
            .node_id(id)
            .timing(self.options.timing.clone())
            .handoff_rate(self.options.handoff_rate.0, self.options.handoff_rate.1);
        if self.options.zones > 0 {
            builder = builder.zone(format!("zone-{}", self.added % self.options.zones + 1));
        }
        if self.figures.is_some() {
            builder = builder.balance_by_load(LoadPolicy::default());
        }
        self.added += 1;
        let (manager, events) = builder.start().await?;
        let reports = self.figures.clone().map(|figures| Reports {
            figures,
            reporter: manager.load_reporter(),
            on: self.reporting.clone(),
            layout: self.layout.clone(),
        });
        tokio::spawn(read_events(events, self.record.clone(), id.into(), reports));
        self.nodes.push(Node {
            id: id.to_string(),
            manager: Arc::new(manager),
        });
        Ok(())
    }

    fn take(&mut self, id: &str) -> Result<Node> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| Error::invalid(format!("no node {id}")))?;
        Ok(self.nodes.remove(i))
    }

    fn node(&self, id: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| Error::invalid(format!("no node {id}")))
    }

    /// Every node sees all live nodes, nothing pending, every shard led by its
    /// preferred node, and the record has read every node's events (its count of each
    /// node's shards is the node's own), so a step's events are not counted in the next.
    fn quiet(&self) -> bool {
        let statuses: Vec<(&str, ShardStatus)> = self
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.manager.status().borrow().clone()))
            .collect();
        lock(&self.record).all_read_and_settled(&statuses)
    }

    /// What each node is doing, for telling apart progress from a stall: changes
    /// whenever a node takes, gives up or asks for a shard, or sees the members change.
    fn progress(&self) -> Vec<(usize, usize, usize, usize, bool, usize)> {
        self.nodes
            .iter()
            .map(|n| {
                let s = n.manager.status().borrow().clone();
                (
                    s.held,
                    s.campaigning,
                    s.pending_handoffs,
                    s.members,
                    s.settled,
                    s.balancing,
                )
            })
            .collect()
    }

    /// Why the demo gave up waiting for `what`, in words: the nodes grouped by what
    /// their counters say (64 alike nodes make one line), and up to three shards not
    /// with their preferred node as the first such node sees them and as their
    /// preferred node does.
    fn not_settled(&self, what: &str) -> Error {
        let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for n in &self.nodes {
            let s = n.manager.status().borrow().clone();
            let held = if s.held == s.target {
                "holds its target".to_string()
            } else {
                format!("holds {} of a target of {}", s.held, s.target)
            };
            let state = format!(
                "{held}, campaigns for {}, has {} to hand off, sees {} members{}{}",
                s.campaigning,
                s.pending_handoffs,
                s.members,
                if s.settled {
                    ""
                } else {
                    ", not every shard with its preferred node"
                },
                if s.balancing > 0 {
                    format!(", balances load with {} moves still to make", s.balancing)
                } else {
                    String::new()
                }
            );
            groups.entry(state).or_default().push(&n.id);
        }
        {
            let r = lock(&self.record);
            for n in &self.nodes {
                let (read, held) = (r.led_by(&n.id), n.manager.status().borrow().held);
                if read != held {
                    groups
                        .entry(format!(
                            "holds {held} but its events read so far say {read}"
                        ))
                        .or_default()
                        .push(&n.id);
                }
            }
        }
        let mut lines: Vec<String> = groups
            .iter()
            .map(|(state, ids)| match ids.as_slice() {
                [one] => format!("{one} {state}"),
                many => format!("{} nodes ({}…) each {state}", many.len(), many[0]),
            })
            .collect();
        let unsettled = self
            .nodes
            .iter()
            .find(|n| !n.manager.status().borrow().settled);
        if let Some(n) = unsettled {
            let view = n.manager.view();
            for shard in view
                .shards
                .iter()
                .filter(|s| s.leader.is_none() || s.leader != s.preferred)
                .take(3)
            {
                let theirs = shard
                    .preferred
                    .as_deref()
                    .and_then(|p| self.nodes.iter().find(|m| m.id == p))
                    .map(|m| {
                        let v = m.manager.view();
                        let i = shard.shard.index();
                        format!(
                            "; {} sees it led by {}, preferring {}",
                            m.id,
                            v.shards[i].leader.as_deref().unwrap_or("nobody"),
                            v.shards[i].preferred.as_deref().unwrap_or("nobody")
                        )
                    })
                    .unwrap_or_default();
                lines.push(format!(
                    "shard {}: {} sees it led by {}, preferring {}{theirs}",
                    shard.shard,
                    n.id,
                    shard.leader.as_deref().unwrap_or("nobody"),
                    shard.preferred.as_deref().unwrap_or("nobody"),
                ));
            }
        }
        Error::new(
            ErrorKind::Timeout,
            format!(
                "{what}: no progress for {:?} and not settled: {}",
                self.options.step_limit,
                lines.join("; ")
            ),
        )
    }

    /// Shards and load per live node, by the leaders the store has now.
    async fn loads_now(&self, figures: &[f64]) -> Result<BTreeMap<String, (usize, f64)>> {
        let any = self
            .nodes
            .first()
            .ok_or_else(|| Error::invalid("no node left"))?;
        let snap = any.manager.snapshot().await?;
        Ok(leaders_load(&snap, &self.nodes, figures))
    }

    /// Whether every node's view has a published figure for every shard (but those
    /// too small to publish: they quantize to 0).
    fn figures_published(&self) -> bool {
        let Some(figures) = &self.figures else {
            return true;
        };
        self.nodes.iter().all(|n| {
            n.manager.view().shards.iter().all(|s| {
                s.load.is_some()
                    || figures
                        .get(s.shard.index())
                        .is_none_or(|f| balance::quantize(*f) == 0)
            })
        })
    }

    /// Shards acquired so far (changes whenever a shard changes hands).
    fn acquired(&self) -> usize {
        lock(&self.record).acquisitions.len()
    }

    fn set_phase(&self, phase: Phase, note: String) {
        let mut r = lock(&self.record);
        r.phase = phase;
        r.note = note;
    }

    fn frame(&self) -> String {
        let r = lock(&self.record);
        let total = self.layout.shards().len();
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &self.nodes {
            per_node.insert(&n.id, 0);
        }
        for c in &r.crashed {
            per_node.insert(c, 0);
        }
        for (l, c) in &r.led {
            if *c > 0 || per_node.contains_key(&**l) {
                per_node.insert(l, *c);
            }
        }
        let led: usize = r.led.values().sum();
        let max = per_node.values().copied().max().unwrap_or(0).max(1);
        // With --load: each node's load by the leaders its events name.
        let mut loads: HashMap<&str, f64> = HashMap::new();
        if let Some(figures) = &self.figures {
            for (i, l) in r.leaders.iter().enumerate() {
                if let Some(l) = l {
                    *loads.entry(&**l).or_default() += figures.get(i).copied().unwrap_or(0.0);
                }
            }
        }
        let top_load = loads.values().copied().fold(0.0, f64::max);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "tenure demo: {} shards, replication {}, {}, TTL {:?}",
            total,
            self.layout.replication(),
            self.options.backend_url,
            self.options.timing.ttl
        );
        let _ = writeln!(s);
        for (id, c) in &per_node {
            let width = c * 40 / max;
            let state = if r.crashed.iter().any(|x| x == id) {
                " crashed"
            } else if self
                .nodes
                .iter()
                .any(|n| n.id == *id && n.manager.status().borrow().draining)
            {
                " draining"
            } else {
                ""
            };
            let load = if self.figures.is_some() {
                let l = loads.get(id).copied().unwrap_or(0.0);
                format!("   load {} {:>7}", bar(l, top_load), thousands(l))
            } else {
                String::new()
            };
            let _ = writeln!(s, "  {id:<8} {:<40} {c:>4}{load}{state}", "█".repeat(width));
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "recent handovers:");
        for h in r.recent.iter().rev() {
            let _ = writeln!(
                s,
                "  shard {:<6} {:<8} → {:<8} gap {:>9}  ({})",
                h.shard,
                h.from,
                h.to,
                show_ms(ms(h.gap)),
                h.why
            );
        }
        for _ in r.recent.len()..6 {
            let _ = writeln!(s);
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "[{:>6.2} s] {}: {}  |  {led}/{total} shards led, {} handovers",
            self.started.elapsed().as_secs_f64(),
            r.phase.label(self.figures.is_some()),
            r.note,
            r.gaps.len()
        );
        s
    }

    /// Leaders per live node and leaderless shards, read from the store.
    async fn end_state(&self) -> Result<EndSummary> {
        let any = self
            .nodes
            .first()
            .ok_or_else(|| Error::invalid("no node left"))?;
        let snap: ShardView = any.manager.snapshot().await?;
        let mut per_node: BTreeMap<String, usize> =
            self.nodes.iter().map(|n| (n.id.clone(), 0)).collect();
        let mut led = 0;
        for s in &snap.shards {
            if let Some(l) = &s.leader {
                led += 1;
                *per_node.entry(l.clone()).or_default() += 1;
            }
        }
        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        for n in &snap.nodes {
            if let Some(z) = &n.zone {
                *per_zone.entry(z.clone()).or_default() +=
                    per_node.get(&n.id).copied().unwrap_or(0);
            }
        }
        let max_leaders = per_node.values().copied().max().unwrap_or(0);
        let mean_leaders = if per_node.is_empty() {
            0.0
        } else {
            led as f64 / per_node.len() as f64
        };
        let imbalance = if mean_leaders > 0.0 {
            max_leaders as f64 / mean_leaders
        } else {
            0.0
        };
        let (load_per_node, load_imbalance, load_lower_bound) = match &self.figures {
            Some(figures) => {
                let loads: BTreeMap<String, f64> = leaders_load(&snap, &self.nodes, figures)
                    .into_iter()
                    .map(|(id, (_, load))| (id, load))
                    .collect();
                let imbalance = max_over_mean(loads.values().copied());
                (
                    loads,
                    Some(imbalance),
                    Some(lower_bound(figures, self.nodes.len())),
                )
            }
            None => (BTreeMap::new(), None, None),
        };
        Ok(EndSummary {
            led,
            leaderless: snap.shards.len() - led,
            per_node,
            per_zone,
            max_leaders,
            mean_leaders,
            imbalance,
            load_per_node,
            load_imbalance,
            load_lower_bound,
        })
    }

    fn counts(&self) -> String {
        let r = lock(&self.record);
        let mut per_node: BTreeMap<&str, usize> =
            self.nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
        for (l, c) in &r.led {
            if *c > 0 {
                per_node.insert(l, *c);
            }
        }
        per_node
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Run the demo on `backend`; progress goes to `display`. Closes every node at the end.
pub async fn run_demo(
    backend: DynBackend,
    options: DemoOptions,
    display: Display,
    shutdown: CancellationToken,
) -> Result<DemoSummary> {
    if options.nodes < 2 {
        return Err(Error::invalid(format!(
            "nodes: {}; the script crashes one node and drains another, so it needs at least 2",
            options.nodes
        )));
    }
    options.timing.validate()?;
    let layout = Layout::new(&options.namespace, options.shards, options.replication)?;
    let view = Arc::new(View {
        display: Mutex::new(display),
        drawn: Mutex::new(0),
    });
    let started = Instant::now();
    let demo = Arc::new(tokio::sync::Mutex::new(Demo {
        backend,
        layout: layout.clone(),
        options: options.clone(),
        nodes: Vec::new(),
        added: 0,
        record: Arc::new(Mutex::new(Record::new(options.shards))),
        started,
        figures: match options.load {
            DemoLoad::None => None,
            DemoLoad::Zipf => Some(balance::zipf(options.shards, ZIPF_EXPONENT).into()),
        },
        reporting: Arc::new(AtomicBool::new(false)),
    }));
    let stop_drawing = CancellationToken::new();
    let drawer = if view.is_live() {
        let (demo, view, stop) = (demo.clone(), view.clone(), stop_drawing.clone());
        Some(tokio::spawn(async move {
            loop {
                // Built while the script is not between two of its own steps'
                // await points that hold the lock: the script only holds it briefly.
                let frame = demo.lock().await.frame();
                view.draw(&frame);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }))
    } else {
        None
    };
    let script = script(demo.clone(), view.clone(), started);
    let result = tokio::select! {
        r = script => r,
        _ = shutdown.cancelled() => Err(Error::new(ErrorKind::Unavailable, "interrupted")),
    };
    stop_drawing.cancel();
    if let Some(d) = drawer {
        let _ = d.await;
    }
    {
        let d = demo.lock().await;
        view.draw(&d.frame());
        for n in &d.nodes {
            if let Err(e) = n.manager.close().await {
                tracing::warn!(node = %n.id, error = %e, "closing a node failed");
            }
        }
    }
    result
}

async fn pause(options: &DemoOptions) {
    if !options.pause.is_zero() {
        tokio::time::sleep(options.pause).await;
    }
}

async fn script(
    demo: Arc<tokio::sync::Mutex<Demo>>,
    view: Arc<View>,
    started: Instant,
) -> Result<DemoSummary> {
    let options = demo.lock().await.options.clone();
    let ids: Vec<String> = (1..=options.nodes).map(|i| format!("node-{i}")).collect();
    let say = |s: String| view.line(&format!("[{:>6.2} s] {s}", started.elapsed().as_secs_f64()));
    say(format!(
        "starting {} nodes: {} shards, replication {}, on {}, TTL {:?} (renew every {:?})",
        options.nodes,
        options.shards,
        options.replication,
        options.backend_url,
        options.timing.ttl,
        options.timing.renew_interval
    ));

    // 1. Start and converge.
    let t0 = Instant::now();
    {
        let mut d = demo.lock().await;
        d.set_phase(Phase::Start, format!("{} nodes campaigning", ids.len()));
        for id in &ids {
            d.add(id).await?;
        }
    }
    let converged = settle(&demo, "converge").await?;
    let converge = converged.saturating_duration_since(t0);
    {
        let d = demo.lock().await;
        say(format!(
            "converged in {}: {}",
            show_ms(ms(converge)),
            d.counts()
        ));
        d.set_phase(
            Phase::Start,
            format!("converged in {}", show_ms(ms(converge))),
        );
    }
    pause(&options).await;

    // 1b. With --load: the nodes start reporting their figures and balance by load.
    let figures = demo.lock().await.figures.clone();
    let load = match figures {
        Some(figures) => {
            let load = balance_by_load(&demo, &figures).await?;
            say(format!(
                "balanced by load in {} with {} moves: load max / mean {:.3} by count, {:.3} by load (lower bound {:.3})",
                show_ms(load.balance_ms),
                load.moves,
                load.max_over_mean_by_count,
                load.max_over_mean_by_load,
                load.lower_bound
            ));
            for line in load.bars() {
                view.line(&format!("  {line}"));
            }
            demo.lock().await.set_phase(
                Phase::Balance,
                format!(
                    "{} moves: max / mean {:.2} by count, {:.2} by load",
                    load.moves, load.max_over_mean_by_count, load.max_over_mean_by_load
                ),
            );
            pause(&options).await;
            Some(load)
        }
        None => None,
    };

    // 2. Crash a node.
    let victim = ids[ids.len() / 2].clone();
    let t_crash;
    let crashed_shards;
    {
        let mut d = demo.lock().await;
        let node = d.take(&victim)?;
        let held: Vec<usize> = node.manager.held().iter().map(|(s, _)| s.index()).collect();
        d.set_phase(
            Phase::Crash,
            format!("{victim} crashed with {} shards", held.len()),
        );
        t_crash = Instant::now();
        node.manager.abandon();
        lock(&d.record).crash(&victim, t_crash);
        crashed_shards = held;
        say(format!(
            "crashed {victim} (no resign; its {} shards wait for its TTL to expire)",
            crashed_shards.len()
        ));
    }
    settle_step(&demo, "failover").await?;
    let failover = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        let mut last = t_crash;
        let mut seen = 0;
        let mut was_crashed = vec![false; r.leaders.len()];
        for &i in &crashed_shards {
            if let Some(c) = was_crashed.get_mut(i) {
                *c = true;
            }
        }
        // The first acquisition of each (balancing by load may move one again later).
        for (_, shard, at, _) in &r.acquisitions {
            if *at >= t_crash {
                if let Some(c) = was_crashed.get_mut(*shard).filter(|c| **c) {
                    *c = false;
                    seen += 1;
                    last = last.max(*at);
                }
            }
        }
        if seen < crashed_shards.len() {
            tracing::warn!(
                seen,
                expected = crashed_shards.len(),
                "not every shard of the crashed node was acquired again"
            );
        }
        last.saturating_duration_since(t_crash)
    };
    {
        let d = demo.lock().await;
        say(format!(
            "{victim}'s {} shards led again {} after the crash: {}",
            crashed_shards.len(),
            show_ms(ms(failover)),
            d.counts()
        ));
        d.set_phase(
            Phase::Crash,
            format!("failover took {}", show_ms(ms(failover))),
        );
    }
    pause(&options).await;

    // 3. Add a node.
    let newcomer = format!("node-{}", options.nodes + 1);
    let t_join = Instant::now();
    {
        let mut d = demo.lock().await;
        d.set_phase(Phase::Join, format!("{newcomer} joins"));
        d.add(&newcomer).await?;
    }
    say(format!("added {newcomer}"));
    let joined = settle_step(&demo, "join").await?;
    let join = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        let moves = r
            .acquisitions
            .iter()
            .filter(|(p, ..)| *p == Phase::Join)
            .count();
        let optimum = r
            .leaders
            .iter()
            .filter(|l| l.as_deref() == Some(newcomer.as_str()))
            .count();
        let gaps: Vec<Duration> = r
            .gaps
            .iter()
            .filter(|(p, ..)| *p == Phase::Join)
            .map(|(_, _, g, _)| *g)
            .collect();
        JoinSummary {
            node: newcomer.clone(),
            moves,
            optimum,
            gaps: Spread::of(&gaps),
            settle_ms: ms(joined.saturating_duration_since(t_join)),
        }
    };
    {
        let d = demo.lock().await;
        say(format!(
            "{newcomer} took {} shards with {} moves (optimum {}), handoff gaps {}: {}",
            join.optimum,
            join.moves,
            join.optimum,
            join.gaps.show(),
            d.counts()
        ));
        d.set_phase(
            Phase::Join,
            format!("{} moves, optimum {}", join.moves, join.optimum),
        );
    }
    pause(&options).await;

    // 4. Drain a node, then let it leave.
    let drained = ids[0].clone();
    demo.lock()
        .await
        .set_phase(Phase::Drain, format!("{drained} drains"));
    let drain_start = Instant::now();
    // Drain without holding the lock, so the live view keeps drawing.
    drain_node(&demo, &drained).await?;
    let drain_time = drain_start.elapsed();
    {
        let mut d = demo.lock().await;
        let node = d.take(&drained)?;
        node.manager.close().await?;
    }
    settle_step(&demo, "drain").await?;
    let drain = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        // The drained node's own handoffs (with --load, the balancer may move others').
        let gaps: Vec<Duration> = r
            .gaps
            .iter()
            .filter(|(p, why, _, from)| {
                *p == Phase::Drain && *why == "handoff" && **from == *drained
            })
            .map(|(_, _, g, _)| *g)
            .collect();
        DrainSummary {
            node: drained.clone(),
            handoffs: gaps.len(),
            gaps: Spread::of(&gaps),
            drain_ms: ms(drain_time),
        }
    };
    {
        let d = demo.lock().await;
        say(format!(
            "drained {drained} in {}: {} handoffs, gaps {}; it left: {}",
            show_ms(drain.drain_ms),
            drain.handoffs,
            drain.gaps.show(),
            d.counts()
        ));
        d.set_phase(Phase::Done, format!("{drained} drained and left"));
    }

    let d = demo.lock().await;
    let end = d.end_state().await?;
    let all_gaps: Vec<Duration> = lock(&d.record)
        .gaps
        .iter()
        .filter(|(_, why, ..)| *why == "handoff")
        .map(|(_, _, g, _)| *g)
        .collect();
    Ok(DemoSummary {
        backend: options.backend_url.clone(),
        namespace: options.namespace.clone(),
        nodes: options.nodes,
        shards: options.shards,
        replication: options.replication,
        ttl_ms: ms(options.timing.ttl),
        renew_interval_ms: ms(options.timing.renew_interval),
        converge_ms: ms(converge),
        crashes: vec![CrashSummary {
            node: victim,
            shards: crashed_shards.len(),
            failover_ms: ms(failover),
        }],
        join,
        drain,
        handoff_gaps: Spread::of(&all_gaps),
        load,
        end,
        wall_ms: ms(started.elapsed()),
    })
}

/// Settle without holding the demo's lock between checks (the view draws meanwhile).
/// The budget scales with the work: the demo gives up only after `step_limit` in which
/// no node took, gave up or asked for a shard, however long the whole step takes.
async fn settle(demo: &Arc<tokio::sync::Mutex<Demo>>, what: &str) -> Result<Instant> {
    let limit = demo.lock().await.options.step_limit;
    let mut last = (demo.lock().await.progress(), Instant::now());
    let mut since: Option<Instant> = None;
    loop {
        let (quiet, now) = {
            let d = demo.lock().await;
            (d.quiet(), d.progress())
        };
        if quiet {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= Duration::from_millis(100) {
                return Ok(s);
            }
        } else {
            since = None;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > limit {
            return Err(demo.lock().await.not_settled(what));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The step that balances by load: the load per node by the leaders of the cold start
/// (the count plan: no figure is published yet), then the nodes report their figures
/// and the balancer moves shards until the load per node settles.
async fn balance_by_load(
    demo: &Arc<tokio::sync::Mutex<Demo>>,
    figures: &[f64],
) -> Result<LoadSummary> {
    let by_count = demo.lock().await.loads_now(figures).await?;
    let (started, before) = {
        let d = demo.lock().await;
        d.set_phase(Phase::Balance, "the nodes report their loads".into());
        d.reporting.store(true, Ordering::Relaxed);
        (Instant::now(), d.acquired())
    };
    let balanced = settle_step(demo, "balance by load").await?;
    let d = demo.lock().await;
    let by_load = d.loads_now(figures).await?;
    let moves = d.acquired().saturating_sub(before);
    let mut per_node = BTreeMap::new();
    for id in by_count.keys().chain(by_load.keys()) {
        let (a, b) = (
            by_count.get(id).copied().unwrap_or_default(),
            by_load.get(id).copied().unwrap_or_default(),
        );
        per_node.insert(
            id.clone(),
            NodeLoad {
                shards_by_count: a.0,
                by_count: a.1,
                shards_by_load: b.0,
                by_load: b.1,
            },
        );
    }
    Ok(LoadSummary {
        figures: format!("Zipf figures, exponent {ZIPF_EXPONENT}"),
        largest: figures.iter().copied().fold(0.0, f64::max),
        total: figures.iter().sum(),
        max_over_mean_by_count: max_over_mean(per_node.values().map(|n| n.by_count)),
        max_over_mean_by_load: max_over_mean(per_node.values().map(|n| n.by_load)),
        lower_bound: lower_bound(figures, d.nodes.len()),
        per_node,
        moves,
        balance_ms: ms(balanced.saturating_duration_since(started)),
    })
}

/// [`settle`]; with `--load`, also until every shard's figure is published and no
/// shard has changed hands for [`LOAD_QUIET`] (the balancer acts a while after the
/// figures held still, so the first quiet moment is not the end of a step). Returns
/// when the last quiet stretch began; gives up when shards still change hands after
/// four times `step_limit`, or the figures are not all published within it.
async fn settle_step(demo: &Arc<tokio::sync::Mutex<Demo>>, what: &str) -> Result<Instant> {
    let (load, limit) = {
        let d = demo.lock().await;
        (d.figures.is_some(), d.options.step_limit)
    };
    if !load {
        return settle(demo, what).await;
    }
    let started = Instant::now();
    let mut published = false;
    loop {
        let at = settle(demo, what).await?;
        if !published {
            published = demo.lock().await.figures_published();
            if !published {
                if started.elapsed() > limit {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "{what}: the nodes' load figures were not all published within {limit:?}"
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let (moved, since) = (demo.lock().await.acquired(), Instant::now());
        let mut still = true;
        while since.elapsed() < LOAD_QUIET {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let d = demo.lock().await;
            if d.acquired() != moved || !d.quiet() {
                still = false;
                break;
            }
        }
        if still {
            return Ok(at);
        }
        if started.elapsed() > limit * 4 {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what}: shards still change hands after {:?} of balancing by load",
                    limit * 4
                ),
            ));
        }
    }
}

/// Drain `id` without holding the demo's lock while it runs. Like [`settle`], it gives
/// up only after `step_limit` in which the node handed nothing over.
async fn drain_node(demo: &Arc<tokio::sync::Mutex<Demo>>, id: &str) -> Result<()> {
    let (manager, limit) = {
        let d = demo.lock().await;
        (d.node(id)?.manager.clone(), d.options.step_limit)
    };
    let mut status = manager.status();
    let left = |s: &tenure::shard::ShardStatus| (s.held, s.campaigning);
    let mut last = (left(&status.borrow()), Instant::now());
    let drain = manager.drain();
    tokio::pin!(drain);
    loop {
        tokio::select! {
            r = &mut drain => return r,
            _ = status.changed() => {
                let now = left(&status.borrow_and_update());
                if now != last.0 {
                    last = (now, Instant::now());
                }
            }
            _ = tokio::time::sleep_until(last.1 + limit) => {
                let (held, campaigning) = last.0;
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "drain of {id}: nothing handed over for {limit:?}; it still holds {held} shards and campaigns for {campaigning}"
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::FencingToken;

    fn acquired(layout: &Layout, i: usize) -> ShardEvent {
        ShardEvent::Acquired {
            shard: layout.shards()[i].clone(),
            token: FencingToken(1),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            work: tenure::WorkGuard::detached(),
            at: Instant::now(),
        }
    }

    fn handed_off(layout: &Layout, i: usize) -> ShardEvent {
        ShardEvent::HandedOff {
            shard: layout.shards()[i].clone(),
            token: FencingToken(1),
            to: None,
            at: Instant::now(),
        }
    }

    fn status(held: usize, members: usize) -> ShardStatus {
        ShardStatus {
            members,
            held,
            target: held,
            settled: true,
            ..ShardStatus::default()
        }
    }

    #[test]
    fn a_step_is_settled_only_once_every_node_s_events_are_read() {
        let layout = Layout::new("demo", 4, 1).expect("layout");
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut r = Record::new(4);
        let t = Instant::now();
        for i in 0..4 {
            r.on_event(&a, t, acquired(&layout, i));
        }
        let managers = [("a", status(4, 2)), ("b", status(0, 2))];
        assert!(r.all_read_and_settled(&managers));
        // a handed shard 0 to b; b's grant is read first, a's handoff is not read yet:
        // not settled, however quiet the managers are (the next step would count it).
        let managers = [("a", status(3, 2)), ("b", status(1, 2))];
        r.on_event(&b, t, acquired(&layout, 0));
        assert!(!r.all_read_and_settled(&managers));
        r.on_event(&a, t, handed_off(&layout, 0));
        assert!(r.all_read_and_settled(&managers));
        // Events of different nodes read in any order give the same counts: b's
        // grant of shard 1 read before a's own (older) grant would have been.
        let mut late = Record::new(4);
        late.on_event(&b, t, acquired(&layout, 1));
        late.on_event(&a, t, acquired(&layout, 1));
        late.on_event(&a, t, handed_off(&layout, 1));
        assert_eq!((late.led_by("a"), late.led_by("b")), (0, 1));
        // A crash releases the crashed node's shards.
        assert_eq!(r.crash("a", t), 3);
        assert_eq!((r.led_by("a"), r.led_by("b")), (0, 1));
        // A node that still has work pending is not settled either.
        let busy = ShardStatus {
            pending_handoffs: 1,
            ..status(1, 1)
        };
        assert!(!r.all_read_and_settled(&[("b", busy)]));
        assert!(r.all_read_and_settled(&[("b", status(1, 1))]));
    }

    #[test]
    fn the_handoff_rate_keeps_small_demos_watchable_and_drains_large_ones_in_seconds() {
        assert_eq!(handoff_rate(256, 5), (200.0, 20));
        for (shards, nodes) in [(100_000, 10), (1_000_000, 10), (1 << 20, 2)] {
            let (rate, burst) = handoff_rate(shards, nodes);
            let drain = (shards / nodes) as f64 / rate;
            assert!(drain <= 2.0, "{shards} over {nodes}: {drain} s at {rate}/s");
            assert!(burst >= 1 && f64::from(burst) <= rate, "{burst} of {rate}");
        }
    }
}
