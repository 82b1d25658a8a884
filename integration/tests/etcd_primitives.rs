//! The engine's primitive suite on etcd, and the store round trips for the election
//! operations, counted in the backend's client (every message it sends to etcd: unary
//! calls, streams opened, keep-alives and watches sent on open streams, renewals
//! included): a grant (campaign on a free seat), a join (campaign behind a holder), a
//! release (resign with a waiter, until the waiter holds the seat), and a batch of 64
//! tries on free seats. Printed as a table, never asserted.

use std::time::Duration;

use tenure_core::ElectionName;
use tenure_etcd::EtcdBackend;
use tenure_integration::EtcdServer;

tenure_integration::shared_server!(EtcdServer, "etcd");

async fn backend() -> EtcdBackend {
    let (endpoint, server) = shared_server();
    let hosts = endpoint.trim_start_matches("http://");
    let url = format!(
        "etcd://{hosts}?prefix=tenure-prims&connect_timeout_ms=1000&request_timeout_ms=1000"
    );
    match EtcdBackend::from_url(&url).await {
        Ok(b) => b,
        Err(e) => panic!("connect to etcd at {server}: {e}"),
    }
}

fn election(name: &str) -> ElectionName {
    let prefix = tenure_integration::run_prefix();
    ElectionName::new(format!("{prefix}/{name}")).expect("a valid name")
}

tenure_integration::primitive_tests!(backend(), "etcd", round_trips);

/// etcd refuses a whole transaction that puts a key on an ended lease; reads and
/// writes that share one with such a write are answered all the same (before, a read
/// that shared it failed with `SessionExpired`, which ends a campaign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_an_ended_session_fails_alone() {
    let backend = backend().await;
    let store = backend.primitives();
    let ttl = Duration::from_secs(30);
    let (dead, live) = (
        store.open(ttl).await.expect("open"),
        store.open(ttl).await.expect("open"),
    );
    store.revoke(&dead).await.expect("revoke");
    for i in 0..20 {
        let (e1, e2, e3) = (
            election(&format!("alone/{i}/a")),
            election(&format!("alone/{i}/b")),
            election(&format!("alone/{i}/c")),
        );
        let (doomed_put, live_put) = (waiter(&dead, 0), waiter(&live, 0));
        let (first, doomed, read, mine) = tokio::join!(
            store.read(&e1),
            store.commit(&e2, &doomed_put),
            store.read(&e3),
            store.commit(&e1, &live_put),
        );
        first.expect("a read beside it");
        read.expect("a read beside it");
        let (done, _) = doomed.expect("answered");
        assert!(!done, "a put of an ended session committed");
        let (done, after) = mine.expect("a write beside it");
        assert!(done && after.record(&live).is_some(), "{after:?}");
    }
}

/// A batch of writes of an ended session costs a few round trips, whatever its size.
/// A session's tries can meet its own end (the shard manager re-takes its seats as
/// soon as it learns of the loss, and the tries may go through the ended session):
/// etcd refused the whole shared transaction ("requested lease not found"), and each
/// of the 64 writes went again alone and was read back alone, 129 round trips, about
/// 2 s with 128 seats in the fleet test (`fleet_stall`), past the shard manager's
/// member grace. Each write now compares its sessions' keys, so it fails on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_writes_of_an_ended_session_costs_a_few_round_trips() {
    let backend = backend().await;
    let store = backend.primitives();
    let ttl = Duration::from_secs(30);
    let (dead, live) = (
        store.open(ttl).await.expect("open"),
        store.open(ttl).await.expect("open"),
    );
    // 64 elections, each written once by the live session (its revision is not 0).
    let elections: Vec<ElectionName> = (0..64)
        .map(|i| election(&format!("ended-batch/{i}")))
        .collect();
    let writes: Vec<_> = elections
        .iter()
        .map(|e| (e.clone(), waiter(&live, 0)))
        .collect();
    let made = store.commit_many(&writes).await.expect("commit");
    assert!(made.iter().all(|(done, _)| *done), "{made:?}");
    store.revoke(&dead).await.expect("revoke");
    let writes: Vec<_> = elections
        .iter()
        .zip(&made)
        .map(|(e, (_, snap))| (e.clone(), waiter(&dead, snap.revision)))
        .collect();
    let before = backend.round_trips();
    let answers = store.commit_many(&writes).await.expect("answered");
    let spent = backend.round_trips() - before;
    println!("64 writes of an ended session: {spent} round trips");
    for ((_, write), (done, after)) in writes.iter().zip(&answers) {
        assert!(!done, "a put of an ended session committed");
        assert_eq!(after.revision, write.revision, "{after:?}");
        assert!(after.record(&dead).is_none() && after.record(&live).is_some());
    }
    assert!(
        spent <= 4,
        "64 writes of an ended session cost {spent} round trips"
    );
}

/// A write at `revision` that puts `session`'s record as a waiter.
fn waiter(session: &str, revision: u64) -> tenure_core::engine::Write {
    use tenure_core::engine::{Candidacy, Op, Token, Write};
    Write {
        revision,
        ops: vec![Op::Put {
            candidacy: Candidacy {
                session: session.to_string(),
                candidate: "c".into(),
                value: String::new(),
                priority: 0,
                preemptible: false,
            },
            token: Token::None,
            told: false,
            chosen: false,
            inherited: None,
        }],
        ..Write::default()
    }
}
