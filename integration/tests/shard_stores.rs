//! The shard manager's scenarios (`tenure_shard::testing`) against real stores: 64
//! shards, 4 nodes (each its own session and connection), replication 3, TTL 2 s.
//! One server per test; the scenarios run one after another on it with their own
//! namespaces. Time bounds get 1 s of slack for the stores' expiry granularity (etcd
//! checks leases every 500 ms, ZooKeeper expires sessions in tickTime buckets).

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{DynBackend, Timing};
use tenure_etcd::EtcdBackend;
use tenure_integration::{EtcdServer, RedisServer, ZooKeeperServer};
use tenure_redis::RedisBackend;
use tenure_shard::testing::{
    check_cold_start, check_crash, check_drain, check_join, check_quiet, Connect, ShardEnv,
};
use tenure_zookeeper::ZooKeeperBackend;

fn env(connect: Connect) -> ShardEnv {
    let mut timing = Timing::from_ttl(Duration::from_secs(2));
    timing.connect_timeout = Duration::from_secs(2);
    ShardEnv {
        connect,
        timing,
        shards: 64,
        nodes: 4,
        slack: Duration::from_secs(1),
        settle: Duration::from_secs(30),
    }
}

async fn scenarios(env: &ShardEnv) {
    check_cold_start(env).await;
    check_join(env).await;
    check_crash(env).await;
    check_quiet(env, Duration::from_secs(5)).await;
    check_drain(env, Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_etcd() {
    let server = EtcdServer::start().await.expect("start etcd");
    let url = format!(
        "etcd://{}?prefix=tenure-shard-test&connect_timeout_ms=2000&request_timeout_ms=2000",
        server.addr()
    );
    let connect: Connect = Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { Ok(Arc::new(EtcdBackend::from_url(&url).await?) as DynBackend) })
    });
    scenarios(&env(connect)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_redis() {
    let server = RedisServer::start().await.expect("start Redis");
    let endpoint = server.endpoint().to_string();
    let sep = if endpoint.contains('?') { '&' } else { '?' };
    let url = format!(
        "{endpoint}{sep}prefix=tenure-shard-test&connect_timeout_ms=2000&request_timeout_ms=2000"
    );
    let connect: Connect = Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { Ok(Arc::new(RedisBackend::from_url(&url).await?) as DynBackend) })
    });
    scenarios(&env(connect)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_zookeeper() {
    let server = ZooKeeperServer::start().await.expect("start ZooKeeper");
    let url = format!(
        "zk://{}/tenure-shard-test?connect_timeout=2s&request_timeout=2s&session_timeout=2s",
        server.addr()
    );
    let connect: Connect = Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { Ok(Arc::new(ZooKeeperBackend::from_url(&url).await?) as DynBackend) })
    });
    scenarios(&env(connect)).await;
}
