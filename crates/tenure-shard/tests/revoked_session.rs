//! A node whose session the store revoked or expired while the node itself was fine
//! (etcd's paused raft leader revoking leases as it resumes; an operator; a store that
//! lost the session) leads the same shards again, at once, and nothing moves: its
//! member vanishes from the list with the session, and comes back within the member
//! grace, during which the other nodes keep its shards for it. In-memory store, paused
//! time, 256 shards on 5 nodes (replication 3).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::MemoryBackend;
use tenure_shard::bench::CountingBackend;
use tenure_shard::testing::{same_backend, Cluster, Logged, ShardEnv};
use tenure_shard::ShardEvent;
use tokio::time::Instant;

/// How the store takes the session away.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Seats and members deleted, the holder told of each seat but not of the session
    /// (it finds out from its next request), as etcd's lessor revoking a lease.
    Revoke,
    /// Seats and members deleted and the session told it expired.
    Expire,
}

fn env(mem: &Arc<MemoryBackend>) -> ShardEnv {
    let mut env = ShardEnv::memory();
    env.connect = same_backend(mem.clone());
    env
}

/// Take `victim`'s session away with `fault`; after the fleet settled again, every
/// shard is led by the node that led it before (the victim's with a new token, every
/// other with the same), no node but the victim acquired or lost anything, and
/// nothing was handed off. Returns the longest time from a loss to the victim's grant
/// of the same shard.
async fn revoke_and_check(
    c: &Cluster,
    mem: &MemoryBackend,
    victim: &str,
    fault: Fault,
) -> Duration {
    let before = c.leaders().await;
    let theirs: Vec<usize> = before
        .iter()
        .enumerate()
        .filter(|(_, l)| l.as_ref().is_some_and(|(id, _)| id == victim))
        .map(|(s, _)| s)
        .collect();
    assert!(!theirs.is_empty(), "{victim} leads nothing");
    let session = c.nodes[victim].session().id();
    let t0 = Instant::now();
    let done = match fault {
        Fault::Revoke => mem.revoke_session(&session),
        Fault::Expire => mem.expire_session(&session),
    };
    assert!(done, "no session {session}");
    // Longer than the TTL, the member grace and a settle, so that whatever the fleet
    // does about the vanished member has happened.
    tokio::time::sleep(Duration::from_secs(10)).await;
    c.settle(Duration::from_secs(10)).await;
    assert_ne!(
        c.nodes[victim].session().id(),
        session,
        "the session was not re-opened"
    );
    let after = c.leaders().await;
    let log: Vec<Logged> = c.events_since(t0);
    let mut lost_at: BTreeMap<usize, Instant> = BTreeMap::new();
    let mut relead = Duration::ZERO;
    for l in &log {
        match &l.event {
            ShardEvent::Lost {
                shard, reason, at, ..
            } => {
                assert_eq!(l.node, victim, "another node lost a shard: {l:?}");
                assert!(theirs.contains(&shard.index()), "{reason}: {l:?}");
                lost_at.insert(shard.index(), *at);
            }
            ShardEvent::Acquired { shard, at, .. } => {
                assert_eq!(
                    l.node,
                    victim,
                    "shard {} moved to {} ({} events since the fault)",
                    shard,
                    l.node,
                    log.len()
                );
                let lost = lost_at
                    .get(&shard.index())
                    .expect("acquired before its loss");
                relead = relead.max(at.saturating_duration_since(*lost));
            }
            ShardEvent::HandedOff { .. } => panic!("a handoff: {l:?}"),
        }
    }
    assert_eq!(
        lost_at.len(),
        theirs.len(),
        "every seat of the victim was lost"
    );
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().expect("led"), a.as_ref().expect("led"));
        assert_eq!(a.0, b.0, "shard {s} is led by {} now, {} before", a.0, b.0);
        if theirs.contains(&s) {
            assert!(a.1 > b.1, "shard {s}: token {} after {}", a.1, b.1);
        } else {
            assert_eq!(a.1, b.1, "shard {s} of another node was granted again");
        }
    }
    eprintln!(
        "{fault:?}: {} shards of {victim} lost and led again by it, the last {relead:?} after its loss",
        theirs.len()
    );
    // At once: not at the session's next renewal, nor at a campaign's back-off (time
    // is virtual here, and the in-memory store answers in no time).
    assert!(
        relead < c.timing.renew_interval / 2,
        "led again {relead:?} after the loss"
    );
    relead
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_session_was_revoked_leads_its_shards_again_and_nothing_moves() {
    let mem = Arc::new(MemoryBackend::new());
    let c = env(&mem).started().await;
    revoke_and_check(&c, &mem, "node-2", Fault::Revoke).await;
    // Again, on the re-opened session, and on another node.
    revoke_and_check(&c, &mem, "node-2", Fault::Revoke).await;
    revoke_and_check(&c, &mem, "node-4", Fault::Revoke).await;
    c.close_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_session_expired_in_the_store_leads_its_shards_again() {
    let mem = Arc::new(MemoryBackend::new());
    let c = env(&mem).started().await;
    revoke_and_check(&c, &mem, "node-1", Fault::Expire).await;
    c.close_all().await;
}

#[tokio::test(start_paused = true)]
async fn three_of_five_nodes_revoked_at_once_lead_their_shards_again() {
    let mem = Arc::new(MemoryBackend::new());
    let c = env(&mem).started().await;
    let before = c.leaders().await;
    let victims = ["node-0", "node-2", "node-3"];
    let sessions: Vec<String> = victims.iter().map(|v| c.nodes[*v].session().id()).collect();
    let t0 = Instant::now();
    for s in &sessions {
        assert!(mem.revoke_session(s));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    c.settle(Duration::from_secs(10)).await;
    let after = c.leaders().await;
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().expect("led"), a.as_ref().expect("led"));
        assert_eq!(a.0, b.0, "shard {s} is led by {} now, {} before", a.0, b.0);
    }
    only_victims_moved(&c, t0, &victims);
    c.close_all().await;
}

/// A node that closes (without draining first) says it is leaving before its member
/// goes: the others take its shards over at once, not after the member grace.
#[tokio::test(start_paused = true)]
async fn a_closed_node_is_let_go_at_once() {
    let mem = Arc::new(MemoryBackend::new());
    let mut c = env(&mem).started().await;
    let grace = c.nodes["node-3"].member_grace();
    assert!(!grace.is_zero());
    let before = c.leaders().await;
    let theirs = before
        .iter()
        .filter(|l| l.as_ref().is_some_and(|(id, _)| id == "node-3"))
        .count();
    let t0 = Instant::now();
    c.close("node-3").await;
    c.settle(Duration::from_secs(10)).await;
    let mut taken = 0;
    for l in c.events_since(t0) {
        if let ShardEvent::Acquired { shard, at, .. } = &l.event {
            taken += 1;
            let after = at.saturating_duration_since(t0);
            assert!(
                after < grace / 2,
                "{shard} taken by {} {after:?} after the close (grace {grace:?})",
                l.node
            );
        }
    }
    assert!(taken >= theirs, "{taken} shards taken, node-3 led {theirs}");
    c.check_balanced().await;
    c.close_all().await;
}

/// Three of five nodes revoked at once, with the store answering tries slower than it
/// takes a member value (as etcd just after its raft leader resumed): the victims'
/// shards still stay where they were, and the claims a victim's published state keeps
/// on the shards it lost to the store (until it has them again) end when it does. On
/// etcd, with the claims dropped at once, every node's plan gave the shards whose
/// best-ranked replica is another victim to that victim, which took some of them first
/// (16 of 384 moved). Here the owner's own try still goes first, so this passes
/// without the claims too: it guards the claims' ending, not their cause.
#[tokio::test(start_paused = true)]
async fn revoked_nodes_keep_their_shards_when_the_store_answers_tries_slowly() {
    let mem = Arc::new(MemoryBackend::new());
    let counting = CountingBackend::new(mem.clone(), Arc::default());
    let gauge = counting.batches();
    let mut env = ShardEnv::memory();
    env.connect = same_backend(Arc::new(counting));
    let c = env.started().await;
    let before = c.leaders().await;
    let victims = ["node-0", "node-2", "node-3"];
    let sessions: Vec<String> = victims.iter().map(|v| c.nodes[*v].session().id()).collect();
    // Slower than a member value's round trip, well within the member grace.
    let grace = c.nodes["node-0"].member_grace();
    gauge.slow_down(grace / 4);
    let t0 = Instant::now();
    for s in &sessions {
        assert!(mem.revoke_session(s));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    gauge.slow_down(Duration::ZERO);
    c.settle(Duration::from_secs(10)).await;
    let after = c.leaders().await;
    let mut moved = Vec::new();
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().expect("led"), a.as_ref().expect("led"));
        if a.0 != b.0 {
            moved.push(format!("{s}: {} -> {}", b.0, a.0));
        }
    }
    assert!(moved.is_empty(), "{} shards moved: {moved:?}", moved.len());
    only_victims_moved(&c, t0, &victims);
    c.close_all().await;
}

/// Since `t0`, only `victims` were granted or lost shards, and nothing was handed off.
fn only_victims_moved(c: &Cluster, t0: Instant, victims: &[&str]) {
    for l in c.events_since(t0) {
        match &l.event {
            ShardEvent::Acquired { .. } | ShardEvent::Lost { .. } => {
                assert!(victims.contains(&l.node.as_str()), "{l:?}")
            }
            ShardEvent::HandedOff { .. } => panic!("a handoff: {l:?}"),
        }
    }
}
