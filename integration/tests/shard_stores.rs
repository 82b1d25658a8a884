//! The shard manager's scenarios (`tenure_shard::testing`) against real stores: 64
//! shards, 4 nodes (each its own session and connection), replication 3, TTL 2 s.
//! One server per test; the scenarios run one after another on it with their own
//! namespaces. Time bounds get 1 s of slack for the stores' expiry granularity (etcd
//! checks leases every 500 ms, ZooKeeper expires sessions in tickTime buckets). Azure
//! (Azurite) grants leases of 15 s at least and its waiters poll (100 ms here), so its
//! run uses a 15 s TTL and 1 s of extra handoff gap.

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::{DynBackend, Timing};
use tenure_integration::{AzuriteServer, EtcdServer, PostgresServer, RedisServer, ZooKeeperServer};
use tenure_shard::testing::{
    check_cold_start, check_crash, check_drain, check_join, check_load_noise, check_load_zipf,
    check_move_budget, check_quiet, Connect, ShardEnv,
};

/// The query of 2 s connect and request timeouts.
const TIMEOUTS: &str = "connect_timeout_ms=2000&request_timeout_ms=2000";

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
        namespace: None,
    }
}

/// Every scenario, each node connecting by `url` (through the facade, as an
/// application does).
async fn on_url(url: String, by_load: bool) {
    let env = env(Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { tenure::connect(&url).await })
    }));
    scenarios(&env, Duration::from_millis(500)).await;
    if by_load {
        // Balance by load at a smaller scale than in memory: Zipf loads over 200
        // shards on 5 nodes.
        let mut env = env.clone();
        env.shards = 200;
        env.nodes = 5;
        let (by_count, by_load, bound, moves) = check_load_zipf(&env, Duration::from_secs(1)).await;
        eprintln!("zipf 1.1: max/mean {by_count:.3} by count, {by_load:.3} by load (bound {bound:.3}), {moves} moves");
        let moves = check_load_noise(&env, Duration::from_secs(10)).await;
        eprintln!("noise: {moves} moves in 10 s");
        let most = check_move_budget(&env, 5).await;
        eprintln!("budget 5/s: at most {most} handoffs in a window");
    }
}

/// Every scenario, `drain` being the drain check's handoff gap.
async fn scenarios(env: &ShardEnv, drain: Duration) {
    check_cold_start(env).await;
    check_join(env).await;
    check_crash(env).await;
    check_quiet(env, Duration::from_secs(5)).await;
    check_drain(env, drain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_etcd() {
    let server = EtcdServer::start().await.expect("start etcd");
    let url = format!(
        "etcd://{}?prefix=tenure-shard-test&{TIMEOUTS}",
        server.addr()
    );
    on_url(url, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_redis() {
    let server = RedisServer::start().await.expect("start Redis");
    let query = format!("prefix=tenure-shard-test&{TIMEOUTS}");
    let url = tenure_integration::with_query(server.endpoint(), &query);
    on_url(url, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_postgres() {
    let server = PostgresServer::start().await.expect("start PostgreSQL");
    let query = format!("schema=tenure_shard_test&{TIMEOUTS}");
    let url = tenure_integration::with_query(server.endpoint(), &query);
    on_url(url, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_zookeeper() {
    let server = ZooKeeperServer::start().await.expect("start ZooKeeper");
    let url = format!(
        "zk://{}/tenure-shard-test?connect_timeout=2s&request_timeout=2s&session_timeout=2s",
        server.addr()
    );
    on_url(url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_manager_on_azurite() {
    let server = AzuriteServer::start().await.expect("start Azurite");
    let endpoint = server.endpoint().to_string();
    let container = tenure_core::testing::random_prefix().to_ascii_lowercase();
    let mut env = env(Arc::new(move || {
        let config = AzureConfig::development(&endpoint, &container)
            .poll_interval(Duration::from_millis(100))
            .connect_timeout(Duration::from_secs(5))
            .request_timeout(Duration::from_secs(5));
        Box::pin(async move { Ok(Arc::new(AzureBackend::connect(config).await?) as DynBackend) })
    }));
    env.timing = Timing::from_ttl(Duration::from_secs(15));
    env.timing.renew_interval = Duration::from_secs(3);
    env.timing.renew_deadline = Duration::from_secs(10);
    env.timing.connect_timeout = Duration::from_secs(5);
    env.slack = Duration::from_secs(2);
    env.settle = Duration::from_secs(60);
    scenarios(&env, Duration::from_millis(1000)).await;
}
