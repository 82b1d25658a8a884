//! The engine's primitive suite on PostgreSQL, and the store round trips for the
//! election operations, counted in the
//! backend's client (every statement it sends on its request connection, renewals
//! included): a grant (campaign on a free seat), a join (campaign behind a holder), a
//! release (resign with a waiter, until the waiter holds the seat), and a batch of 64
//! tries on free seats. Printed as a table, never asserted.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{Candidate, DynBackend, ElectionName, Session};
use tenure_integration::{timing_ms, PostgresServer};
use tenure_postgres::PostgresBackend;

tenure_integration::shared_server!(PostgresServer, "PostgreSQL");

fn url(endpoint: &str) -> String {
    let query = "schema=tenure_test&connect_timeout_ms=1000&request_timeout_ms=1000";
    tenure_integration::with_query(endpoint, query)
}

async fn backend() -> PostgresBackend {
    let (endpoint, server) = shared_server();
    match PostgresBackend::from_url(&url(&endpoint)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to PostgreSQL at {server}: {e}"),
    }
}

fn election(name: &str) -> ElectionName {
    let prefix = tenure_integration::run_prefix();
    ElectionName::new(format!("{prefix}/{name}")).expect("a valid name")
}

/// Round trips sent while `f` runs and for 300 ms after (the follow loops it starts).
async fn counted<T>(
    backend: &PostgresBackend,
    f: impl std::future::Future<Output = T>,
) -> (T, u64) {
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
        // The campaign, still waiting, to be awaited after the release.
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
    eprintln!("| operation | PostgreSQL round trips |");
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

/// Ten backends connecting at once to a schema that does not exist yet: one creates
/// it, the others find it created under the advisory lock and leave it be, and every
/// one of them works. (When each one that had read "missing" ran the file again, it
/// dropped the functions the first ones were calling: "cache lookup failed for
/// function".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_connect_at_once_create_the_schema_once() {
    let (endpoint, server) = shared_server();
    let schema = format!("fresh_{:x}", tenure_core::backend::random_id() as u32);
    let query = format!("schema={schema}&connect_timeout_ms=5000&request_timeout_ms=5000");
    let url = tenure_integration::with_query(&endpoint, &query);
    let nodes = (0..10).map(|i| {
        let url = url.clone();
        async move {
            let b: DynBackend = Arc::new(PostgresBackend::from_url(&url).await?);
            let s = Session::open(b, timing_ms(2000, 500, 1500, 1000)).await?;
            let e = election(&format!("fresh/{i}"));
            s.try_campaign(&e, &Candidate::new("n").expect("id")).await
        }
    });
    for (i, r) in futures::future::join_all(nodes)
        .await
        .into_iter()
        .enumerate()
    {
        if let Err(e) = r {
            panic!("node {i} at {server}: {e}");
        }
    }
}
