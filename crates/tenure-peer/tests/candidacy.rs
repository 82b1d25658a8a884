//! The quorum guard's candidacy gate, sticky leadership and releases, as the
//! `peer://` backend uses them: only candidates lead, a leader keeps its seat
//! while it wants it, and a resign hands over in round trips, not a lease.

mod common;

use std::time::Duration;

use common::{check_terms, ids, plain, Machine};
use tenure_peer::sim::{SimRng, Simulation};
use tenure_peer::PeerAlgorithm;
use tenure_peer::{Heartbeat, PeerId, QuorumGuard, Timing};

type Guarded = QuorumGuard<Heartbeat<Machine>>;

fn seat_sim(algo: PeerAlgorithm, n: u64, seed: u64) -> Simulation<Guarded> {
    Simulation::new(seed, ids(n), move |id| {
        QuorumGuard::new(Heartbeat::new(plain(algo, id, n)))
            .standing_by()
            .with_sticky_leadership()
    })
}

fn set(sim: &mut Simulation<Guarded>, host: u64, active: bool) {
    sim.input(PeerId(host), |m, now| m.set_candidate(now, active));
}

fn leaders(sim: &Simulation<Guarded>) -> Vec<PeerId> {
    sim.self_leaders().into_iter().map(|(id, _)| id).collect()
}

fn lease() -> Duration {
    Timing::default().lease
}

/// Candidate/ordinary only lets its configured candidates lead (odd ranks
/// and the highest, see `common::plain`); the others are always picked from
/// those.
fn eligible(algo: PeerAlgorithm, id: u64, n: u64) -> bool {
    algo != PeerAlgorithm::CandidateOrdinary || id % 2 == 1 || id == n
}

#[test]
fn only_candidates_lead_and_everyone_follows_them() {
    for algo in PeerAlgorithm::ALL {
        let n = 5;
        let mut sim = seat_sim(algo, n, 11);
        sim.start_all();
        sim.run_for(lease() * 3);
        assert!(leaders(&sim).is_empty(), "{algo:?}: nobody is a candidate");
        set(&mut sim, 1, true);
        set(&mut sim, 3, true);
        sim.run_for(lease() * 4);
        let lead = leaders(&sim);
        assert_eq!(lead.len(), 1, "{algo:?}: {lead:?}\n{}", sim.stats());
        assert!(
            [PeerId(1), PeerId(3)].contains(&lead[0]),
            "{algo:?}: {lead:?} is no candidate"
        );
        for host in sim.hosts().collect::<Vec<_>>() {
            assert_eq!(
                sim.leader_of(host).map(|l| l.id),
                Some(lead[0]),
                "{algo:?}: host {host} does not follow the leader"
            );
        }
        check_terms(&sim.terms()).unwrap_or_else(|e| panic!("{algo:?}: {e}"));
    }
}

#[test]
fn a_sticky_leader_keeps_its_seat_when_a_higher_rank_joins() {
    for algo in PeerAlgorithm::ALL {
        let n = 5;
        let mut sim = seat_sim(algo, n, 12);
        sim.start_all();
        set(&mut sim, 1, true);
        sim.run_for(lease() * 3);
        assert_eq!(leaders(&sim), vec![PeerId(1)], "{algo:?}");
        let epoch = sim.leader_of(PeerId(1)).map(|l| l.epoch);
        set(&mut sim, 5, true);
        sim.run_for(lease() * 5);
        assert_eq!(leaders(&sim), vec![PeerId(1)], "{algo:?}: taken over");
        assert_eq!(sim.leader_of(PeerId(1)).map(|l| l.epoch), epoch);
        // When 1 stands down, 5 takes over within round trips, long before
        // a lease could have run out.
        let before = sim.now();
        set(&mut sim, 1, false);
        let limit = before + lease() / 2;
        while sim.now() < limit && leaders(&sim) != vec![PeerId(5)] {
            sim.run_for(Duration::from_millis(5));
        }
        if eligible(algo, 5, n) {
            assert_eq!(
                leaders(&sim),
                vec![PeerId(5)],
                "{algo:?}: no quick handover"
            );
        }
        check_terms(&sim.terms()).unwrap_or_else(|e| panic!("{algo:?}: {e}"));
    }
}

#[test]
fn relinquishing_with_candidacy_kept_wins_a_higher_epoch() {
    let mut sim = seat_sim(PeerAlgorithm::Bully, 3, 13);
    sim.start_all();
    set(&mut sim, 2, true);
    sim.run_for(lease() * 3);
    let first = sim.leader_of(PeerId(2)).expect("2 leads");
    assert_eq!(first.id, PeerId(2));
    sim.input(PeerId(2), |m, now| m.relinquish(now));
    assert_eq!(leaders(&sim), Vec::<PeerId>::new(), "stepped down at once");
    sim.run_for(Duration::from_millis(100));
    let second = sim.leader_of(PeerId(2)).expect("2 leads again");
    assert_eq!(second.id, PeerId(2));
    assert!(second.epoch > first.epoch);
    check_terms(&sim.terms()).expect("terms");
}

#[test]
fn random_candidacy_changes_and_crashes_keep_the_quorum_promises() {
    let runs: u64 = 60;
    for seed in 0..runs {
        let algo = PeerAlgorithm::ALL[(seed % PeerAlgorithm::ALL.len() as u64) as usize];
        let n = 3 + seed % 3;
        let mut sim = seat_sim(algo, n, seed);
        let mut rng = SimRng::new(seed ^ 0x5eed);
        sim.start_all();
        let mut candidates = vec![false; n as usize + 1];
        for _ in 0..40 {
            let host = 1 + rng.below(n);
            match rng.below(10) {
                0 => sim.crash(PeerId(host)),
                1 => {
                    sim.restart(PeerId(host));
                    // A restarted process stands by until told again.
                    candidates[host as usize] = false;
                }
                2 => sim.input(PeerId(host), |m, now| m.relinquish(now)),
                _ => {
                    let active = rng.below(3) != 0;
                    candidates[host as usize] = active;
                    set(&mut sim, host, active);
                }
            }
            sim.run_for(Duration::from_millis(rng.below(1500)));
            for (id, _) in sim.self_leaders() {
                let machine = sim.machine(id).expect("up");
                assert!(
                    machine.is_candidate(),
                    "seed {seed}: {id} leads without being a candidate"
                );
            }
        }
        check_terms(&sim.terms()).unwrap_or_else(|e| panic!("seed {seed} ({algo:?}): {e}"));
    }
}

#[test]
fn a_standing_by_member_still_counts_for_the_majority() {
    // Two of five are candidates: the three others must acknowledge, or no
    // one could win.
    let mut sim = seat_sim(PeerAlgorithm::Ring, 5, 14);
    sim.start_all();
    set(&mut sim, 2, true);
    set(&mut sim, 4, true);
    sim.run_for(lease() * 3);
    assert_eq!(leaders(&sim).len(), 1);
    // Cut both candidates off from the three voters: the leader loses its
    // majority and steps down; nobody leads.
    sim.partition(&[PeerId(2), PeerId(4)], &[PeerId(1), PeerId(3), PeerId(5)]);
    sim.run_for(lease() * 3);
    assert!(leaders(&sim).is_empty(), "{:?}", leaders(&sim));
    sim.repair();
    sim.run_for(lease() * 4);
    assert_eq!(leaders(&sim).len(), 1);
    let leader = leaders(&sim)[0];
    assert!(leader == PeerId(2) || leader == PeerId(4));
    assert!(sim
        .machine(PeerId(1))
        .is_some_and(|m| m.known_candidates().count() == 2));
    check_terms(&sim.terms()).expect("terms");
}
