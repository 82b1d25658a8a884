//! The shard manager's benchmark, shared by the examples and `tenure bench`: a cluster
//! of managers in one process (each with its own connection), measured through a cold
//! start, a crash, a join and a quiet stretch, plus the time to compute an assignment.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{BackendSession, Capabilities, SessionEvents};
use tenure_core::{
    Backend, Candidate, DynBackend, ElectionName, FencingToken, LeaderInfo, LeaderStream, Member,
    MemberStream, Result, Timing,
};
use tokio::time::Instant;

use crate::assign::{plan, NodeSpec};
use crate::config::Layout;
use crate::hash::key_hash;
use crate::manager::ShardManager;

/// Counts every request a backend and its sessions make (each is at least one round
/// trip to the store; streams count once when opened).
#[derive(Debug)]
pub struct CountingBackend {
    inner: DynBackend,
    count: Arc<AtomicU64>,
    batches: Arc<BatchGauge>,
}

/// Seats in `try_campaign_many` calls in flight, over all sessions of a
/// [`CountingBackend`], and the most seen at once; each call can be slowed down so
/// that calls meet.
#[derive(Debug, Default)]
pub struct BatchGauge {
    in_flight: AtomicU64,
    peak: AtomicU64,
    delay: std::sync::Mutex<Duration>,
}

impl BatchGauge {
    /// The most seats that were in flight at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Hold every later batch call this long before it goes to the store.
    pub fn slow_down(&self, delay: Duration) {
        *self.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }
}

impl CountingBackend {
    /// Wrap `inner`, adding to `count`.
    pub fn new(inner: DynBackend, count: Arc<AtomicU64>) -> Self {
        CountingBackend {
            inner,
            count,
            batches: Arc::default(),
        }
    }

    /// The gauge of the batch calls in flight.
    pub fn batches(&self) -> Arc<BatchGauge> {
        self.batches.clone()
    }

    fn tick(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn scheme(&self) -> &'static str {
        self.inner.scheme()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn check_timing(&self, timing: &Timing) -> Result<()> {
        self.inner.check_timing(timing)
    }
    async fn open_session(
        &self,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Arc<dyn BackendSession>> {
        self.tick();
        let inner = self.inner.open_session(ttl, events).await?;
        Ok(Arc::new(CountingSession {
            inner,
            count: self.count.clone(),
            batches: self.batches.clone(),
            batch: self.inner.capabilities().batch.unwrap_or(1).max(1),
        }))
    }
    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.tick();
        self.inner.leader(election).await
    }
    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.tick();
        self.inner.observe(election).await
    }
    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.tick();
        self.inner.members(namespace).await
    }
    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.tick();
        self.inner.watch_members(namespace).await
    }
}

#[derive(Debug)]
struct CountingSession {
    inner: Arc<dyn BackendSession>,
    count: Arc<AtomicU64>,
    batches: Arc<BatchGauge>,
    /// Seats per round trip of the batch calls (1 where the store asks seat by seat).
    batch: usize,
}

impl CountingSession {
    fn tick(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch of `seats` costs one request per `batch` of them.
    fn tick_batch(&self, seats: usize) {
        let requests = seats.div_ceil(self.batch) as u64;
        self.count.fetch_add(requests, Ordering::Relaxed);
    }
}

#[async_trait]
impl BackendSession for CountingSession {
    fn id(&self) -> &str {
        self.inner.id()
    }
    async fn keep_alive(&self) -> Result<()> {
        self.tick();
        self.inner.keep_alive().await
    }
    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        self.tick();
        self.inner.campaign(election, candidate).await
    }
    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        self.tick();
        self.inner.try_campaign(election, candidate).await
    }
    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.tick();
        self.inner.resign(election, token).await
    }
    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        self.tick_batch(seats.len());
        let g = &self.batches;
        let n = seats.len() as u64;
        let now = g.in_flight.fetch_add(n, Ordering::Relaxed) + n;
        g.peak.fetch_max(now, Ordering::Relaxed);
        let delay = *g.delay.lock().unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let answers = self.inner.try_campaign_many(seats).await;
        g.in_flight.fetch_sub(n, Ordering::Relaxed);
        answers
    }
    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        self.tick_batch(grants.len());
        self.inner.resign_many(grants).await
    }
    async fn close(&self) -> Result<()> {
        self.tick();
        self.inner.close().await
    }
    fn abandon(&self) {
        self.inner.abandon();
    }
    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.tick();
        self.inner.register_member(namespace, member).await
    }
    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.tick();
        self.inner.unregister_member(namespace, id).await
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Shards.
    pub shards: usize,
    /// Nodes (each its own session and connection).
    pub nodes: usize,
    /// Replication factor.
    pub replication: usize,
    /// Session timing of every node.
    pub timing: Timing,
    /// How long to count requests in the quiet stretch.
    pub steady_window: Duration,
    /// Give up waiting for convergence after this long.
    pub settle_timeout: Duration,
}

impl BenchConfig {
    /// `shards` shards on 10 nodes, replication 3, TTL 2 s, a 5 s quiet stretch.
    pub fn new(shards: usize) -> Self {
        BenchConfig::with_nodes(shards, 10)
    }

    /// `shards` shards on `nodes` nodes, replication 3, a 5 s quiet stretch, and TTL
    /// 2 s, or 10 s (the default) with a 300 s settle limit once shards × nodes
    /// reaches 10^6: all nodes share one process and this machine's cores (and the
    /// store's), and a 2 s TTL leaves too little room for the scheduling delays of
    /// that much work (renewals queue behind it and sessions expire).
    pub fn with_nodes(shards: usize, nodes: usize) -> Self {
        let large = shards.saturating_mul(nodes) >= 1_000_000;
        BenchConfig {
            shards,
            nodes,
            replication: 3,
            timing: if large {
                Timing::default()
            } else {
                Timing::from_ttl(Duration::from_secs(2))
            },
            steady_window: Duration::from_secs(5),
            settle_timeout: Duration::from_secs(if large { 300 } else { 120 }),
        }
    }
}

/// The figures of one run.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Backend name.
    pub backend: String,
    /// Shards, nodes, replication.
    pub shards: usize,
    /// Nodes at the start.
    pub nodes: usize,
    /// Replication factor.
    pub replication: usize,
    /// Session TTL.
    pub ttl: Duration,
    /// From starting every node to every shard led by its preferred node.
    pub cold: Duration,
    /// From a node's crash to convergence again (includes the TTL).
    pub crash: Duration,
    /// From a node's start to convergence again.
    pub join: Duration,
    /// Shards whose leader changed on the join.
    pub join_moves: usize,
    /// The newcomer's share, the fewest moves a join can take.
    pub join_optimum: usize,
    /// Most leaderships of a node over the mean, after the join.
    pub imbalance: f64,
    /// From asking a node to drain to it holding nothing (every shard handed over).
    pub drain: Duration,
    /// Shards the drained node held.
    pub drained: usize,
    /// Requests to the store per second in the quiet stretch, all nodes together.
    pub steady_requests_per_sec: f64,
    /// Heap bytes per held shard after the cold start, if an allocation probe was given.
    pub bytes_per_shard: Option<f64>,
}

async fn start_node<F, Fut>(
    connect: &F,
    layout: &Layout,
    id: &str,
    timing: &Timing,
    count: &Arc<AtomicU64>,
) -> Result<ShardManager>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<DynBackend>>,
{
    let backend: DynBackend = Arc::new(CountingBackend::new(connect().await?, count.clone()));
    let (m, events) = ShardManager::builder(backend)
        .layout(layout.clone())
        .node_id(id)
        .timing(timing.clone())
        .handoff_rate(100_000.0, 100_000)
        .publish_interval(Duration::from_millis(20))
        .start()
        .await?;
    drop(events);
    Ok(m)
}

/// True when every node sees all of `nodes`, campaigns and hands off nothing, and
/// sees every shard led by its preferred node.
pub(crate) fn quiet(nodes: &[&ShardManager]) -> bool {
    nodes
        .iter()
        .all(|m| m.status().borrow().is_quiet(nodes.len()))
}

/// Wait until `nodes` are [`quiet`] and stay so for `hold` (a status may predate the
/// last change reaching every node); returns the time from `t0` to the start of the
/// quiet, or `None` once `limit` has passed since `t0`.
pub(crate) async fn settle(
    nodes: &[&ShardManager],
    t0: Instant,
    hold: Duration,
    limit: Duration,
) -> Option<Duration> {
    let mut since: Option<Instant> = None;
    let trace = std::env::var_os("TENURE_BENCH_TRACE").is_some();
    let mut last_trace = Instant::now();
    loop {
        if trace && last_trace.elapsed() >= Duration::from_secs(1) {
            last_trace = Instant::now();
            for m in nodes {
                eprintln!(
                    "{:?} {} {:?}",
                    t0.elapsed(),
                    m.node_id(),
                    *m.status().borrow()
                );
            }
        }
        if quiet(nodes) {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= hold {
                return Some(s - t0);
            }
        } else {
            since = None;
        }
        if t0.elapsed() > limit {
            if trace {
                // Name a few shards that keep the cluster from settling, as each
                // node sees them.
                for m in nodes {
                    let view = m.view();
                    let stuck: Vec<String> = view
                        .shards
                        .iter()
                        .filter(|s| s.leader.is_none() || s.leader != s.preferred)
                        .take(3)
                        .map(|s| format!("{}: {:?} -> {:?}", s.shard, s.leader, s.preferred))
                        .collect();
                    eprintln!("{} unsettled: {stuck:?}", m.node_id());
                    // How many shards this node sees each node lead: a node whose
                    // figures differ from the others' has a stale picture of someone.
                    let leads: Vec<String> = view
                        .nodes
                        .iter()
                        .map(|n| format!("{}={}", n.id, n.leads))
                        .collect();
                    eprintln!("{} sees leads {}", m.node_id(), leads.join(" "));
                }
            }
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn settle_all(nodes: &[ShardManager], t0: Instant, limit: Duration) -> Result<Duration> {
    let refs: Vec<&ShardManager> = nodes.iter().collect();
    settle(&refs, t0, Duration::from_millis(200), limit)
        .await
        .ok_or_else(|| {
            tenure_core::Error::new(
                tenure_core::ErrorKind::Timeout,
                format!("the cluster did not converge within {limit:?}"),
            )
        })
}

fn leaders(m: &ShardManager) -> Vec<Option<String>> {
    m.view().shards.into_iter().map(|s| s.leader).collect()
}

/// Run the benchmark on the backend `connect` opens (called once per node).
/// `allocated` reports the process's live heap bytes, if the caller counts them.
pub async fn run<F, Fut>(
    name: &str,
    connect: F,
    cfg: &BenchConfig,
    allocated: Option<&(dyn Fn() -> usize + Sync)>,
) -> Result<BenchResult>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<DynBackend>>,
{
    let ns = format!(
        "bench-{:x}",
        key_hash(&format!("{name}{:?}", Instant::now())) >> 16
    );
    let layout = Layout::new(&ns, cfg.shards, cfg.replication)?;
    let count = Arc::new(AtomicU64::new(0));
    let heap0 = allocated.map(|f| f());

    // Cold start: every node at once.
    let t0 = Instant::now();
    let ids: Vec<String> = (0..cfg.nodes).map(|i| format!("node-{i:02}")).collect();
    let mut starts = Vec::new();
    for id in &ids {
        starts.push(start_node(&connect, &layout, id, &cfg.timing, &count));
    }
    let mut nodes = Vec::new();
    for r in futures::future::join_all(starts).await {
        nodes.push(r?);
    }
    let cold = settle_all(&nodes, t0, cfg.settle_timeout).await?;
    let bytes_per_shard = match (allocated, heap0) {
        (Some(f), Some(h0)) => Some(f().saturating_sub(h0) as f64 / cfg.shards as f64),
        _ => None,
    };

    // Quiet stretch: requests per second.
    let c0 = count.load(Ordering::Relaxed);
    let s0 = Instant::now();
    tokio::time::sleep(cfg.steady_window).await;
    let steady = (count.load(Ordering::Relaxed) - c0) as f64 / s0.elapsed().as_secs_f64();

    // Crash one node.
    let victim = nodes.remove(cfg.nodes / 2);
    let t1 = Instant::now();
    victim.abandon();
    let crash = settle_all(&nodes, t1, cfg.settle_timeout).await?;

    // Join a node.
    let before = leaders(&nodes[0]);
    let t2 = Instant::now();
    let newcomer = start_node(&connect, &layout, "node-new", &cfg.timing, &count).await?;
    nodes.push(newcomer);
    let join = settle_all(&nodes, t2, cfg.settle_timeout).await?;
    let after = leaders(&nodes[0]);
    let join_moves = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let view = nodes[0].view();
    let join_optimum = view
        .nodes
        .iter()
        .find(|n| n.id == "node-new")
        .map_or(0, |n| n.target);
    let imbalance = view.imbalance();

    // Drain a node: every shard it leads handed over gracefully.
    let drained = nodes[0].held().len();
    let t3 = Instant::now();
    tokio::time::timeout(cfg.settle_timeout, nodes[0].drain())
        .await
        .map_err(|_| {
            tenure_core::Error::new(
                tenure_core::ErrorKind::Timeout,
                format!("the drain did not end within {:?}", cfg.settle_timeout),
            )
        })??;
    let drain = t3.elapsed();

    for m in &nodes {
        let _ = m.close().await;
    }
    Ok(BenchResult {
        backend: name.to_string(),
        shards: cfg.shards,
        nodes: cfg.nodes,
        replication: cfg.replication,
        ttl: cfg.timing.ttl,
        cold,
        crash,
        join,
        join_moves,
        join_optimum,
        imbalance,
        drain,
        drained,
        steady_requests_per_sec: steady,
        bytes_per_shard,
    })
}

/// Time to compute an assignment of `shards` shards over `nodes` nodes with
/// replication 3: from scratch, and again with the holders it produced. `runs` each.
pub fn assignment_times(
    shards: usize,
    nodes: usize,
    runs: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let hashes: Vec<u64> = (0..shards)
        .map(|i| key_hash(&format!("bench/{i:06}")))
        .collect();
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec::new(format!("node-{i:03}")))
        .collect();
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = std::time::Instant::now();
        let p = plan(&hashes, &specs, 3, &[]);
        cold.push(t.elapsed());
        let holders: Vec<Option<u32>> = (0..shards).map(|s| p.preferred(s)).collect();
        let t = std::time::Instant::now();
        let again = plan(&hashes, &specs, 3, &holders);
        warm.push(t.elapsed());
        debug_assert_eq!(again.moves_from(&holders), 0);
    }
    (cold, warm)
}

/// Min / median / max of `v` as "a / b / c ms".
pub fn min_med_max_ms(v: &[Duration]) -> String {
    let mut v = v.to_vec();
    v.sort();
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(a), Some(b), Some(c)) => format!(
            "{:.1} / {:.1} / {:.1} ms",
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            c.as_secs_f64() * 1e3
        ),
        _ => "-".to_string(),
    }
}

/// The results as one markdown table.
pub fn markdown(results: &[BenchResult]) -> String {
    let mut out = String::from(
        "| backend | shards | nodes | R | TTL | cold start | re-converge after crash | re-converge after join | join moves / optimum | max/mean leaders | drain (shards) | store requests/s (steady) | heap per shard |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:?} | {:.2} s | {:.2} s | {:.2} s | {} / {} | {:.3} | {:.2} s ({}) | {:.1} | {} |",
            r.backend,
            r.shards,
            r.nodes,
            r.replication,
            r.ttl,
            r.cold.as_secs_f64(),
            r.crash.as_secs_f64(),
            r.join.as_secs_f64(),
            r.join_moves,
            r.join_optimum,
            r.imbalance,
            r.drain.as_secs_f64(),
            r.drained,
            r.steady_requests_per_sec,
            r.bytes_per_shard
                .map_or("-".to_string(), |b| format!("{:.0} B", b)),
        );
    }
    out
}

/// One figure of a result, for [`scaling_svg`].
type Figure = fn(&BenchResult) -> Duration;

/// The figures of `results` against the number of shards on log-log axes, as an SVG
/// chart: cold start, re-converge after a crash and after a join, and drain, one line
/// each per node count, with a slope-1 reference line (time proportional to shards)
/// through the first cold start. Results of one backend are meant.
pub fn scaling_svg(results: &[BenchResult]) -> String {
    const W: f64 = 780.0;
    const H: f64 = 440.0;
    // Margins: left, right (the legend), top, bottom.
    const L: f64 = 70.0;
    const R: f64 = 230.0;
    const T: f64 = 30.0;
    const B: f64 = 50.0;
    let series: [(&str, &str, Figure); 4] = [
        ("cold start", "#1f77b4", |r| r.cold),
        ("after a crash", "#d62728", |r| r.crash),
        ("after a join", "#2ca02c", |r| r.join),
        ("drain of a node", "#9467bd", |r| r.drain),
    ];
    let secs = |d: Duration| d.as_secs_f64().max(1e-3);
    let xs: Vec<f64> = results.iter().map(|r| (r.shards as f64).log10()).collect();
    let ys: Vec<f64> = results
        .iter()
        .flat_map(|r| series.iter().map(move |(_, _, f)| secs(f(r)).log10()))
        .collect();
    let bounds = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min).floor();
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
        if lo.is_finite() && hi.is_finite() {
            (lo, hi.max(lo + 1.0))
        } else {
            (0.0, 1.0)
        }
    };
    let ((x0, x1), (y0, y1)) = (bounds(&xs), bounds(&ys));
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (y - y0) / (y1 - y0) * (H - T - B);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{L}" y="18" font-size="14">Shard manager: time against shards (log-log); a crash's time includes the session TTL</text>
"#
    );
    for e in x0 as i32..=x1 as i32 {
        let x = px(f64::from(e));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{T}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">10^{e}</text>"##,
            H - B,
            H - B + 16.0
        );
    }
    for e in y0 as i32..=y1 as i32 {
        let y = py(f64::from(e));
        let label = match e {
            e if e < 0 => format!("{} ms", 10f64.powi(e + 3)),
            e => format!("{} s", 10f64.powi(e)),
        };
        let _ = writeln!(
            out,
            r##"<line x1="{L}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">shards</text>"#,
        (L + W - R) / 2.0,
        H - 12.0
    );
    // Slope 1 through the first cold start, clipped to the plot.
    if let Some(first) = results.first() {
        let (xa, ya) = ((first.shards as f64).log10(), secs(first.cold).log10());
        let xb = x1.min(xa + (y1 - ya));
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="5,4"/>"##,
            px(xa),
            py(ya),
            px(xb),
            py(ya + (xb - xa))
        );
    }
    let mut node_counts: Vec<usize> = results.iter().map(|r| r.nodes).collect();
    node_counts.sort_unstable();
    node_counts.dedup();
    let mut legend = 0;
    for (name, color, f) in series {
        for &n in &node_counts {
            let points: Vec<(f64, f64)> = results
                .iter()
                .filter(|r| r.nodes == n)
                .map(|r| (px((r.shards as f64).log10()), py(secs(f(r)).log10())))
                .collect();
            let dash = if n == node_counts[0] {
                ""
            } else {
                r#" stroke-dasharray="2,3""#
            };
            let line: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                line.join(" ")
            );
            for (x, y) in &points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"#
                );
            }
            let ly = T + 10.0 + 18.0 * f64::from(legend);
            legend += 1;
            let _ = writeln!(
                out,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{name}, {n} nodes</text>"#,
                W - R + 10.0,
                W - R + 30.0,
                W - R + 36.0,
                ly + 4.0
            );
        }
    }
    let ly = T + 10.0 + 18.0 * f64::from(legend);
    let _ = writeln!(
        out,
        r##"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#888" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}">slope 1 (linear)</text>"##,
        W - R + 10.0,
        W - R + 30.0,
        W - R + 36.0,
        ly + 4.0
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(shards: usize, nodes: usize, secs: f64) -> BenchResult {
        let d = Duration::from_secs_f64(secs);
        BenchResult {
            backend: "mem".into(),
            shards,
            nodes,
            replication: 3,
            ttl: Duration::from_secs(2),
            cold: d,
            crash: d * 2,
            join: d / 2,
            join_moves: 0,
            join_optimum: 0,
            imbalance: 1.0,
            drain: d / 4,
            drained: 0,
            steady_requests_per_sec: 0.0,
            bytes_per_shard: None,
        }
    }

    #[test]
    fn the_scaling_chart_has_a_line_per_figure_and_node_count() {
        let results = [
            result(1_000, 10, 0.1),
            result(10_000, 10, 0.3),
            result(100_000, 10, 2.0),
            result(100_000, 100, 4.0),
        ];
        let svg = scaling_svg(&results);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Four figures, each for 10 and for 100 nodes.
        assert_eq!(svg.matches("<polyline").count(), 8);
        assert_eq!(svg.matches("<circle").count(), 4 * results.len());
        assert!(svg.contains("slope 1"));
        for label in ["10^3", "10^5", "100 ms", "1 s", "10 s"] {
            assert!(svg.contains(label), "missing axis label {label}");
        }
        // Every coordinate is a number inside the canvas.
        for cap in svg.split("cx=\"").skip(1) {
            let x: f64 = cap.split('"').next().unwrap().parse().unwrap();
            assert!((0.0..=780.0).contains(&x), "{x}");
        }
    }
}
