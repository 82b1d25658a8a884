//! Split brain under a partition, and the quorum guard preventing it.

mod common;

use std::time::Duration;

use common::{check_agreement, check_terms, detected, guarded, ids};
use tenure_peer::sim::Simulation;
use tenure_peer::PeerAlgorithm;
use tenure_peer::{PeerId, Timing};

const SEED: u64 = 42;
const MAJORITY: [PeerId; 3] = [PeerId(1), PeerId(2), PeerId(3)];
const MINORITY: [PeerId; 2] = [PeerId(4), PeerId(5)];

#[test]
fn plain_bully_elects_two_leaders_across_a_partition() {
    let mut sim = Simulation::new(SEED, ids(5), detected(PeerAlgorithm::Bully, 5));
    sim.start_all();
    sim.run_for(Duration::from_secs(3));
    assert_eq!(check_agreement(&sim), Ok(PeerId(5)), "seed {SEED}");

    sim.partition(&MAJORITY, &MINORITY);
    sim.run_for(Duration::from_secs(5));
    let leaders: Vec<PeerId> = sim.self_leaders().into_iter().map(|(h, _)| h).collect();
    // Split brain: 3 leads the majority side while 5 still leads the minority.
    assert_eq!(leaders, [PeerId(3), PeerId(5)], "seed {SEED}");
    for h in MAJORITY {
        assert_eq!(
            sim.leader_of(h).map(|l| l.id),
            Some(PeerId(3)),
            "seed {SEED}"
        );
    }
    assert_eq!(
        sim.leader_of(PeerId(4)).map(|l| l.id),
        Some(PeerId(5)),
        "seed {SEED}"
    );

    // Healing lets the two leaders' heartbeats meet; they settle on 5.
    sim.repair();
    sim.run_for(Duration::from_secs(5));
    assert_eq!(check_agreement(&sim), Ok(PeerId(5)), "seed {SEED}");
}

#[test]
fn every_plain_algorithm_splits_under_a_partition() {
    for algo in PeerAlgorithm::ALL {
        let mut sim = Simulation::new(SEED, ids(5), detected(algo, 5));
        sim.start_all();
        sim.run_for(Duration::from_secs(8));
        sim.partition(&MAJORITY, &MINORITY);
        sim.run_for(Duration::from_secs(8));
        let leaders = sim.self_leaders();
        let on = |side: &[PeerId]| leaders.iter().filter(|(h, _)| side.contains(h)).count();
        assert!(
            on(&MAJORITY) >= 1 && on(&MINORITY) >= 1,
            "seed {SEED}, {algo:?}: expected a leader on each side, got {leaders:?}"
        );
    }
}

#[test]
fn quorum_guard_keeps_one_leader_and_increasing_tokens() {
    let lease = Timing::default().lease;
    let mut sim = Simulation::new(SEED, ids(5), guarded(PeerAlgorithm::Bully, 5));
    sim.start_all();
    sim.run_for(Duration::from_secs(5));
    assert_eq!(check_agreement(&sim), Ok(PeerId(5)), "seed {SEED}");
    let before = sim.leader_of(PeerId(5)).expect("5 leads").epoch;

    let cut_at = sim.now();
    sim.partition(&MAJORITY, &MINORITY);
    sim.run_for(Duration::from_secs(6));

    // Only the majority side has a leader, with a higher fencing token.
    let leaders = sim.self_leaders();
    assert_eq!(leaders.len(), 1, "seed {SEED}: {leaders:?}");
    let (leader, term) = leaders[0];
    assert_eq!(leader, PeerId(3), "seed {SEED}");
    assert!(
        term.epoch > before,
        "seed {SEED}: {} <= {before}",
        term.epoch
    );
    for h in MAJORITY {
        assert_eq!(
            sim.leader_of(h).map(|l| l.id),
            Some(PeerId(3)),
            "seed {SEED}"
        );
    }
    // The cut-off leader stepped down within one lease (plus one renewal
    // period, the latest its last acknowledged renewal can have been sent).
    let terms = sim.terms();
    let old = terms
        .iter()
        .find(|t| t.host == PeerId(5) && t.epoch == before)
        .expect("5's term is logged");
    let ended = old.until.expect("5 stepped down");
    assert!(
        ended <= cut_at + lease + Timing::default().renew_interval,
        "seed {SEED}: 5 stepped down at {ended}, cut at {cut_at}"
    );
    assert_eq!(
        sim.leader_of(PeerId(4)),
        None,
        "seed {SEED}: 4 still follows"
    );

    // After healing there is still one leader at a time, tokens still rise.
    sim.repair();
    sim.run_for(Duration::from_secs(10));
    let agreed = check_agreement(&sim).unwrap_or_else(|e| panic!("seed {SEED}: {e}"));
    assert_eq!(agreed, PeerId(5), "seed {SEED}");
    check_terms(&sim.terms()).unwrap_or_else(|e| panic!("seed {SEED}: {e}"));
    assert!(sim.terms().len() >= 3, "seed {SEED}: {:?}", sim.terms());
}
