//! The shard manager's benchmark on the in-memory backend:
//! `cargo run --release -p tenure-shard --example bench_shards [-- 1000 10000 100000 100000x100] [--svg FILE]`
//! (`PxN`: P shards on N nodes; 10 nodes otherwise; TTL 10 s from P × N = 10^6 on).
//! (`tenure bench` runs it on every reachable store as well.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tenure_core::{DynBackend, MemoryBackend};
use tenure_shard::bench::{
    assignment_times, markdown, min_med_max_ms, run, scaling_svg, BenchConfig,
};

/// Counts live heap bytes, for the memory-per-shard figure.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator and only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One run: `P` shards on 10 nodes, or `PxN` for N nodes.
fn parse_run(arg: &str) -> Option<(usize, usize)> {
    match arg.split_once('x') {
        Some((p, n)) => Some((p.parse().ok()?, n.parse().ok()?)),
        None => Some((arg.parse().ok()?, 10)),
    }
}

#[tokio::main]
async fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let svg = match args.iter().position(|a| a == "--svg") {
        Some(i) if i + 1 < args.len() => {
            let path = args.remove(i + 1);
            args.remove(i);
            Some(path)
        }
        _ => None,
    };
    let mut runs = Vec::new();
    for a in &args {
        match parse_run(a) {
            Some(run) => runs.push(run),
            None => {
                eprintln!("bench_shards: {a:?}: expected SHARDS or SHARDSxNODES, e.g. 100000x100");
                std::process::exit(2);
            }
        }
    }
    if runs.is_empty() {
        runs = vec![(1_000, 10), (10_000, 10), (100_000, 10)];
    }
    let mut results = Vec::new();
    for (p, n) in runs {
        let store = MemoryBackend::new();
        let connect = || {
            let s = store.clone();
            async move { Ok(Arc::new(s) as DynBackend) }
        };
        let probe = || LIVE.load(Ordering::Relaxed);
        let cfg = BenchConfig::with_nodes(p, n);
        match run("mem", connect, &cfg, Some(&probe)).await {
            Ok(r) => {
                eprintln!("{}", markdown(std::slice::from_ref(&r)));
                results.push(r)
            }
            Err(e) => eprintln!("P={p} N={n}: {e}"),
        }
    }
    println!("{}", markdown(&results));
    if let Some(path) = svg {
        if let Err(e) = std::fs::write(&path, scaling_svg(&results)) {
            eprintln!("bench_shards: could not write {path}: {e}");
        }
    }
    let (cold, warm) = assignment_times(10_000, 100, 10);
    println!(
        "assignment of 10,000 shards over 100 nodes (R=3), 10 runs, min / median / max: from scratch {}, with its own holders {}",
        min_med_max_ms(&cold),
        min_med_max_ms(&warm)
    );
}
