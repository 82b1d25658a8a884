//! The engine's primitive suite on etcd, and the store round trips for the election
//! operations, counted in the backend's client (every message it sends to etcd: unary
//! calls, streams opened, keep-alives and watches sent on open streams, renewals
//! included): a grant (campaign on a free seat), a join (campaign behind a holder), a
//! release (resign with a waiter, until the waiter holds the seat), and a batch of 64
//! tries on free seats. Printed as a table, never asserted.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{Candidate, DynBackend, ElectionName, Session};
use tenure_etcd::EtcdBackend;
use tenure_integration::{timing_ms, EtcdServer};

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

/// Round trips sent while `f` runs and for 300 ms after (the follow loops it starts).
async fn counted<T>(backend: &EtcdBackend, f: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = backend.round_trips();
    let out = f.await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (out, backend.round_trips() - before)
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
    // Renewals every 20 s: none falls inside a measurement.
    let timing = timing_ms(60_000, 20_000, 50_000, 1000);
    let open = || Session::open(dyn_backend.clone(), timing.clone());
    let (a, b, c) = (
        open().await.expect("open"),
        open().await.expect("open"),
        open().await.expect("open"),
    );
    let e = election("rt");
    let cand = |id: &str| Candidate::new(id).expect("candidate");
    let (held, grant) = counted(&backend, a.campaign(&e, &cand("a"))).await;
    let held = held.expect("granted");
    let queue = async {
        let (b, e, cb) = (b.clone(), e.clone(), cand("b"));
        let waiting = tokio::spawn(async move { b.campaign(&e, &cb).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        (waiting,)
    };
    let (waiting, join) = counted(&backend, queue).await;
    let release = async {
        held.resign().await.expect("resign");
        waiting.0.await.expect("join").expect("granted")
    };
    let (next, release) = counted(&backend, release).await;
    let seats: Vec<(ElectionName, Candidate)> = (0..64)
        .map(|i| (election(&format!("rt-many-{i}")), cand("c")))
        .collect();
    let (many, batch) = counted(&backend, c.try_campaign_many(&seats)).await;
    let many = many.expect("tries");
    assert_eq!(many.iter().flatten().count(), 64, "64 free seats taken");
    eprintln!("| operation | etcd round trips |");
    eprintln!("|---|---|");
    eprintln!("| grant (campaign on a free seat) | {grant} |");
    eprintln!("| join (campaign behind a holder) | {join} |");
    eprintln!("| release (resign with a waiter, until it holds) | {release} |");
    eprintln!("| try_campaign_many, 64 free seats | {batch} |");
    drop((next, many));
    for s in [a, b, c] {
        s.close().await.expect("close");
    }
}
