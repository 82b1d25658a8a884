//! The five figure scenarios of ALGORITHMS.md (Database Internals, ch. 10),
//! each with the leader the text names and the exact message count.
//!
//! Counting convention: `sent` counts every message a state machine emitted,
//! `delivered` those that arrived, `dropped` those addressed to the crashed
//! process 6 (the simulator reports each of those back to the sender as
//! unreachable, which is how the senders stop waiting for 6).

use tenure_peer::sim::Simulation;
use tenure_peer::{
    Bully, CandidateOrdinary, Config, ElectionAlgorithm, Invitation, MessageKind, NextInLine,
    PeerId, Ring, RingVariant,
};

const SEED: u64 = 0x10_2024;

fn ids(n: u64) -> Vec<PeerId> {
    (1..=n).map(PeerId).collect()
}

fn config(id: PeerId, n: u64) -> Config {
    Config::new(id, ids(n)).expect("valid config")
}

/// Starts six processes, lets them elect 6, then crashes 6 and has `noticer`
/// start an election; returns the simulation with fresh message counts.
fn after_leader_six_fails<A: ElectionAlgorithm>(
    factory: impl FnMut(PeerId) -> A + 'static,
    noticer: u64,
) -> Simulation<A> {
    let mut sim = Simulation::new(SEED, ids(6), factory);
    sim.start_all();
    assert!(sim.run_until_idle(), "seed {SEED}: start-up did not settle");
    for id in ids(6) {
        assert_eq!(
            sim.leader_of(id).map(|l| l.id),
            Some(PeerId(6)),
            "seed {SEED}: {id} does not follow 6 after start-up"
        );
    }
    sim.reset_stats();
    sim.crash(PeerId(6));
    sim.start_election(PeerId(noticer));
    assert!(sim.run_until_idle(), "seed {SEED}: election did not settle");
    sim
}

fn assert_all_follow<A: ElectionAlgorithm>(sim: &Simulation<A>, live: &[u64], leader: u64) {
    for id in live {
        assert_eq!(
            sim.leader_of(PeerId(*id)).map(|l| l.id),
            Some(PeerId(leader)),
            "seed {}: process {id} does not follow {leader}; {}",
            sim.seed(),
            sim.stats()
        );
    }
}

#[test]
fn figure_10_1_bully_elects_5() {
    let sim = after_leader_six_fails(|id| Bully::new(config(id, 6)), 3);
    assert_all_follow(&sim, &[1, 2, 3, 4, 5], 5);
    let stats = sim.stats();
    // 3 sends Election to every higher rank: 4, 5, 6            -> 3
    assert_eq!(stats.sent(MessageKind::Election), 3, "{stats}");
    // 4 and 5 answer Alive (6 is down)                          -> 2
    assert_eq!(stats.sent(MessageKind::Alive), 2, "{stats}");
    // 3 nominates 5, the highest that answered                  -> 1
    assert_eq!(stats.sent(MessageKind::Nominate), 1, "{stats}");
    // 5 announces Elected to every lower rank: 1, 2, 3, 4       -> 4
    assert_eq!(stats.sent(MessageKind::Elected), 4, "{stats}");
    // total 3 + 2 + 1 + 4 = 10; only Election -> 6 is lost
    assert_eq!(stats.total_sent(), 10, "{stats}");
    assert_eq!(stats.total_delivered(), 9, "{stats}");
    assert_eq!(stats.dropped(MessageKind::Election), 1, "{stats}");
}

#[test]
fn figure_10_2_next_in_line_elects_5() {
    let sim = after_leader_six_fails(|id| NextInLine::new(config(id, 6)), 3);
    assert_all_follow(&sim, &[1, 2, 3, 4, 5], 5);
    let three = sim.machine(PeerId(3)).expect("3 is up");
    // 5 published its own alternatives when it took over.
    assert_eq!(three.alternatives(), &[PeerId(4), PeerId(3)]);
    let stats = sim.stats();
    // 3 contacts 5, the first alternative of 6's list {5, 4}    -> 1
    assert_eq!(stats.sent(MessageKind::Failover), 1, "{stats}");
    // 5 answers, so 3 contacts nobody else                      -> 1
    assert_eq!(stats.sent(MessageKind::Alive), 1, "{stats}");
    // 5 notifies everyone else: 1, 2, 3, 4, 6                   -> 5
    assert_eq!(stats.sent(MessageKind::Elected), 5, "{stats}");
    // no Election round at all
    assert_eq!(stats.sent(MessageKind::Election), 0, "{stats}");
    // total 1 + 1 + 5 = 7 (bully needed 10); Elected -> 6 is lost
    assert_eq!(stats.total_sent(), 7, "{stats}");
    assert_eq!(stats.total_delivered(), 6, "{stats}");
}

#[test]
fn figure_10_3_candidate_ordinary_elects_2() {
    let candidates = [PeerId(1), PeerId(2), PeerId(6)];
    let sim = after_leader_six_fails(
        move |id| CandidateOrdinary::new(config(id, 6), candidates),
        4,
    );
    assert_all_follow(&sim, &[1, 2, 3, 4, 5], 2);
    let stats = sim.stats();
    // after its tie-break delay, ordinary 4 contacts the remaining
    // candidates 1 and 2 (not the suspected leader 6)           -> 2
    assert_eq!(stats.sent(MessageKind::Election), 2, "{stats}");
    // both answer                                               -> 2
    assert_eq!(stats.sent(MessageKind::Alive), 2, "{stats}");
    // 4 tells everyone else that 2 leads: 1, 2, 3, 5, 6         -> 5
    assert_eq!(stats.sent(MessageKind::Elected), 5, "{stats}");
    // total 2 + 2 + 5 = 9; Elected -> 6 is lost
    assert_eq!(stats.total_sent(), 9, "{stats}");
    assert_eq!(stats.total_delivered(), 8, "{stats}");
}

#[test]
fn figure_10_3_tie_break_delays_order_candidates_first() {
    let candidates = [PeerId(1), PeerId(2), PeerId(6)];
    let delay = |id| CandidateOrdinary::new(config(PeerId(id), 6), candidates).tie_break_delay();
    let order: Vec<_> = [6, 2, 1, 5, 4, 3].into_iter().map(delay).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}

#[test]
fn figure_10_4_invitation_merges_into_group_led_by_1() {
    let mut sim = Simulation::new(SEED, ids(4), |id| Invitation::new(config(id, 4)));
    sim.start_all();
    assert!(
        sim.run_until_idle(),
        "seed {SEED}: invitations did not settle"
    );
    assert_all_follow(&sim, &[1, 2, 3, 4], 1);
    let one = sim.machine(PeerId(1)).expect("1 is up");
    assert_eq!(one.group().collect::<Vec<_>>(), ids(4));
    let stats = sim.stats();
    // 1 invites 2, 3 invites 4, then 1 invites 3                -> 3
    assert_eq!(stats.sent(MessageKind::Invite), 3, "{stats}");
    // 2 accepts 1, 4 accepts 3, 3 accepts 1 (listing {3, 4})    -> 3
    assert_eq!(stats.sent(MessageKind::Accept), 3, "{stats}");
    // equal sizes, lower rank wins: 1 leads, and only the smaller
    // side's other member, 4, is told; 2 is not                 -> 1
    assert_eq!(stats.sent(MessageKind::Elected), 1, "{stats}");
    // total 3 + 3 + 1 = 7, all delivered
    assert_eq!(stats.total_sent(), 7, "{stats}");
    assert_eq!(stats.total_delivered(), 7, "{stats}");
}

#[test]
fn figure_10_5_ring_alive_set_elects_5() {
    let sim = after_leader_six_fails(|id| Ring::new(config(id, 6), RingVariant::AliveSet), 3);
    assert_all_follow(&sim, &[1, 2, 3, 4, 5], 5);
    let three = sim.machine(PeerId(3)).expect("3 is up");
    let live: Vec<PeerId> = [3, 4, 5, 1, 2].into_iter().map(PeerId).collect();
    assert_eq!(three.last_live_set(), &live[..]);
    let stats = sim.stats();
    // round 1: 3->4, 4->5, 5->6 (unreachable), 5->1, 1->2, 2->3 -> 6
    assert_eq!(stats.sent(MessageKind::RingElection), 6, "{stats}");
    // round 2 travels the live set only:
    //          3->4, 4->5, 5->1, 1->2, 2->3                     -> 5
    assert_eq!(stats.sent(MessageKind::RingElected), 5, "{stats}");
    // total 6 + 5 = 11; the hand-off to 6 is lost
    assert_eq!(stats.total_sent(), 11, "{stats}");
    assert_eq!(stats.total_delivered(), 10, "{stats}");
}

#[test]
fn figure_10_5_ring_max_only_elects_5() {
    let sim = after_leader_six_fails(|id| Ring::new(config(id, 6), RingVariant::MaxOnly), 3);
    assert_all_follow(&sim, &[1, 2, 3, 4, 5], 5);
    let stats = sim.stats();
    // round 1 as in the alive-set variant                       -> 6
    assert_eq!(stats.sent(MessageKind::RingElection), 6, "{stats}");
    // round 2 has no set, so 5 tries 6 again before 1:
    //          3->4, 4->5, 5->6 (unreachable), 5->1, 1->2, 2->3 -> 6
    assert_eq!(stats.sent(MessageKind::RingElected), 6, "{stats}");
    // total 6 + 6 = 12, two hand-offs to 6 lost
    assert_eq!(stats.total_sent(), 12, "{stats}");
    assert_eq!(stats.total_delivered(), 10, "{stats}");
}
