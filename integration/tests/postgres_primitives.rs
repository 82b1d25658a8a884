//! The engine's primitive suite on PostgreSQL, and the store round trips for the
//! election operations, counted in the
//! backend's client (every statement it sends on its request connection, renewals
//! included): a grant (campaign on a free seat), a join (campaign behind a holder), a
//! release (resign with a waiter, until the waiter holds the seat), and a batch of 64
//! tries on free seats. Printed as a table, never asserted.

use std::sync::Arc;

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

tenure_integration::primitive_tests!(backend(), "PostgreSQL", round_trips);

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
