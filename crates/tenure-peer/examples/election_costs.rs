//! The benchmark table of the crate README: messages and simulated time to
//! elect a new leader after the leader crashes, per algorithm, for n = 5, 25
//! and 100 processes (one-way delays of 1–10 ms), then the wall-clock time
//! over TCP on loopback for n = 5.
//!
//! `cargo run --release -p tenure-peer --example election_costs`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tenure_peer::sim::{Happening, Simulation};
use tenure_peer::transport::TransportOptions;
use tenure_peer::{
    Bully, Config, ElectionAlgorithm, Event, Heartbeat, PeerAlgorithm, PeerId, PeerNode, Timing,
};

const SEED: u64 = 0xbe_2024;

/// Invitation never goes idle with a member down; its messages are counted
/// over this window after the crash.
const INVITATION_WINDOW: Duration = Duration::from_secs(120);

type Machine = Box<dyn ElectionAlgorithm>;

fn ids(n: u64) -> Vec<PeerId> {
    (1..=n).map(PeerId).collect()
}

fn machine(algo: PeerAlgorithm, id: PeerId, n: u64) -> Machine {
    let config = Config::new(id, ids(n)).expect("valid config");
    // For candidate/ordinary, every other process is a candidate, the
    // highest included.
    let candidates: Vec<PeerId> = ids(n).into_iter().filter(|p| p.get() % 2 == 0).collect();
    algo.machine(config, &candidates)
}

struct Cost {
    messages: u64,
    time: Duration,
    leader: Option<PeerId>,
}

/// Settles a fresh cluster, crashes its leader, has the lowest live process
/// notice (every live process, for invitation, whose members each follow
/// their group leader), and measures until nothing is left to do.
fn after_crash(algo: PeerAlgorithm, n: u64) -> Cost {
    let mut sim = Simulation::new(SEED, ids(n), move |id| machine(algo, id, n));
    sim.start_all();
    match algo {
        PeerAlgorithm::Invitation => sim.run_for(Duration::from_secs(120)),
        _ => assert!(
            sim.run_until_idle(),
            "{algo:?} n={n}: start-up did not settle"
        ),
    }
    let leader = sim.leader_of(PeerId(1)).expect("a leader").id;

    sim.reset_stats();
    let crashed_at = sim.now();
    let log_from = sim.log().len();
    sim.crash(leader);
    let live: Vec<PeerId> = ids(n).into_iter().filter(|p| *p != leader).collect();
    match algo {
        PeerAlgorithm::Invitation => {
            for p in &live {
                sim.start_election(*p);
            }
        }
        _ => sim.start_election(live[0]),
    }
    match algo {
        // A group missing a member invites it forever: measure a window.
        PeerAlgorithm::Invitation => sim.run_for(INVITATION_WINDOW),
        _ => assert!(
            sim.run_until_idle(),
            "{algo:?} n={n}: election did not settle"
        ),
    }
    let last_change = sim.log()[log_from..]
        .iter()
        .filter(|r| matches!(r.what, Happening::Event(Event::LeaderChanged { .. })))
        .map(|r| r.at)
        .max()
        .unwrap_or(crashed_at);
    let views: Vec<Option<PeerId>> = live
        .iter()
        .map(|p| sim.leader_of(*p).map(|l| l.id))
        .collect();
    let agreed = views.iter().all(|v| *v == views[0]);
    Cost {
        messages: sim.stats().total_sent(),
        time: last_change.saturating_duration_since(crashed_at),
        leader: if agreed { views[0] } else { None },
    }
}

async fn tcp_election_n5() -> (Duration, Duration) {
    let n = 5;
    let timing = Timing {
        heartbeat_interval: Duration::from_millis(50),
        leader_timeout: Duration::from_millis(250),
        ..Timing::default()
    };
    let mut listeners = Vec::new();
    let mut addrs: BTreeMap<PeerId, SocketAddr> = BTreeMap::new();
    for id in ids(n) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        addrs.insert(id, l.local_addr().expect("addr"));
        listeners.push(l);
    }
    let started = tokio::time::Instant::now();
    let mut nodes: Vec<Option<PeerNode>> = Vec::new();
    for (id, l) in ids(n).into_iter().zip(listeners) {
        let config = Config::with_timing(id, ids(n), timing.clone()).expect("config");
        let node = PeerNode::with_listener(
            Heartbeat::new(Bully::new(config)),
            l,
            &addrs,
            TransportOptions::default(),
        )
        .expect("node");
        nodes.push(Some(node));
    }
    let agreed_on = |nodes: &[Option<PeerNode>], who: PeerId| {
        nodes
            .iter()
            .flatten()
            .all(|node| node.leader().map(|l| l.id) == Some(who))
    };
    while !agreed_on(&nodes, PeerId(n)) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = started.elapsed();
    let crashed = tokio::time::Instant::now();
    nodes[n as usize - 1] = None;
    while !agreed_on(&nodes, PeerId(n - 1)) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (first, crashed.elapsed())
}

fn main() {
    println!("| algorithm | n | messages | simulated time | new leader |");
    println!("|---|---|---|---|---|");
    for n in [5, 25, 100] {
        for algo in PeerAlgorithm::ALL {
            let cost = after_crash(algo, n);
            let leader = cost
                .leader
                .map_or("no agreement".to_owned(), |l| l.to_string());
            println!(
                "| {} | {n} | {} | {:.1} ms | {leader} |",
                algo.name(),
                cost.messages,
                cost.time.as_secs_f64() * 1e3
            );
        }
    }
    println!();
    println!(
        "Invitation: every live process notices the crash; messages counted over {INVITATION_WINDOW:?} (its groups keep inviting the crashed process)."
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (first, failover) = runtime.block_on(tcp_election_n5());
    println!();
    println!(
        "TCP on loopback, n = 5, bully with heartbeats (leader_timeout 250 ms): first election {:.1} ms after start, new leader {:.1} ms after the leader's crash",
        first.as_secs_f64() * 1e3,
        failover.as_secs_f64() * 1e3
    );
}
