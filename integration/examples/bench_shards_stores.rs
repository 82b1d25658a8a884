//! The shard manager's benchmark on real stores started by the harness (etcd, Redis,
//! ZooKeeper), 10 nodes, replication 3, TTL 2 s:
//! `cargo run --release -p tenure-integration --example bench_shards_stores [-- 1000 10000]`.
//! Each node has its own connection; "store requests/s" counts every request of every
//! node in a 5 s quiet stretch (renewals included, watch streams once when opened).

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{DynBackend, Result};
use tenure_etcd::EtcdBackend;
use tenure_integration::{EtcdServer, RedisServer, ZooKeeperServer};
use tenure_redis::RedisBackend;
use tenure_shard::bench::{markdown, run, BenchConfig, BenchResult};
use tenure_zookeeper::ZooKeeperBackend;

async fn on<F, Fut>(name: &str, sizes: &[usize], connect: F, out: &mut Vec<BenchResult>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<DynBackend>>,
{
    if let Ok(only) = std::env::var("TENURE_BENCH_ONLY") {
        if !only.split(',').any(|b| b == name) {
            return;
        }
    }
    for &p in sizes {
        let mut cfg = BenchConfig::new(p);
        cfg.timing.connect_timeout = Duration::from_secs(5);
        match run(name, &connect, &cfg, None).await {
            Ok(r) => {
                eprintln!("{}", markdown(std::slice::from_ref(&r)));
                out.push(r)
            }
            Err(e) => eprintln!("{name} P={p}: {e}"),
        }
    }
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        sizes
    };
    let mut results = Vec::new();

    match EtcdServer::start().await {
        Ok(server) => {
            let url = format!(
                "etcd://{}?prefix=bench&connect_timeout_ms=5000&request_timeout_ms=5000",
                server.addr()
            );
            on(
                "etcd",
                &sizes,
                || async { Ok(Arc::new(EtcdBackend::from_url(&url).await?) as DynBackend) },
                &mut results,
            )
            .await;
        }
        Err(e) => eprintln!("etcd: not started: {e}"),
    }
    match RedisServer::start().await {
        Ok(server) => {
            let endpoint = server.endpoint().to_string();
            let sep = if endpoint.contains('?') { '&' } else { '?' };
            let url = format!(
                "{endpoint}{sep}prefix=bench&connect_timeout_ms=5000&request_timeout_ms=5000"
            );
            on(
                "redis",
                &sizes,
                || async { Ok(Arc::new(RedisBackend::from_url(&url).await?) as DynBackend) },
                &mut results,
            )
            .await;
        }
        Err(e) => eprintln!("redis: not started: {e}"),
    }
    match ZooKeeperServer::start().await {
        Ok(server) => {
            let url = format!(
                "zk://{}/bench?connect_timeout=5s&request_timeout=5s&session_timeout=2s",
                server.addr()
            );
            on(
                "zookeeper",
                &sizes,
                || async { Ok(Arc::new(ZooKeeperBackend::from_url(&url).await?) as DynBackend) },
                &mut results,
            )
            .await;
        }
        Err(e) => eprintln!("zookeeper: not started: {e}"),
    }
    println!("{}", markdown(&results));
}
