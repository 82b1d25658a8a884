//! The engine's primitive suite on etcd, and the store round trips for the election
//! operations, counted in the backend's client (every message it sends to etcd: unary
//! calls, streams opened, keep-alives and watches sent on open streams, renewals
//! included): a grant (campaign on a free seat), a join (campaign behind a holder), a
//! release (resign with a waiter, until the waiter holds the seat), and a batch of 64
//! tries on free seats. Printed as a table, never asserted.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{DynBackend, ElectionName};
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

/// The primitive suite of the election engine against the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primitives_keep_their_contract() {
    let backend = backend().await;
    let prefix = tenure_integration::run_prefix();
    tenure_core::testing::primitives::check_primitives(backend.primitives(), prefix).await;
}

/// etcd refuses a whole transaction that puts a key on an ended lease; reads and
/// writes that share one with such a write are answered all the same (before, a read
/// that shared it failed with `SessionExpired`, which ends a campaign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_an_ended_session_fails_alone() {
    use tenure_core::engine::{Candidacy, Op, Token, Write};
    let backend = backend().await;
    let store = backend.primitives();
    let ttl = Duration::from_secs(30);
    let (dead, live) = (
        store.open(ttl).await.expect("open"),
        store.open(ttl).await.expect("open"),
    );
    store.revoke(&dead).await.expect("revoke");
    let put = |session: &str| Write {
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
    };
    for i in 0..20 {
        let (e1, e2, e3) = (
            election(&format!("alone/{i}/a")),
            election(&format!("alone/{i}/b")),
            election(&format!("alone/{i}/c")),
        );
        let (doomed_put, live_put) = (put(&dead), put(&live));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation() {
    let backend = backend().await;
    let dyn_backend: DynBackend = Arc::new(backend.clone());
    tenure_integration::print_round_trips(dyn_backend, "etcd", || backend.round_trips()).await;
}
