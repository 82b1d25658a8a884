//! Bounded chaos runs, one per backend: three `tenure campaign` processes against a
//! real store (or a three-node `peer://` cluster), seeded random faults of every kind
//! the backend has for about a minute, then the safety check: no overlapping tenures,
//! increasing tokens, no stale write accepted (Redis: overlaps across a restart without
//! persistence are its documented limit; stale writes must still be zero).
//!
//! `TENURE_CHAOS_DURATION` (e.g. `10s`, `30m`) and `TENURE_CHAOS_SEED` override the
//! duration and the seed; the seed is printed at the start of each run. For soak runs
//! use the `tenure-chaos` binary (docs/reliability.md).

use std::time::Duration;

use tenure_integration::chaos::parse_duration;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::{run_chaos, ChaosBackend, ChaosOptions};

/// Faults are injected this long unless `TENURE_CHAOS_DURATION` says otherwise.
const DEFAULT_DURATION: Duration = Duration::from_secs(60);

async fn chaos(backend: ChaosBackend) {
    let mut options = ChaosOptions::new(backend, tenure_bin());
    options.duration = match std::env::var("TENURE_CHAOS_DURATION") {
        Ok(d) => parse_duration(&d).expect("TENURE_CHAOS_DURATION"),
        Err(_) => DEFAULT_DURATION,
    };
    if let Ok(seed) = std::env::var("TENURE_CHAOS_SEED") {
        options.seed = seed.trim().parse().expect("TENURE_CHAOS_SEED is a number");
    }
    let duration = options.duration;
    let report = run_chaos(options).await.expect("chaos run");
    eprintln!("{report}");
    assert!(
        report.passed(),
        "{report}\nfaults:\n{}",
        report.fault_log.join("\n")
    );
    assert!(report.grants >= 2, "fewer than two grants:\n{report}");
    if duration >= DEFAULT_DURATION {
        for kind in backend.faults() {
            assert!(
                report.faults.get(kind).copied().unwrap_or(0) > 0,
                "{kind} was never injected:\n{report}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_etcd() {
    chaos(ChaosBackend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_redis() {
    chaos(ChaosBackend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_zookeeper() {
    chaos(ChaosBackend::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_peer_quorum() {
    chaos(ChaosBackend::Peer).await;
}
