//! A fleet through a failure of its store's own leader: four `tenure shards run` nodes
//! share 512 shards (replication 2) on a 3-member etcd cluster and on a 3-server
//! ZooKeeper ensemble at the stores' production timing
//! ([`ClusterTiming::Production`]); the store's leader is stopped (SIGSTOP for 8 s,
//! then SIGCONT) or killed (SIGKILL), and over the next 20 s the test counts, from the
//! nodes' event lines:
//!
//! - **shards lost**: `lost` lines, by reason;
//! - **shards moved**: shards some other node than their holder at the fault acquired;
//! - **shards without a leader at once**: the most shards no node held at one moment;
//! - for each lost shard, how long until its own node led it again.
//!
//! It asserts what issue 36 asks of a fleet: no shard moves, none is lost except
//! where the store itself deleted the seat or the whole session (etcd's paused raft
//! leader revoking leases as it resumes; the paused member's own count of leases it
//! revoked as expired must then have grown), and such a shard is led again by the same
//! node within 1 s of the loss. The table of figures is printed either way
//! (`-- --nocapture`).
//!
//! When this test was written it failed whenever etcd's resuming raft leader revoked
//! the nodes' leases (2 of 4 stops at the 7 s floor): the nodes' members vanish with
//! their leases and the shard manager moves their shards to the survivor and back (about
//! 400 moved, 30–42 of the revoked ones not led again by their own node within 20 s).
//! That is the shard manager's part of issue 36; the store-side figures are in the etcd
//! and ZooKeeper READMEs. With the member grace (a vanished member keeps its shards for
//! TTL / 4) and the re-campaign after a revoked session (the node finds out from its own
//! member leaving the list, re-opens at once and asks for its shards in batches), 5
//! stops at the 5 s floor: 4 revoked 2–4 nodes' leases; 3, 4, 4 and 19 shards moved, the
//! rest led again by their own node within 1.1–2.8 s. The nodes' debug logs showed why:
//! each node published its lost shards as no longer held at once (the plans gave some to
//! another revoked node, which took them first), tried them one seat per try, each try
//! waiting for the lost seats' release through the revoked lease (3.7 s for 128 seats),
//! and a batch that met the ended session was withdrawn through it, so the same seats
//! were refused as "already campaigning" on the new session and retried at a back-off.
//! With those fixed (claims kept on lost shards, one batch, no release or withdrawal
//! through an ended session), 11 stops at the 5 s floor (2026-11-27): 4 revoked 3 or 4
//! nodes' leases (384, 512, 384 and 512 shards lost, "session expired"), 0 moved, every
//! lost shard led again by its own node within 343, 365, 247 and 291 ms; the other 7
//! lost nothing.
//! `TENURE_FLEET_LOG` sets the nodes' `RUST_LOG` (warn); a run that moved or did not
//! re-lead a shard prints what the nodes said.
//!
//! One run per store and fault. `TENURE_FLEET_RUNS=N` runs each N times (a fresh
//! cluster and fleet each); `TENURE_FLEET_TTL`, `TENURE_FLEET_RENEW_INTERVAL` and
//! `TENURE_FLEET_RENEW_DEADLINE` (seconds) set the nodes' `--ttl`, `--renew-interval`
//! and `--renew-deadline` (default: the store's TTL floor at production timing,
//! [`ETCD_TTL_FLOOR`] and [`ZOOKEEPER_TTL_FLOOR`], with the core's renewal shares).
//!
//! ```text
//! cargo test -p tenure-integration --test fleet_stall -- --nocapture
//! TENURE_FLEET_RUNS=5 TENURE_FLEET_TTL=7 cargo test -p tenure-integration --test fleet_stall -- --nocapture
//! ```
//!
//! [`ClusterTiming::Production`]: tenure_integration::cluster_faults::ClusterTiming::Production
//! [`ETCD_TTL_FLOOR`]: tenure_integration::cluster_faults::ETCD_TTL_FLOOR
//! [`ZOOKEEPER_TTL_FLOOR`]: tenure_integration::cluster_faults::ZOOKEEPER_TTL_FLOOR

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tenure_integration::cli_faults::{shards_run_args, tenure_bin};
use tenure_integration::cluster_faults::{ETCD_TTL_FLOOR, ZOOKEEPER_TTL_FLOOR};
use tenure_integration::{
    monotonic_now_ns, run_prefix, CandidateProcess, EtcdCluster, Event, Members, ZooKeeperEnsemble,
};

const SHARDS: usize = 512;
const NODES: usize = 4;
/// How long the store's leader is stopped.
const PAUSE: Duration = Duration::from_secs(8);
/// How long after the fault the fleet is watched.
const WATCH: Duration = Duration::from_secs(20);
/// How soon a shard whose seat the store deleted must be led again by its own node.
const RELEAD_WITHIN: Duration = Duration::from_secs(1);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Stop,
    Kill,
}

/// A positive number of seconds from the environment variable `name`.
fn seconds(name: &str) -> Option<f64> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Some(s),
        _ => panic!("{name}={value:?}: not a positive number of seconds"),
    }
}

fn runs() -> usize {
    match std::env::var("TENURE_FLEET_RUNS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TENURE_FLEET_RUNS={v:?}: not a number")),
        Err(_) => 1,
    }
}

/// The nodes' timing flags on a store whose floor is `floor`, and a description of them.
fn timing_flags(floor: Duration) -> (Vec<String>, String) {
    let ttl = seconds("TENURE_FLEET_TTL").unwrap_or(floor.as_secs_f64());
    let mut flags = vec!["--ttl".to_string(), ttl.to_string()];
    let mut what = format!("TTL {ttl} s");
    if let Some(s) = seconds("TENURE_FLEET_RENEW_INTERVAL") {
        flags.extend(["--renew-interval".to_string(), s.to_string()]);
        what.push_str(&format!(", renew every {s} s"));
    }
    if let Some(s) = seconds("TENURE_FLEET_RENEW_DEADLINE") {
        flags.extend(["--renew-deadline".to_string(), s.to_string()]);
        what.push_str(&format!(", deadline {s} s"));
    }
    (flags, what)
}

/// The store under the fleet.
enum Store {
    Etcd(EtcdCluster),
    ZooKeeper(ZooKeeperEnsemble),
}

impl Store {
    fn name(&self) -> &'static str {
        match self {
            Store::Etcd(_) => "etcd",
            Store::ZooKeeper(_) => "ZooKeeper",
        }
    }

    fn members(&mut self) -> &mut Members {
        match self {
            Store::Etcd(c) => c,
            Store::ZooKeeper(e) => e,
        }
    }

    /// The shortest TTL that rides out the store's leader failover at production timing.
    fn ttl_floor(&self) -> Duration {
        match self {
            Store::Etcd(_) => ETCD_TTL_FLOOR,
            Store::ZooKeeper(_) => ZOOKEEPER_TTL_FLOOR,
        }
    }

    fn url(&self, prefix: &str) -> String {
        match self {
            Store::Etcd(c) => format!("etcd://{}?prefix={prefix}", c.hosts()),
            Store::ZooKeeper(e) => format!("zk://{}/{prefix}", e.hosts()),
        }
    }

    async fn leader(&self) -> usize {
        let leader = match self {
            Store::Etcd(c) => c.wait_leader().await,
            Store::ZooKeeper(e) => e.wait_leader().await,
        };
        leader.unwrap_or_else(|e| panic!("the store's leader: {e}"))
    }

    /// Leases member `i` revoked as expired (etcd); `None` for ZooKeeper.
    async fn leases_expired(&self, i: usize) -> Option<u64> {
        match self {
            Store::Etcd(c) => Some(
                c.leases_expired(i)
                    .await
                    .unwrap_or_else(|e| panic!("etcd member {i}'s metrics: {e}")),
            ),
            Store::ZooKeeper(_) => None,
        }
    }
}

/// `tenure shards run` as node `id` with `true` as each shard's command (it exits at
/// once; the grant stays held until it is lost or handed over).
fn node(url: &str, ns: &str, id: &str, timing: &[String]) -> CandidateProcess {
    let mut args = shards_run_args(url, ns, SHARDS, id);
    args.extend_from_slice(timing);
    args.extend(["--".to_string(), "true".to_string()]);
    let log = std::env::var("TENURE_FLEET_LOG").unwrap_or_else(|_| "warn".to_string());
    CandidateProcess::spawn(&tenure_bin(), &args, [("RUST_LOG", log.as_str())])
        .expect("start tenure")
}

/// Every node's grant events (acquired, lost, handed_off), in time order.
fn grant_events(nodes: &[CandidateProcess]) -> Vec<Event> {
    let mut all: Vec<Event> = nodes
        .iter()
        .flat_map(|n| n.events())
        .filter(|e| e.is("acquired") || e.is("lost") || e.is("handed_off"))
        .collect();
    all.sort_by_key(|e| e.mono_ns);
    all
}

/// Who holds each shard (election → node ids) after `events` up to `until_ns`.
fn holders(events: &[Event], until_ns: u64) -> BTreeMap<String, BTreeSet<String>> {
    let mut held: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events.iter().take_while(|e| e.mono_ns <= until_ns) {
        let set = held.entry(e.election.clone()).or_default();
        if e.is("acquired") {
            set.insert(e.id.clone());
        } else {
            set.remove(&e.id);
        }
    }
    held.retain(|_, s| !s.is_empty());
    held
}

/// Waits until every shard is held by exactly one node and nothing changed for 3 s.
async fn settle(nodes: &[CandidateProcess], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let events = grant_events(nodes);
        let now = monotonic_now_ns();
        let held = holders(&events, now);
        let whole = held.len() == SHARDS && held.values().all(|s| s.len() == 1);
        let quiet = events
            .last()
            .is_some_and(|e| now.saturating_sub(e.mono_ns) > 3_000_000_000);
        if whole && quiet {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let tails: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}: {}", n.label(), n.stderr_tail()))
                .collect();
            panic!(
                "the fleet did not settle within {within:?}: {} of {SHARDS} shards held, {} \
                 by more than one node\n{}",
                held.len(),
                held.values().filter(|s| s.len() > 1).count(),
                tails.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What one run found.
#[derive(Debug, Default)]
struct Figures {
    /// Lost shards by reason (its first words).
    lost: BTreeMap<String, usize>,
    /// Shards another node than their holder at the fault acquired in the window.
    moved: usize,
    /// Handoffs finished in the window.
    handed_off: usize,
    /// The most shards without a holder at one moment.
    leaderless: usize,
    /// Lost shards led again by their own node, and the longest it took.
    releads: (usize, Duration),
    /// Lost shards not led again by their own node within the window.
    not_reled: usize,
    /// Lost shards whose loss was not the store's deletion of the seat or session.
    lost_not_revoked: usize,
    /// The paused member's leases revoked as expired (etcd): before, after.
    revoked_by_paused: Option<(u64, u64)>,
}

/// Whether a loss `reason` is the store deleting what the node held: a seat deleted
/// (`revoked: …`), or the whole session gone (`session expired`, which is how a node
/// whose etcd lease was revoked learns it when its keep-alive finds the lease gone
/// before the seats' deletions reach it). A node that merely failed to renew loses its
/// grants at its renew deadline, before the store could expire anything.
fn by_the_store(reason: &str) -> bool {
    reason.starts_with("revoked") || reason == "session expired"
}

/// The figures of the window `[fault_ns, fault_ns + WATCH]`.
fn count(events: &[Event], fault_ns: u64) -> Figures {
    let end = fault_ns + WATCH.as_nanos() as u64;
    let before = holders(events, fault_ns);
    let mut f = Figures::default();
    let window: Vec<&Event> = events
        .iter()
        .filter(|e| e.mono_ns > fault_ns && e.mono_ns <= end)
        .collect();
    // Holders over time, for the leaderless count.
    let mut held = before.clone();
    let mut leaderless = SHARDS - held.len();
    f.leaderless = leaderless;
    let mut moved: BTreeSet<String> = BTreeSet::new();
    let mut lost_at: HashMap<(String, String), u64> = HashMap::new();
    for e in &window {
        let set = held.entry(e.election.clone()).or_default();
        let was_empty = set.is_empty();
        if e.is("acquired") {
            set.insert(e.id.clone());
            let original = before.get(&e.election);
            if original.is_some_and(|o| !o.contains(&e.id)) {
                moved.insert(e.election.clone());
            }
            if let Some(at) = lost_at.remove(&(e.election.clone(), e.id.clone())) {
                f.releads.0 += 1;
                f.releads.1 = f.releads.1.max(Duration::from_nanos(e.mono_ns - at));
            }
        } else {
            set.remove(&e.id);
            if e.is("lost") {
                let reason = e.reason.clone().unwrap_or_default();
                if !by_the_store(&reason) {
                    f.lost_not_revoked += 1;
                }
                let short: String = reason.chars().take(48).collect();
                *f.lost.entry(short).or_default() += 1;
                lost_at.insert((e.election.clone(), e.id.clone()), e.mono_ns);
            } else {
                f.handed_off += 1;
            }
        }
        let is_empty = set.is_empty();
        match (was_empty, is_empty) {
            (false, true) => leaderless += 1,
            (true, false) => leaderless = leaderless.saturating_sub(1),
            _ => {}
        }
        f.leaderless = f.leaderless.max(leaderless);
    }
    f.moved = moved.len();
    f.not_reled = lost_at.len();
    f
}

async fn fleet_run(mut store: Store, fault: Fault, run: usize) -> (Figures, String) {
    let (timing, timing_what) = timing_flags(store.ttl_floor());
    let prefix = format!("fleet-{}", run_prefix().replace(['/', ':'], "-"));
    let url = store.url(&prefix);
    let ns = "stall";
    let nodes: Vec<CandidateProcess> = (1..=NODES)
        .map(|i| node(&url, ns, &format!("n{i}"), &timing))
        .collect();
    settle(&nodes, Duration::from_secs(120)).await;
    let leader = store.leader().await;
    let revoked_before = store.leases_expired(leader).await;
    let fault_ns = monotonic_now_ns();
    match fault {
        Fault::Stop => {
            store
                .members()
                .pause(leader)
                .expect("pause the store's leader");
            tokio::time::sleep(PAUSE).await;
            store
                .members()
                .resume(leader)
                .expect("resume the store's leader");
        }
        Fault::Kill => store
            .members()
            .kill(leader)
            .await
            .expect("kill the store's leader"),
    }
    let end_ns = fault_ns + WATCH.as_nanos() as u64;
    tokio::time::sleep(Duration::from_nanos(
        end_ns.saturating_sub(monotonic_now_ns()),
    ))
    .await;
    let mut figures = count(&grant_events(&nodes), fault_ns);
    if fault == Fault::Stop {
        if let (Some(before), Some(after)) = (revoked_before, store.leases_expired(leader).await) {
            figures.revoked_by_paused = Some((before, after));
        }
    }
    let fault_what = match fault {
        Fault::Stop => format!("SIGSTOP {} s", PAUSE.as_secs()),
        Fault::Kill => "SIGKILL".to_string(),
    };
    let row = format!(
        "| {} | {fault_what} | {run} | {timing_what} | {} | {} | {} | {} | {} | {} |",
        store.name(),
        if figures.lost.is_empty() {
            "0".to_string()
        } else {
            figures
                .lost
                .iter()
                .map(|(r, n)| format!("{n} ({r})"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        figures.moved,
        figures.handed_off,
        figures.leaderless,
        match figures.releads {
            (0, _) => format!("– ({} not)", figures.not_reled),
            (n, worst) => format!(
                "{n}, within {:.0} ms ({} not)",
                worst.as_secs_f64() * 1000.0,
                figures.not_reled
            ),
        },
        match figures.revoked_by_paused {
            Some((b, a)) => (a - b).to_string(),
            None => "–".to_string(),
        },
    );
    if figures.moved > 0 || figures.not_reled > 0 {
        // What the nodes said (RUST_LOG from TENURE_FLEET_LOG, warn by default).
        for n in &nodes {
            eprintln!("{} (run {run}): {}", n.label(), n.stderr_tail());
        }
    }
    drop(nodes);
    (figures, row)
}

async fn fleet(start: impl Fn() -> futures::future::BoxFuture<'static, Store>, fault: Fault) {
    let _serial = SERIAL.lock().await;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for run in 1..=runs() {
        let store = start().await;
        let (f, row) = fleet_run(store, fault, run).await;
        if f.moved > 0 {
            failures.push(format!("run {run}: {} shards moved", f.moved));
        }
        if f.lost_not_revoked > 0 {
            failures.push(format!(
                "run {run}: {} shards lost other than by the store's deletion: {:?}",
                f.lost_not_revoked, f.lost
            ));
        }
        let revoked = f.lost.values().sum::<usize>() - f.lost_not_revoked;
        if revoked > 0 {
            match f.revoked_by_paused {
                Some((b, a)) if a > b => {}
                other => failures.push(format!(
                    "run {run}: {revoked} seats deleted by the store, but the paused member \
                     revoked no lease as expired ({other:?})"
                )),
            }
        }
        if f.not_reled > 0 || f.releads.1 > RELEAD_WITHIN {
            failures.push(format!(
                "run {run}: lost shards led again by their own node: {} within {:?}, {} not at all",
                f.releads.0, f.releads.1, f.not_reled
            ));
        }
        rows.push(row);
    }
    println!(
        "\n| store | fault on its leader | run | nodes' timing | shards lost (reason) | moved | \
         handed off | without a leader at once | lost, then led again by their own node | \
         leases the paused member revoked |\n|---|---|---:|---|---|---:|---:|---:|---|---:|\n{}",
        rows.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{SHARDS} shards on {NODES} nodes through a fault on the store's leader:\n{}",
        failures.join("\n")
    );
}

fn etcd() -> futures::future::BoxFuture<'static, Store> {
    Box::pin(async {
        Store::Etcd(
            EtcdCluster::start(3)
                .await
                .unwrap_or_else(|e| panic!("start the etcd cluster: {e}")),
        )
    })
}

fn zookeeper() -> futures::future::BoxFuture<'static, Store> {
    Box::pin(async {
        Store::ZooKeeper(
            ZooKeeperEnsemble::start(3)
                .await
                .unwrap_or_else(|e| panic!("start the ZooKeeper ensemble: {e}")),
        )
    })
}

/// etcd's resuming raft leader revokes the leases of some nodes in about a third of the
/// runs (4 of 11 at the 5 s floor, 2026-11-27): their shards stay with them and are led
/// again by them within 250–370 ms; 10 of 10 runs passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_fleet_through_a_stopped_raft_leader() {
    fleet(etcd, Fault::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_fleet_through_a_killed_raft_leader() {
    fleet(etcd, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_fleet_through_a_stopped_ensemble_leader() {
    fleet(zookeeper, Fault::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_fleet_through_a_killed_ensemble_leader() {
    fleet(zookeeper, Fault::Kill).await;
}
