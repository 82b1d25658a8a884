//! Bounded chaos runs (`chaos::run_chaos`), one per backend: three `tenure campaign`
//! processes against a real store (or a three-node `peer://` cluster) under one round of
//! every fault kind in seeded random order (about half a minute at TTL 2 s; Azure, with
//! 15 s leases, three to five minutes), then the safety check. Longer runs are soaks. `TENURE_CHAOS_DURATION`
//! and `TENURE_CHAOS_SEED` override duration and seed (`assert_bounded_run`); soak runs use
//! the `tenure-chaos` binary (docs/reliability.md).

use std::time::Duration;

use tenure_integration::chaos::assert_bounded_run;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::ChaosBackend;

/// The bound of a one-round run at TTL 2 s; this only ends a run that hangs.
const ROUND_LIMIT: Duration = Duration::from_secs(3 * 60);

/// The bound of a one-round run (Azure): a round's worst case with 15 s leases is
/// about five minutes; this only ends a run that hangs.
const ONE_ROUND_LIMIT: Duration = Duration::from_secs(8 * 60);

async fn chaos(backend: ChaosBackend) {
    assert_bounded_run(backend, tenure_bin(), ROUND_LIMIT, Some(1)).await;
}

/// One round of every fault kind, in seeded order.
async fn one_round(backend: ChaosBackend) {
    assert_bounded_run(backend, tenure_bin(), ONE_ROUND_LIMIT, Some(1)).await;
}

tenure_integration::chaos_tests!(chaos: chaos_etcd => Etcd, chaos_redis => Redis,
    chaos_zookeeper => ZooKeeper, chaos_peer_quorum => Peer, chaos_postgres => Postgres);
tenure_integration::chaos_tests!(one_round: chaos_azure => Azure);
