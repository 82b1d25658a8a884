//! Bounded chaos runs, one per backend: three `tenure campaign` processes against a
//! real store (or a three-node `peer://` cluster), seeded random faults of every kind
//! the backend has for about a minute, then the safety check: no overlapping tenures,
//! increasing tokens, no stale write accepted (Redis: overlaps across a restart without
//! persistence are its documented limit; stale writes must still be zero).
//!
//! Azure (Azurite) leases last at least 15 s, so its run is one round instead: every
//! fault kind once, in seeded order, which takes about three to five minutes.
//!
//! `TENURE_CHAOS_DURATION` (e.g. `10s`, `30m`) and `TENURE_CHAOS_SEED` override the
//! duration and the seed (with a duration given, the Azure run is bounded by it instead
//! of by one round); the seed is printed at the start of each run. For soak runs use
//! the `tenure-chaos` binary (docs/reliability.md).

use std::time::Duration;

use tenure_integration::chaos::parse_duration;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::{run_chaos, ChaosBackend, ChaosOptions};

/// Faults are injected this long unless `TENURE_CHAOS_DURATION` says otherwise.
const DEFAULT_DURATION: Duration = Duration::from_secs(60);

/// The bound of a one-round run (Azure): a round's worst case with 15 s leases is
/// about five minutes; this only ends a run that hangs.
const ONE_ROUND_LIMIT: Duration = Duration::from_secs(8 * 60);

async fn chaos(backend: ChaosBackend) {
    chaos_with(backend, None).await;
}

/// Runs `backend` for the default duration, or, with `rounds`, for that many rounds of
/// every fault kind.
async fn chaos_with(backend: ChaosBackend, rounds: Option<usize>) {
    let mut options = ChaosOptions::new(backend, tenure_bin());
    let given = std::env::var("TENURE_CHAOS_DURATION").ok();
    options.duration = match (&given, rounds) {
        (Some(d), _) => parse_duration(d).expect("TENURE_CHAOS_DURATION"),
        (None, Some(_)) => ONE_ROUND_LIMIT,
        (None, None) => DEFAULT_DURATION,
    };
    if given.is_none() {
        options.rounds = rounds;
    }
    // Every fault kind must have been injected in a run of the default length (or
    // round); a shorter or one-round-less override may miss some.
    let full = given.is_none() || (rounds.is_none() && options.duration >= DEFAULT_DURATION);
    if let Ok(seed) = std::env::var("TENURE_CHAOS_SEED") {
        options.seed = seed.trim().parse().expect("TENURE_CHAOS_SEED is a number");
    }
    let report = run_chaos(options).await.expect("chaos run");
    eprintln!("{report}");
    eprintln!("leadership events:\n{}", report.timeline.join("\n"));
    if !report.passed() {
        for (label, tail) in &report.stderr {
            eprintln!("--- stderr of {label}:\n{tail}");
        }
    }
    assert!(
        report.passed(),
        "{report}\nfaults:\n{}\nleadership events:\n{}",
        report.fault_log.join("\n"),
        report.timeline.join("\n")
    );
    assert!(report.grants >= 2, "fewer than two grants:\n{report}");
    if full {
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

/// One round of every fault kind against Azurite with 15 s leases: the holder killed
/// and stopped past its lease, Azurite stopped past the renew deadline and restarted,
/// a candidate's connection cut and blackholed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_azure() {
    chaos_with(ChaosBackend::Azure, Some(1)).await;
}
