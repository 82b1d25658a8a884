//! The shard-level chaos check (`tenure_integration::shard_chaos`), one store per test:
//! five `tenure shards run` nodes share 24 shards (replication 3, TTL 2 s), each led
//! shard's command writes its token to a fenced resource, and a seeded nemesis kills,
//! freezes (past the TTL and within it) and drains nodes and pauses and restarts the
//! store for about 25 s (always one full round of every fault kind). Every shard's
//! history from the nodes' event lines then goes through the chaos module's
//! per-election checker: no overlapping tenures, tokens increasing in grant order, no
//! stale write accepted, every `acquired` ended by one `handed_off` or `lost` (unless
//! the node was SIGKILLed), every drained node drained.
//!
//! The tests run one at a time (the module holds a lock), about 35 s each. A missing
//! store program fails the test, naming the install script.
//!
//! - `TENURE_SHARD_CHAOS_SECS` (`120`, `90s`, `30m`): a longer nemesis;
//!   `TENURE_SHARD_CHAOS_SEED`: another seed, or a replay of a printed one.
//! - The soaks are `#[ignore]`d: 120 s of nemesis per store, a seed from the clock
//!   (printed first) unless `TENURE_SHARD_CHAOS_SEED` is set:
//!   `cargo test -p tenure-integration --test shard_chaos -- --ignored --nocapture`.

use std::time::Duration;

use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::shard_chaos::assert_shard_chaos;
use tenure_integration::ChaosBackend;

/// The nemesis of a bounded run (it always completes its first round of six faults).
const BOUNDED: Duration = Duration::from_secs(25);

/// The nemesis of a soak.
const SOAK: Duration = Duration::from_secs(120);

async fn bounded(backend: ChaosBackend, seed: u64) {
    assert_shard_chaos(backend, tenure_bin(), BOUNDED, Some(seed)).await;
}

async fn soak(backend: ChaosBackend) {
    assert_shard_chaos(backend, tenure_bin(), SOAK, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_chaos_etcd() {
    bounded(ChaosBackend::Etcd, 3701).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_chaos_redis() {
    bounded(ChaosBackend::Redis, 3702).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_chaos_zookeeper() {
    bounded(ChaosBackend::ZooKeeper, 3703).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_chaos_postgres() {
    bounded(ChaosBackend::Postgres, 3704).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: 120 s of nemesis; run with --ignored"]
async fn shard_chaos_soak_etcd() {
    soak(ChaosBackend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: 120 s of nemesis; run with --ignored"]
async fn shard_chaos_soak_redis() {
    soak(ChaosBackend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: 120 s of nemesis; run with --ignored"]
async fn shard_chaos_soak_zookeeper() {
    soak(ChaosBackend::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: 120 s of nemesis; run with --ignored"]
async fn shard_chaos_soak_postgres() {
    soak(ChaosBackend::Postgres).await;
}
