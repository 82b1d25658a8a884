//! Invitation groups merge into one at larger sizes too, before and after
//! the leader crashes (regression: a process could stay behind, following a
//! leader that had joined another group).

use std::time::Duration;

use tenure_peer::sim::Simulation;
use tenure_peer::{Config, ElectionAlgorithm, Invitation, PeerId};

fn agreed(sim: &Simulation<Invitation>, live: &[PeerId]) -> Option<PeerId> {
    let first = sim.leader_of(live[0])?.id;
    live.iter()
        .all(|p| sim.leader_of(*p).map(|l| l.id) == Some(first))
        .then_some(first)
}

#[test]
fn twenty_five_processes_merge_into_one_group_and_again_after_a_crash() {
    for seed in [0xbe_2024u64, 1, 2, 3] {
        let n = 25;
        let ids: Vec<PeerId> = (1..=n).map(PeerId).collect();
        let members = ids.clone();
        let mut sim = Simulation::new(seed, ids.clone(), move |id| {
            Invitation::new(Config::new(id, members.clone()).expect("config"))
        });
        sim.start_all();
        sim.run_for(Duration::from_secs(120));
        let leader = agreed(&sim, &ids).unwrap_or_else(|| panic!("seed {seed}: no single group"));
        sim.crash(leader);
        let live: Vec<PeerId> = ids.into_iter().filter(|p| *p != leader).collect();
        for p in &live {
            sim.start_election(*p);
        }
        sim.run_for(Duration::from_secs(120));
        assert!(
            agreed(&sim, &live).is_some(),
            "seed {seed}: no single group after the crash"
        );
        assert!(sim.machine(live[0]).is_some_and(|m| m.leader().is_some()));
    }
}
