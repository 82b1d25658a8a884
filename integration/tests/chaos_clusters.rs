//! Bounded chaos runs on the clustered stores, one round of every fault kind each (about
//! a minute with a 5 s TTL), one run at a time: each runs three to six store processes.
//! The overrides are those of `tests/chaos.rs`.

use std::time::Duration;

use tenure_integration::chaos::assert_bounded_run;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::ChaosBackend;

/// Ends a one-round run that hangs; a round takes about a minute.
const ONE_ROUND_LIMIT: Duration = Duration::from_secs(4 * 60);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn chaos(backend: ChaosBackend) {
    let _serial = SERIAL.lock().await;
    assert_bounded_run(backend, tenure_bin(), ONE_ROUND_LIMIT, Some(1)).await;
}

tenure_integration::chaos_tests!(chaos: chaos_etcd_cluster => EtcdCluster,
    chaos_zookeeper_ensemble => ZooKeeperEnsemble, chaos_redis_sentinel => RedisSentinel);
