//! Random crash/restart/partition schedules in the simulator.
//!
//! Every run is reproducible from its seed, printed on failure. Run one seed
//! alone with `TENURE_SIM_SEED=<seed> cargo test -p tenure-peer --test
//! random_schedules`; run more seeds per algorithm with `TENURE_SIM_RUNS=<n>`.

mod common;

use std::time::Duration;

use common::{check_agreement, check_terms, detected, guarded, ids, Machine};
use proptest::prelude::*;
use tenure_peer::sim::{Network, SimRng, Simulation};
use tenure_peer::PeerAlgorithm;
use tenure_peer::PeerId;

/// Seeds per algorithm in the seeded loop.
const SEEDS_PER_ALGO: u64 = 200;

/// Builds and runs one random schedule of the quorum-guarded `algo`.
fn run_schedule(algo: PeerAlgorithm, seed: u64) -> Simulation<Machine> {
    run_schedule_with(seed, false, |n| Box::new(guarded(algo, n)))
}

type Factory = Box<dyn FnMut(PeerId) -> Machine>;

/// Builds and runs one random schedule; returns the simulation at the end. With
/// `forget`, a restarted host does not get its durable state back.
fn run_schedule_with(
    seed: u64,
    forget: bool,
    factory: impl Fn(u64) -> Factory,
) -> Simulation<Machine> {
    let mut plan = SimRng::new(seed ^ 0x5EED_5EED);
    let n = 3 + plan.below(3); // 3..=5 hosts
    let hosts = ids(n);
    let loss = [0, 0, 10_000, 50_000][plan.below(4) as usize];
    let network = Network {
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1 + plan.below(30)),
        loss_per_million: loss,
    };
    let mut sim = Simulation::new(seed, hosts.clone(), factory(n)).with_network(network);
    sim.start_all();
    for _ in 0..30 {
        sim.run_for(Duration::from_millis(50 + plan.below(1500)));
        let host = hosts[plan.below(n) as usize];
        match plan.below(6) {
            0 | 1 if forget => {
                // Back at once, having forgotten what it promised just before.
                sim.crash(host);
                sim.run_for(Duration::from_millis(1 + plan.below(20)));
                sim.restart_forgetting(host);
            }
            0 | 1 => sim.crash(host),
            2 if forget => sim.restart_forgetting(host),
            2 => sim.restart(host),
            3 => {
                let mut side = Vec::new();
                let mut rest = Vec::new();
                for h in &hosts {
                    if plan.below(2) == 0 {
                        side.push(*h);
                    } else {
                        rest.push(*h);
                    }
                }
                sim.partition(&side, &rest);
            }
            4 => sim.repair(),
            _ => sim.isolate(host),
        }
    }
    sim
}

/// Repairs every partition, makes the network reliable, restarts every host
/// and runs 30 s more.
fn heal(sim: &mut Simulation<Machine>) {
    sim.repair();
    sim.set_network(Network::default());
    let hosts: Vec<PeerId> = sim.hosts().collect();
    for h in hosts {
        sim.restart(h);
    }
    sim.run_for(Duration::from_secs(30));
}

/// Seeds per algorithm: `TENURE_SIM_RUNS`, or [`SEEDS_PER_ALGO`].
fn runs_per_algo() -> u64 {
    std::env::var("TENURE_SIM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEEDS_PER_ALGO)
}

/// Safety over the whole run; liveness once everything is healed.
fn check_run(algo: PeerAlgorithm, seed: u64) -> Result<(), String> {
    let mut sim = run_schedule(algo, seed);
    check_terms(&sim.terms()).map_err(|e| format!("during the schedule: {e}"))?;
    heal(&mut sim);
    check_terms(&sim.terms()).map_err(|e| format!("after healing: {e}"))?;
    let leader = check_agreement(&sim).map_err(|e| format!("after healing: {e}"))?;
    let leaders = sim.self_leaders();
    if leaders.len() != 1 || leaders[0].0 != leader {
        return Err(format!("after healing: self-leaders {leaders:?}"));
    }
    Ok(())
}

/// Plain algorithms promise liveness only: once every host is up and
/// connected, all agree on one leader.
fn check_plain_run(algo: PeerAlgorithm, seed: u64) -> Result<(), String> {
    let mut sim = run_schedule_with(seed, false, |n| Box::new(detected(algo, n)));
    heal(&mut sim);
    check_agreement(&sim).map(|_| ())
}

#[test]
fn plain_algorithms_agree_once_healed() {
    let runs = runs_per_algo();
    for algo in PeerAlgorithm::ALL {
        for i in 0..runs {
            let seed = 0xBEEF + i;
            if let Err(e) = check_plain_run(algo, seed) {
                panic!("{algo:?}, seed {seed}: {e}");
            }
        }
    }
}

fn report(algo: PeerAlgorithm, seed: u64) {
    if let Err(e) = check_run(algo, seed) {
        panic!(
            "{algo:?}, seed {seed}: {e}\n  rerun: TENURE_SIM_SEED={seed} cargo test -p tenure-peer --test random_schedules"
        );
    }
}

#[test]
fn quorum_mode_is_safe_under_random_schedules() {
    if let Ok(seed) = std::env::var("TENURE_SIM_SEED") {
        let seed: u64 = seed.parse().expect("TENURE_SIM_SEED is a u64");
        for algo in PeerAlgorithm::ALL {
            report(algo, seed);
        }
        return;
    }
    let runs = runs_per_algo();
    for algo in PeerAlgorithm::ALL {
        for i in 0..runs {
            report(algo, 0xC0FFEE + i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn quorum_mode_is_safe_for_any_seed(seed in any::<u64>(), which in 0..PeerAlgorithm::ALL.len()) {
        let algo = PeerAlgorithm::ALL[which];
        let result = check_run(algo, seed);
        prop_assert!(result.is_ok(), "{:?}, seed {}: {:?}", algo, seed, result);
    }
}

/// Restarts that forget every promise (a `peer://` node without `state=`): epochs
/// may then repeat or go back, as documented, but a restarted host refuses everyone
/// for one lease, so no two hosts may ever lead at the same instant.
#[test]
fn quorum_mode_never_overlaps_when_restarts_forget() {
    let runs = runs_per_algo();
    for algo in PeerAlgorithm::ALL {
        for i in 0..runs {
            let seed = 0xF0E7 + i;
            let sim = run_schedule_with(seed, true, |n| Box::new(guarded(algo, n)));
            let terms = sim.terms();
            for (k, a) in terms.iter().enumerate() {
                for b in &terms[k + 1..] {
                    assert!(
                        !a.overlaps(b),
                        "{algo:?}, seed {seed}: overlapping leaderships {a:?} and {b:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    for algo in PeerAlgorithm::ALL {
        let a = run_schedule(algo, 7);
        let b = run_schedule(algo, 7);
        assert_eq!(a.fingerprint(), b.fingerprint(), "{algo:?}");
        assert_eq!(a.log(), b.log(), "{algo:?}");
        assert_eq!(a.stats(), b.stats(), "{algo:?}");
        assert_eq!(a.now(), b.now(), "{algo:?}");
        let c = run_schedule(algo, 8);
        assert_ne!(a.fingerprint(), c.fingerprint(), "{algo:?}");
    }
}
