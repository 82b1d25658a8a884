//! The whole election contract against a real PostgreSQL: one server for this test
//! binary (or the one named by `TENURE_TEST_POSTGRES`), a random election prefix per
//! test, a TTL of 1 s, and faults injected through a TCP proxy (disconnect: black hole)
//! and by dropping the session's row through the main backend (expiry). Then what the
//! backend promises beyond the contract: the schema's version check, a grant refused
//! by the database itself, renewal cost.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::testing::Env;
use tenure_core::{Candidate, DynBackend, ErrorKind, Session};
use tenure_integration::{timing_ms, PostgresServer, ProxyFaults};
use tenure_postgres::PostgresBackend;

tenure_integration::shared_server!(PostgresServer, "PostgreSQL");

/// The test settings appended to a `postgres://…` endpoint.
fn url(endpoint: &str, schema: &str) -> String {
    let query = format!("schema={schema}&connect_timeout_ms=1000&request_timeout_ms=1000");
    tenure_integration::with_query(endpoint, &query)
}

async fn postgres_env() -> Env {
    let (endpoint, server) = shared_server();
    let backend = match PostgresBackend::from_url(&url(&endpoint, "tenure_test")).await {
        Ok(b) => b,
        Err(e) => panic!("connect to PostgreSQL at {server}: {e}"),
    };
    let faults = ProxyFaults::new(&endpoint, server, |at| async move {
        Ok(Arc::new(PostgresBackend::from_url(&url(&at, "tenure_test")).await?) as DynBackend)
    });
    let main = backend.clone();
    let faults = faults.expire_with(move |id| {
        let backend = main.clone();
        async move { backend.expire_session(&id).await }
    });
    // TTL 1 s, renew every 100 ms, leadership valid for 600 ms after the last
    // confirmed renewal was sent.
    faults.env(Arc::new(backend), timing_ms(1000, 100, 600, 1000), 500)
}

tenure_core::conformance_tests!(postgres_env());

/// Runs `sql` with `psql` as the harness's user; returns whether it succeeded and
/// what it printed on stderr.
async fn psql(sql: &str) -> (bool, String) {
    let (endpoint, _) = shared_server();
    let psql = PostgresServer::psql_program().expect("psql");
    let out = tokio::process::Command::new(psql)
        .args([endpoint.as_str(), "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
        .output()
        .await
        .expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A schema left by a newer tenure is refused, naming both versions.
#[tokio::test]
async fn a_newer_schema_is_refused() {
    let (endpoint, _) = shared_server();
    let schema = format!("t_{}", tenure_integration::run_prefix().replace('-', "_"));
    PostgresBackend::from_url(&url(&endpoint, &schema))
        .await
        .expect("first connect creates the schema");
    let (ok, why) = psql(&format!("UPDATE {schema}.meta SET version = 99")).await;
    assert!(ok, "{why}");
    let e = PostgresBackend::from_url(&url(&endpoint, &schema))
        .await
        .expect_err("a schema of version 99");
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(e.to_string().contains("version 99"), "{e}");
    let (ok, why) = psql(&format!("DROP SCHEMA {schema} CASCADE")).await;
    assert!(ok, "{why}");
}

/// The database refuses a second holder whatever a function does: a holder row
/// written by hand beside a real one fails on the partial unique index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_a_second_holder() {
    let env = postgres_env().await;
    let election = env.election("second");
    let session = env.session().await;
    let leader = session
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .expect("campaign");
    let (ok, why) = psql(&format!(
        "INSERT INTO tenure_test.candidacies (election, session, candidate, value, priority, \
         preemptible, token) VALUES ('{}', 'forged', 'b', '', 0, true, 1)",
        election.as_str()
    ))
    .await;
    assert!(!ok, "a second holder row was accepted");
    assert!(why.contains("candidacies_one_holder"), "{why}");
    assert!(leader.is_leader());
}

/// Crash failover when the waiter that was first in line left before the crash: the
/// next waiter must learn that it is now first, so that it looks again at the holder's
/// expiry (read from its row), not when some renewal clears the dead session away.
/// The holder renews every 100 ms, so its row expires about a TTL after the crash;
/// the waiters renew only every 2.5 s, so the second way would be up to 2.5 s late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_the_first_waiter_left() {
    let env = postgres_env().await;
    let open = |renew| {
        let backend = env.backend.clone();
        async move {
            let timing = timing_ms(4000, renew, 3000, 1000);
            Session::open(backend, timing).await.expect("session")
        }
    };
    let election = env.election("first-left");
    let (a, b, c) = (open(100).await, open(2500).await, open(2500).await);
    let held = a
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .expect("a");
    let queue = |s: Session, id: &'static str| {
        let election = election.clone();
        tokio::spawn(async move { s.campaign(&election, &Candidate::new(id).unwrap()).await })
    };
    let first = queue(b.clone(), "b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = queue(c.clone(), "c");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // b leaves the queue (its session closes), then a's process dies.
    first.abort();
    b.close().await.expect("close b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let crashed = tokio::time::Instant::now();
    a.abandon();
    let granted = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("c granted within 10 s")
        .expect("join")
        .expect("campaign");
    let gap = crashed.elapsed();
    assert!(granted.token() > held.token());
    // a's row expires within the TTL after the crash; c looks again 1 ms after that.
    assert!(
        gap < Duration::from_millis(4000 + 300),
        "c was granted {gap:?} after the crash (TTL 4 s)"
    );
    eprintln!("c granted {gap:?} after the holder crashed (TTL 4 s)");
}
