//! The shard manager's benchmark on the in-memory backend:
//! `cargo run --release -p tenure-shard --example bench_shards [-- 1000 10000 100000]`.
//! (`tenure bench` runs it on every reachable store as well.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tenure_core::{DynBackend, MemoryBackend};
use tenure_shard::bench::{assignment_times, markdown, min_med_max_ms, run, BenchConfig};

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

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    let mut results = Vec::new();
    for p in sizes {
        let store = MemoryBackend::new();
        let connect = || {
            let s = store.clone();
            async move { Ok(Arc::new(s) as DynBackend) }
        };
        let probe = || LIVE.load(Ordering::Relaxed);
        let mut cfg = BenchConfig::new(p);
        if p >= 100_000 {
            // Ten nodes of 100,000 shards share this process and its cores: a 2 s TTL
            // leaves too little room for scheduling delays; use the default 10 s.
            cfg.timing = tenure_core::Timing::default();
            cfg.settle_timeout = std::time::Duration::from_secs(300);
        }
        match run("mem", connect, &cfg, Some(&probe)).await {
            Ok(r) => results.push(r),
            Err(e) => eprintln!("P={p}: {e}"),
        }
    }
    println!("{}", markdown(&results));
    let (cold, warm) = assignment_times(10_000, 100, 10);
    println!(
        "assignment of 10,000 shards over 100 nodes (R=3), 10 runs, min / median / max: from scratch {}, with its own holders {}",
        min_med_max_ms(&cold),
        min_med_max_ms(&warm)
    );
}
