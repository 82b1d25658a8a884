//! A sharded worker: every node processes only the shards it leads, and stops a
//! shard's work cleanly the moment it stops leading it (the shard's `lost`
//! token fires on a handoff, a loss or shutdown). Three nodes share 12 shards on the
//! in-memory store; then one node drains and leaves, and its shards move.
//!
//! ```text
//! cargo run --example shards --features shard [-- URL]
//! ```
//!
//! With a URL (first argument or `TENURE_BACKEND`, e.g. `redis://127.0.0.1:6379` with
//! `--features shard,redis`) the nodes use that store; every backend with membership
//! works (mem, etcd, redis, zk, azblob).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::shard::{Layout, ShardEvent, ShardManager};
use tenure::{DynBackend, FencingToken, Timing, WorkGuard};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Items processed per shard, with the token of the grant that processed them: a real
/// store would refuse a write whose token is lower than one it has seen.
type Ledger = Arc<Mutex<BTreeMap<String, (u64, FencingToken)>>>;

/// One shard's work: process an item every 50 ms until the leadership ends.
async fn work(
    node: String,
    shard: String,
    token: FencingToken,
    stop: CancellationToken,
    work: WorkGuard,
    ledger: Ledger,
) {
    println!("  {node}: start {shard} (token {token})");
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                let mut l = ledger.lock().unwrap_or_else(|p| p.into_inner());
                let entry = l.entry(shard.clone()).or_insert((0, token));
                if token < entry.1 {
                    println!("  {node}: refused a stale write to {shard}");
                    break;
                }
                *entry = (entry.0 + 1, token);
            }
        }
    }
    println!("  {node}: stop {shard}");
    // The work is over: a handoff of this shard may now release the seat.
    drop(work);
}

/// Start a node: a manager plus a loop that turns its events into shard tasks.
async fn node(
    backend: &DynBackend,
    layout: &Layout,
    id: &str,
    ledger: &Ledger,
) -> tenure::Result<(ShardManager, tokio::task::JoinHandle<()>)> {
    let (manager, mut events) = ShardManager::builder(backend.clone())
        .layout(layout.clone())
        .node_id(id)
        .timing(Timing::from_ttl(Duration::from_secs(2)))
        .start()
        .await?;
    let (id, ledger) = (id.to_string(), ledger.clone());
    let worker = tokio::spawn(async move {
        let mut tasks = JoinSet::new();
        while let Some(event) = events.recv().await {
            match event {
                ShardEvent::Acquired {
                    shard,
                    token,
                    stop,
                    work: guard,
                    ..
                } => {
                    tasks.spawn(work(
                        id.clone(),
                        shard.name().to_string(),
                        token,
                        stop,
                        guard,
                        ledger.clone(),
                    ));
                }
                // The shard's task saw its `stop` token fire and ended before the
                // seat was released.
                ShardEvent::HandedOff { shard, to, .. } => {
                    println!(
                        "  {id}: handed {shard} to {}",
                        to.as_deref().unwrap_or("nobody")
                    );
                }
                ShardEvent::Lost { shard, reason, .. } => {
                    println!("  {id}: lost {shard}: {reason}")
                }
            }
        }
        // The manager closed: every shard task has been cancelled; wait for them.
        while tasks.join_next().await.is_some() {}
    });
    Ok((manager, worker))
}

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::backend_url();
    let backend = tenure::connect(&url).await?;
    let layout = Layout::new(&format!("orders-{}", std::process::id()), 12, 2)?;
    let ledger: Ledger = Arc::default();
    println!("3 nodes share 12 shards on {url}");
    let mut nodes = Vec::new();
    for id in ["node-a", "node-b", "node-c"] {
        nodes.push((id, node(&backend, &layout, id, &ledger).await?));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, (m, _)) in &nodes {
        let held: Vec<String> = m.held().iter().map(|(s, _)| s.name().to_string()).collect();
        println!("{id} leads {}", held.join(" "));
    }

    println!("node-b drains and leaves");
    let (_, (b, b_worker)) = nodes.remove(1);
    b.drain().await?;
    b.close().await?;
    let _ = b_worker.await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, (m, _)) in &nodes {
        println!("{id} leads {} shards", m.held().len());
    }

    println!("shutting down");
    for (_, (m, worker)) in nodes {
        m.close().await?;
        let _ = worker.await;
    }
    let ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    let total: u64 = ledger.values().map(|(n, _)| n).sum();
    println!(
        "{total} items processed over {} shards; no shard was worked on by two nodes at once",
        ledger.len()
    );
    Ok(())
}
