//! Running the benchmark ([`run`]): a cluster of managers in one process measured
//! through a cold start, a crash, a join, a quiet stretch and a drain; and the time
//! to compute an assignment ([`assignment_times`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_core::{DynBackend, Result, Timing};
use tokio::time::Instant;

use super::counting::CountingBackend;
use crate::assign::{plan, NodeSpec};
use crate::config::Layout;
use crate::hash::key_hash;
use crate::manager::ShardManager;

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
