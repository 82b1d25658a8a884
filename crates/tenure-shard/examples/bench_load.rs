//! Balance by load beside balance by count, on the in-memory backend in real time:
//! `cargo run --release -p tenure-shard --example bench_load [-- 1000 10000]`;
//! the balancer's search alone at 10^4 to 10^6 shards: `… --example bench_load -- --search`
//! (or one row: `-- --search SHARDS NODES`).
//!
//! Ten equal nodes, replication 3, Zipf (s = 1.1) figures (scaled with the shard
//! count, see [`figures`]) reported by each shard's leader every 500 ms. Rows:
//! - **zipf**: max/mean node load once settled, by count (the same figures over the
//!   count plan's leaders; "before" for both rows) and by load ("after"); the lower
//!   bound; the handoffs made; the time from the first node's start until settled (by
//!   load: quiet and within the band).
//! - **shift**: from there, the shards ranked 2 to 11 by heat swap figures with the
//!   ten coldest: max/mean right after the swap and once balanced again, handoffs,
//!   time from the swap until back within the band.
//! - **noise**: every figure jitters ±20% every second for 20 s: max/mean before and
//!   at the end (on the jittered figures), handoffs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::{MemoryBackend, Timing};
use tenure_shard::balance::{zipf, LoadPolicy};
use tenure_shard::testing::{same_backend, Cluster};
use tenure_shard::Layout;
use tenure_shard::NodeSpec;
use tokio::time::Instant;

const NODES: usize = 10;
/// How long a step may take before its time shows as "—" (at 10^6 shards the
/// default budget of 1,000 moves a second alone takes over a minute).
const LIMIT: Duration = Duration::from_secs(300);

struct Row {
    scenario: &'static str,
    shards: usize,
    by_count: f64,
    by_load: f64,
    bound: f64,
    moves: usize,
    time: Option<Duration>,
}

/// TTL 2 s, and 10 s from 100,000 shards as in `bench_shards` (a node of 10^6 shards
/// on this 2-core machine can miss a 2 s renewal while it plans).
fn timing(shards: usize) -> Timing {
    let ttl = if shards >= 100_000 { 10 } else { 2 };
    let mut t = Timing::from_ttl(Duration::from_secs(ttl));
    t.connect_timeout = Duration::from_secs(2);
    t
}

async fn cluster(shards: usize, figures: Option<Vec<f64>>) -> Cluster {
    let layout = Layout::new(
        &format!("bench-load-{shards}-{}", figures.is_some()),
        shards,
        3,
    )
    .expect("layout");
    let mut c = Cluster::new(
        same_backend(Arc::new(MemoryBackend::new())),
        layout,
        timing(shards),
    )
    .await;
    c.figures = figures.map(|f| Arc::new(Mutex::new(f)));
    c.policy = LoadPolicy::default();
    c
}

/// [`Cluster::load_spread`] once every shard has a leader (a handoff may be under
/// way at any moment).
async fn spread(c: &Cluster) -> (f64, f64, std::collections::BTreeMap<String, f64>) {
    loop {
        if let Ok(s) = c.try_load_spread().await {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until balanced (see [`Cluster::until_balanced`]); the time from `since`, or
/// `None` after `limit`.
async fn until_balanced(c: &Cluster, since: Instant, limit: Duration) -> Option<Duration> {
    c.until_balanced(limit).await.then(|| since.elapsed())
}

/// Zipf (s = 1.1) figures, scaled with the shard count so that the coldest shard is
/// as far above the codes' floor (0.005, see `quantize`) as at 1,000 shards: at
/// 100,000 shards unscaled, a third of the shards would count as no load, and their
/// figures (4% of the total) would stay wherever they were.
fn figures(shards: usize) -> Vec<f64> {
    let scale = (shards as f64 / 1000.0).max(1.0);
    zipf(shards, 1.1).into_iter().map(|f| f * scale).collect()
}

async fn rows(shards: usize) -> Vec<Row> {
    let figures = figures(shards);
    let mut out = Vec::new();

    // By count.
    let mut c = cluster(shards, None).await;
    let start = Instant::now();
    for i in 0..NODES {
        c.add(&format!("node-{i}")).await;
    }
    let count_time = c.settle(LIMIT).await;
    let count_moves = c.handoffs_since(start).len();
    c.figures = Some(Arc::new(Mutex::new(figures.clone())));
    let (by_count, bound, _) = spread(&c).await;
    c.figures = None;
    c.close_all().await;

    // By load.
    let mut c = cluster(shards, Some(figures.clone())).await;
    let start = Instant::now();
    for i in 0..NODES {
        c.add(&format!("node-{i}")).await;
    }
    c.settle(LIMIT).await;
    // The first figures are published within a load interval; give the balancer that.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let load_time = until_balanced(&c, start, LIMIT).await;
    let (by_load, _, _) = spread(&c).await;
    out.push(Row {
        scenario: "zipf, by count",
        shards,
        by_count,
        by_load: by_count,
        bound,
        moves: count_moves,
        time: Some(count_time),
    });
    out.push(Row {
        scenario: "zipf, by load",
        shards,
        by_count,
        by_load,
        bound,
        moves: c.handoffs_since(start).len(),
        time: load_time,
    });

    // Shift.
    let mut by_heat: Vec<usize> = (0..shards).collect();
    by_heat.sort_by(|a, b| figures[*b].total_cmp(&figures[*a]).then(a.cmp(b)));
    let shifted = Instant::now();
    if let Some(f) = &c.figures {
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        for k in 0..10 {
            f.swap(by_heat[1 + k], by_heat[shards - 1 - k]);
        }
    }
    // The leaders of the moment under the shifted figures.
    let (before, _, _) = spread(&c).await;
    // Wait for the new figures to be seen before polling for the balance.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let shift_time = until_balanced(&c, shifted, LIMIT).await;
    let (after, bound_after, _) = spread(&c).await;
    out.push(Row {
        scenario: "shift (ranks 2–11 ↔ 10 coldest)",
        shards,
        by_count: before,
        by_load: after,
        bound: bound_after,
        moves: c.handoffs_since(shifted).len(),
        time: shift_time,
    });

    // Noise.
    if let Some(f) = &c.figures {
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        f.clone_from(&figures);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    until_balanced(&c, Instant::now(), LIMIT).await;
    let (calm, _, _) = spread(&c).await;
    let since = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while since.elapsed() < Duration::from_secs(20) {
        if let Some(f) = &c.figures {
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            for (s, base) in figures.iter().enumerate() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                f[s] = base * (0.8 + 0.4 * (x % 1_000_001) as f64 / 1_000_000.0);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (noisy, bound_noise, _) = spread(&c).await;
    out.push(Row {
        scenario: "noise ±20% every 1 s, 20 s",
        shards,
        by_count: calm,
        by_load: noisy,
        bound: bound_noise,
        moves: c.handoffs_since(since).len(),
        time: None,
    });
    c.close_all().await;
    out
}

/// The balancer's search alone: the codes of [`figures`] over `shards`, `nodes` equal nodes,
/// R = 3, from the count plan's leaders; the whole rebalance (no budget), by the index
/// and (up to `scan_up_to` shards) by scoring every shard as before it.
fn search_row(shards: usize, nodes: usize, scan_up_to: usize) {
    use tenure_shard::balance::{level, lower_bound, plan_by_load, quantize, rebalance};
    let hashes: Vec<u64> = (0..shards)
        .map(|i| tenure_shard::hash::key_hash(&format!("search/{i}")))
        .collect();
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec::new(format!("node-{i:03}")))
        .collect();
    let loads: Vec<u64> = figures(shards)
        .into_iter()
        .map(|f| level(quantize(f)))
        .collect();
    let count = tenure_shard::plan(&hashes, &specs, 3, &[]);
    let holders: Vec<Option<u32>> = (0..shards).map(|s| count.preferred(s)).collect();
    let started = std::time::Instant::now();
    let placed = plan_by_load(None, &hashes, &specs, 3, &holders, &loads, &[]);
    let place = started.elapsed();
    let policy = LoadPolicy::default();
    let started = std::time::Instant::now();
    let moves = rebalance(&placed, &specs, &loads, &policy, usize::MAX);
    let search = started.elapsed();
    let scan = (shards <= scan_up_to).then(|| {
        let started = std::time::Instant::now();
        let same =
            tenure_shard::balance::rebalance_by_scan(&placed, &specs, &loads, &policy, usize::MAX);
        assert_eq!(same, moves, "the scan and the index disagree");
        started.elapsed()
    });
    let after = plan_by_load(None, &hashes, &specs, 3, &holders, &loads, &moves);
    // The shift of the cluster rows, from there: the moves that undo it.
    let mut shifted = loads.clone();
    let mut by_heat: Vec<usize> = (0..shards).collect();
    by_heat.sort_by(|a, b| loads[*b].cmp(&loads[*a]).then(a.cmp(b)));
    for k in 0..10 {
        shifted.swap(by_heat[1 + k], by_heat[shards - 1 - k]);
    }
    let leaders: Vec<Option<u32>> = (0..shards).map(|s| after.preferred(s)).collect();
    let started = std::time::Instant::now();
    let from = plan_by_load(Some(&after), &hashes, &specs, 3, &leaders, &shifted, &[]);
    let undo = rebalance(&from, &specs, &shifted, &policy, usize::MAX);
    let shift_time = started.elapsed();
    let ratio = |plan: &tenure_shard::Plan| {
        let mut per = vec![0u64; nodes];
        for (s, l) in loads.iter().enumerate() {
            if let Some(n) = plan.preferred(s) {
                per[n as usize] += l;
            }
        }
        let total: u64 = per.iter().sum();
        per.iter().copied().max().unwrap_or(0) as f64 * nodes as f64 / total.max(1) as f64
    };
    let secs = |d: Duration| format!("{:.3} s", d.as_secs_f64());
    println!(
        "| {shards} | {nodes} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} ({}) |",
        ratio(&count),
        ratio(&after),
        lower_bound(&loads, nodes),
        moves.len(),
        secs(place),
        secs(search),
        scan.map_or_else(|| "—".to_string(), secs),
        undo.len(),
        secs(shift_time),
    );
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--search") {
        println!("| shards | nodes | max/mean by count | by load | bound | moves | placement | search (index) | search (scan) | shift: moves (search) |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let given: Vec<usize> = args[1..].iter().filter_map(|a| a.parse().ok()).collect();
        let rows = match given[..] {
            [shards, nodes] => vec![(shards, nodes)],
            _ => vec![
                (10_000, 10),
                (100_000, 10),
                (1_000_000, 10),
                (1_000_000, 100),
            ],
        };
        for (shards, nodes) in rows {
            search_row(shards, nodes, 100_000);
        }
        return;
    }
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10_000]
    } else {
        sizes
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The rows of each size as soon as they are measured (a size can take minutes).
    println!("| scenario | shards | max/mean before | max/mean after | bound | handoffs | time |");
    println!("|---|---|---|---|---|---|---|");
    for p in sizes {
        eprintln!("{p} shards on {NODES} nodes…");
        for r in runtime.block_on(rows(p)) {
            let time = r
                .time
                .map_or_else(|| "—".to_string(), |t| format!("{:.2} s", t.as_secs_f64()));
            println!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {} |",
                r.scenario, r.shards, r.by_count, r.by_load, r.bound, r.moves, time
            );
        }
    }
}
