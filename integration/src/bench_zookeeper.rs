//! ZooKeeper figures for the bench table: graceful handover and crash failover through
//! [`bench_backend`] on a local ZooKeeper (tickTime 1000 ms) or a given one.

use std::sync::Arc;

use crate::bench::{bench_backend, BenchOptions, BenchTable};
use crate::ZooKeeperServer;

/// Measure ZooKeeper: on `endpoint` (`host:port[,host:port…]`) if given, else on a local
/// ZooKeeper started by the harness (or the one in `TENURE_TEST_ZOOKEEPER`), stopped
/// afterwards. The TTL of `options.timing` is the session timeout; it must lie within the
/// server's `[2, 20] × tickTime`.
pub async fn bench_zookeeper(
    endpoint: Option<&str>,
    options: &BenchOptions,
) -> Result<BenchTable, String> {
    let (server, endpoint) = match endpoint {
        Some(e) => (None, e.to_string()),
        None => {
            let server = ZooKeeperServer::start().await.map_err(|e| e.to_string())?;
            let e = server.endpoint().to_string();
            (Some(server), e)
        }
    };
    let backend =
        tenure_zookeeper::ZooKeeperBackend::from_url(&format!("zk://{endpoint}/tenure-bench"))
            .await
            .map_err(|e| format!("connect to ZooKeeper at {endpoint}: {e}"))?;
    let where_ = match &server {
        Some(_) => "a local ZooKeeper 3.8 started by the harness (loopback, tickTime 1000 ms)",
        None => "the given ZooKeeper",
    };
    let table = bench_backend(
        Arc::new(backend),
        &format!(
            "ZooKeeper at {endpoint}, {where_}; session timeout = TTL {:?}",
            options.timing.ttl
        ),
        options,
    )
    .await?;
    drop(server);
    Ok(table)
}
