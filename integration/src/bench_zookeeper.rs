//! ZooKeeper figures for the bench table: graceful handover and crash failover through
//! [`bench_backend`], plus a crash that drops the holder's connection at once (as a
//! killed process does), on a local ZooKeeper (tickTime 1000 ms unless given) or a given
//! one.

use std::sync::Arc;
use std::time::Duration;

use tenure_zookeeper::ZooKeeperBackend;

use crate::bench::{
    bench_backend, given_or_local, measure_failover_with, BenchOptions, BenchTable, Figure,
};
use crate::ZooKeeperServer;

/// Measure ZooKeeper: on `endpoint` (`host:port[,host:port…]`) if given, else on a local
/// ZooKeeper started by the harness with `tickTime` = `tick` (default 1000 ms; or the one
/// in `TENURE_TEST_ZOOKEEPER`), stopped afterwards. The TTL of `options.timing` is the
/// session timeout; it must lie within the server's allowed range (2 × tickTime to 20 s
/// here).
pub async fn bench_zookeeper(
    endpoint: Option<&str>,
    tick: Option<Duration>,
    options: &BenchOptions,
) -> Result<BenchTable, String> {
    let start = async {
        match tick {
            Some(t) => ZooKeeperServer::start_with_tick_time(t).await,
            None => ZooKeeperServer::start().await,
        }
    };
    let (server, endpoint, where_) = given_or_local(endpoint, start).await?;
    let backend = ZooKeeperBackend::from_url(&format!("zk://{endpoint}/tenure-bench"))
        .await
        .map_err(|e| format!("connect to ZooKeeper at {endpoint}: {e}"))?;
    let tick_ms = tick.map_or(1000, |t| t.as_millis());
    let ttl = options.timing.ttl;
    let title = format!(
        "ZooKeeper at {endpoint}, {where_} (tickTime {tick_ms} ms if local); session timeout = TTL {ttl:?}"
    );
    let mut table = bench_backend(Arc::new(backend.clone()), &title, options).await?;
    let crash = measure_dropped_connection(&backend, options).await?;
    table.figures.push(Figure {
        name: "crash failover (holder's connection dropped, as by SIGKILL → successor granted)"
            .into(),
        note: format!(
            "session timeout {:?}; the server expires sessions in tickTime buckets",
            options.timing.ttl
        ),
        samples: crash,
    });
    drop(server);
    Ok(table)
}

/// Crash failover as a killed process has it: each run, the holder's session is
/// abandoned and its connection dropped at once (no renewal watchdog involved); the
/// time from the drop to the waiter's grant is recorded. It is the session timeout, less
/// the time since the client last sent anything (it pings every 3/20 of the timeout),
/// plus up to one tickTime.
async fn measure_dropped_connection(
    backend: &ZooKeeperBackend,
    options: &BenchOptions,
) -> Result<Vec<Duration>, String> {
    let dynamic: tenure_core::DynBackend = Arc::new(backend.clone());
    measure_failover_with(&dynamic, options, "crash", |crashing| {
        crashing.abandon();
        backend
            .drop_connection(&crashing.id())
            .map_err(|e| format!("drop connection: {e}"))
    })
    .await
}
