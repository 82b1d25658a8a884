//! The shard manager's benchmark on real stores started by the harness (etcd, Redis,
//! ZooKeeper, PostgreSQL), 10 nodes, replication 3, TTL 2 s (10 s from 100,000 shards, see
//! `BenchConfig::with_nodes`; ZooKeeper with tickTime 200 ms):
//! `cargo run --release -p tenure-integration --example bench_shards_stores [-- 1000 10000]`.
//! Each node has its own connection; "store requests/s" counts every request of every
//! node in a 5 s quiet stretch (renewals included, watch streams once when opened).

use std::time::Duration;

use tenure_integration::{
    with_query, EtcdServer, PostgresServer, RedisServer, StoreServer, ZooKeeperServer,
};
use tenure_shard::bench::{markdown, run, BenchConfig};

/// The local ZooKeeper's `tickTime` (session timeouts from 0.4 s to 20 s).
const ZK_TICK: Duration = Duration::from_millis(200);

#[tokio::main]
async fn main() {
    // RUST_LOG=warn (for example) shows what the nodes log while they run.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let mut sizes: Vec<usize> = std::env::args().filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000];
    }
    let only = std::env::var("TENURE_BENCH_ONLY").ok();
    let timeouts = "connect_timeout_ms=5000&request_timeout_ms=5000";
    let mut results = Vec::new();
    for name in ["etcd", "redis", "zookeeper", "postgres"] {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|b| b == name))
        {
            continue;
        }
        let server: tenure_integration::Result<StoreServer> = match name {
            "etcd" => EtcdServer::start().await.map(Into::into),
            "redis" => RedisServer::start().await.map(Into::into),
            "postgres" => PostgresServer::start().await.map(Into::into),
            // A 200 ms tick: ZooKeeper expires sessions in tick buckets, and with its
            // default here (1 s) the expiry alone took up to TTL + 1 s after a crash.
            _ => ZooKeeperServer::start_with_tick_time(ZK_TICK)
                .await
                .map(Into::into),
        };
        let server = match server {
            Ok(server) => server,
            Err(e) => {
                eprintln!("{name}: not started: {e}");
                continue;
            }
        };
        let (addr, endpoint) = (server.addr(), server.endpoint());
        for &p in &sizes {
            let mut cfg = BenchConfig::new(p);
            cfg.timing.connect_timeout = Duration::from_secs(5);
            let ttl = cfg.timing.ttl.as_secs();
            let url = match name {
                "etcd" => format!("etcd://{addr}?prefix=bench&{timeouts}"),
                "redis" => with_query(endpoint, &format!("prefix=bench&{timeouts}")),
                "postgres" => with_query(endpoint, &format!("schema=bench&{timeouts}")),
                _ => format!(
                    "zk://{addr}/bench?connect_timeout=5s&request_timeout=5s&session_timeout={ttl}s"
                ),
            };
            match run(name, || tenure::connect(&url), &cfg, None).await {
                Ok(r) => {
                    eprintln!("{}", markdown(std::slice::from_ref(&r)));
                    results.push(r)
                }
                Err(e) => eprintln!("{name} P={p}: {e}"),
            }
        }
    }
    println!("{}", markdown(&results));
}
