//! A session's campaigns for many seats at once on a real etcd: their writes and reads
//! go out many per transaction (counted as etcd's unary requests: the waits are
//! watches on one shared stream), and a campaign withdrawn while its write waits for
//! (or is in) a transaction leaves no candidacy behind.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::{BackendSession, SessionEvent, SessionEvents};
use tenure_core::{Backend, Candidate, ElectionName};
use tenure_etcd::EtcdBackend;
use tenure_integration::membership::{etcd_backend, name, open};
use tenure_integration::EtcdServer;

const SEATS: usize = 300;

async fn backend() -> (EtcdServer, EtcdBackend) {
    etcd_backend("connect_timeout_ms=2000&request_timeout_ms=5000").await
}

fn seats(tag: &str) -> Vec<ElectionName> {
    (0..SEATS)
        .map(|i| name(&format!("{tag}/s{i:04}")))
        .collect()
}

fn candidate(id: &str) -> Candidate {
    Candidate::new(id).expect("candidate")
}

/// A server, a backend, [`SEATS`] elections named after `tag` all held by one session,
/// and a second session to wait for them.
async fn held_by_one(
    tag: &str,
) -> (
    EtcdServer,
    EtcdBackend,
    Vec<ElectionName>,
    Arc<dyn BackendSession>,
    Arc<dyn BackendSession>,
) {
    let (server, b) = backend().await;
    let elections = seats(tag);
    let holder = open(&b, Duration::from_secs(30)).await;
    hold_all(&holder, &elections).await;
    let waiter = open(&b, Duration::from_secs(30)).await;
    (server, b, elections, holder, waiter)
}

/// `holder` takes every seat at once.
async fn hold_all(holder: &Arc<dyn BackendSession>, elections: &[ElectionName]) {
    let c = candidate("holder");
    let asks: Vec<(ElectionName, Candidate)> =
        elections.iter().map(|e| (e.clone(), c.clone())).collect();
    let got = holder.try_campaign_many(&asks).await.expect("take all");
    assert!(got.iter().all(Option::is_some), "the seats were free");
}

/// A campaign of `waiter` as candidate "waiter" for every election, each in a task.
fn campaign_for_all(
    waiter: &Arc<dyn BackendSession>,
    elections: &[ElectionName],
) -> Vec<tokio::task::JoinHandle<tenure_core::Result<tenure_core::FencingToken>>> {
    elections
        .iter()
        .map(|e| {
            let (w, e) = (waiter.clone(), e.clone());
            tokio::spawn(async move { w.campaign(&e, &candidate("waiter")).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiting_campaigns_are_each_granted_once_their_holder_resigns() {
    let (_server, b, elections, holder, waiter) = held_by_one("granted").await;
    let count = || b.unary_calls();
    let before = count();
    let tasks = campaign_for_all(&waiter, &elections);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Joining: a few transactions, where campaigns on their own make two per seat (the
    // first write, decided on an empty election, and the join).
    let joined = count() - before;
    for e in &elections {
        let leader = b.leader(e).await.expect("leader").expect("a leader");
        assert_eq!(leader.id, "holder", "{e}");
    }
    assert!(
        tasks.iter().all(|t| !t.is_finished()),
        "a campaign ended early"
    );
    let before = count();
    let grants: Vec<_> = elections.iter().map(|e| (e.clone(), None)).collect();
    holder.resign_many(&grants).await.expect("resign");
    let mut tokens = Vec::new();
    for t in tasks {
        let token = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("granted in time")
            .expect("task")
            .expect("campaign");
        tokens.push(token);
    }
    // Taking over: the releases grant the waiters in their writes; each waiter wakes
    // and reads, the reads shared by few transactions.
    let granted = count() - before;
    for (e, token) in elections.iter().zip(&tokens) {
        let leader = b.leader(e).await.expect("leader").expect("a leader");
        assert_eq!(leader.id, "waiter");
        assert_eq!(leader.token, *token);
    }
    println!("{SEATS} waiting campaigns: {joined} requests to join, {granted} to take over");
    assert!(joined < SEATS as u64 / 4, "{joined} requests to join");
    assert!(
        granted < SEATS as u64 * 3 / 2,
        "{granted} requests to take over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_campaign_leaves_no_key_in_the_queue() {
    let (_server, b, elections, holder, waiter) = held_by_one("withdrawn").await;
    // Start a campaign for every seat and withdraw each a moment later, as the core
    // does with a dropped campaign: abort, then resign whatever the session has.
    let tasks = campaign_for_all(&waiter, &elections);
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    for t in &tasks {
        t.abort();
    }
    let withdrawn: Vec<_> = elections.iter().map(|e| (e.clone(), None)).collect();
    waiter.resign_many(&withdrawn).await.expect("withdraw");
    // Parts already sent come back and are withdrawn by the session.
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.resign_many(&withdrawn).await.expect("resign");
    let mut left = Vec::new();
    for e in &elections {
        if let Some(l) = b.leader(e).await.expect("leader") {
            left.push(format!("{e}: {}", l.id));
        }
    }
    assert!(
        left.is_empty(),
        "{} seats led by a withdrawn campaign's key: {:?}",
        left.len(),
        &left[..left.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_losses_of_a_revoked_lease_are_confirmed_in_few_requests() {
    let (_server, b) = backend().await;
    let elections = seats("revoked");
    let (events, mut lost) = SessionEvents::channel();
    let holder = b
        .open_session(Duration::from_secs(30), events)
        .await
        .expect("open");
    hold_all(&holder, &elections).await;
    let before = b.unary_calls();
    // The lease goes with every key on it, as when it expires: each held key's
    // deletion reaches its watch, and each is read before it is reported lost.
    b.revoke_session(holder.id()).await.expect("revoke");
    let mut reported = 0;
    while reported < SEATS {
        match tokio::time::timeout(Duration::from_secs(20), lost.recv()).await {
            Ok(Some(SessionEvent::ElectionLost { .. })) => reported += 1,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("{reported} of {SEATS} losses reported"),
        }
    }
    let spent = b.unary_calls() - before;
    println!("{SEATS} losses confirmed in {spent} requests");
    // One read per loss would be 300; they share transactions.
    assert!(spent < SEATS as u64 / 4, "{spent} requests");
}
