//! `peer://` with no store: three `tenure campaign` processes form a cluster
//! on loopback. Exactly one is elected; SIGKILL it and one of the two others
//! is elected with a higher token; the event logs and a guarded resource show
//! no fencing violation.

use std::net::SocketAddr;
use std::time::Duration;

use tenure_integration::chaos::peer_url;
use tenure_integration::cli_faults::{self, campaign_args, finish, next_leader, tenure_bin};
use tenure_integration::{free_port, CandidateProcess, Event, GuardedResource};

/// Session TTL of the candidates, within the cluster's lease.
const TTL: Duration = Duration::from_secs(1);

/// Starts node `id` of the cluster on `ports`; while leader it writes its
/// token to `resource`.
fn node(id: usize, ports: &[u16], election: &str, resource: &GuardedResource) -> CandidateProcess {
    let peers: Vec<_> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    let url = peer_url(ports[id - 1], id, &peers);
    let name = format!("node{id}");
    let script = resource.write_loop_command(Duration::from_millis(50));
    // The CLI's default connect timeout (5 s); the command lives at most a minute.
    let (connect, lifetime) = (Duration::from_secs(5), Duration::from_secs(60));
    let args = campaign_args(&url, election, &name, TTL, connect, lifetime, &script);
    CandidateProcess::spawn(&tenure_bin(), &args, [("RUST_LOG", "warn")])
        .unwrap_or_else(|e| panic!("starting {name}: {e}"))
}

fn dump(nodes: &[CandidateProcess]) -> String {
    cli_faults::dump(&nodes.iter().collect::<Vec<_>>())
}

/// How many of `nodes` hold the seat now.
fn holders(nodes: &[CandidateProcess]) -> usize {
    nodes.iter().filter(|n| n.leads()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_elect_one_and_fail_over_after_a_kill() {
    let resource = GuardedResource::start().await.expect("resource");
    let ports: Vec<u16> = (0..3).map(|_| free_port().expect("port")).collect();
    let election = "peer/processes";
    let mut nodes: Vec<CandidateProcess> = (1..=3)
        .map(|id| node(id, &ports, election, &resource))
        .collect();

    let refs: Vec<&CandidateProcess> = nodes.iter().collect();
    let (first, elected) = next_leader(&refs, 0, Duration::from_secs(15)).await;
    let first_token = elected.token.expect("token");
    // Settled: one holder, and it keeps the seat.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holders(&nodes), 1, "{}", dump(&nodes));
    let elected_events: usize = nodes
        .iter()
        .map(|n| n.events().iter().filter(|e| e.is(Event::ELECTED)).count())
        .sum();
    assert_eq!(
        elected_events,
        1,
        "more than one election:\n{}",
        dump(&nodes)
    );

    // SIGKILL the holder (its command keeps writing its stale token).
    let killed_ns = nodes[first].kill().await.expect("kill");
    let refs: Vec<&CandidateProcess> = nodes.iter().collect();
    let (second, successor) = next_leader(&refs, killed_ns, Duration::from_secs(10)).await;
    assert_ne!(second, first);
    let second_token = successor.token.expect("token");
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    eprintln!(
        "peer:// failover after SIGKILL: {:.0} ms",
        (successor.mono_ns - killed_ns) as f64 / 1e6
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holders(&nodes), 1, "{}", dump(&nodes));

    // The resource saw the successor's token, and accepted nothing older once it had
    // (the killed holder's command keeps trying).
    assert!(resource.highest(election) >= Some(second_token));
    let refused_stale = resource
        .refused()
        .iter()
        .filter(|w| w.token == first_token)
        .count();
    eprintln!("writes with the killed holder's token refused: {refused_stale}");
    finish(&resource, nodes).await;
}
