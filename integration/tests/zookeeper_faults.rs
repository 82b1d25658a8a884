//! Fault tests against a real ZooKeeper (tickTime 1000 ms) with real candidate processes
//! (the `tenure` CLI on `zk://`): SIGKILL and SIGSTOP of the holder, SIGSTOP of the
//! server longer than the deadline, a server restart with the same data directory within
//! the session timeout (leadership survives), a cut connection, and bad input
//! (unreachable server, a chroot the client may not use). Each test starts its own
//! ZooKeeper (they pause and restart it) and checks the fencing of every candidate's
//! event log.
//!
//! Run with `--test-threads=2` or fewer on small machines: every test runs a ZooKeeper
//! and two or three candidate processes. The tests that pause or restart the server need
//! a local one and say so if `TENURE_TEST_ZOOKEEPER` names an external one.

use std::time::Duration;

use tenure_core::ErrorKind;
use tenure_integration::fault_suite::{FaultSpec, Restart, TIMEOUTS};
use tenure_integration::ZooKeeperServer;
use tenure_zookeeper::ZooKeeperBackend;

/// The candidates' session TTL (= ZooKeeper session timeout; 2 s is the shortest at
/// tickTime 1000 ms).
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach ZooKeeper at `endpoint`, under the chroot `/chroot`: 1 s
/// timeouts; the server expires sessions in tickTime buckets, so failover may take up to
/// a second past the TTL.
fn spec_in(endpoint: &str, chroot: &str) -> FaultSpec {
    let url = format!("zk://{endpoint}/{chroot}?{TIMEOUTS}");
    FaultSpec::new(url, TTL, Duration::from_millis(1500))
}

tenure_integration::fault_tests!(ZooKeeperServer::start(), spec_in, restart: Restart::KeepsTheSeat);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_the_client_may_not_write_is_unauthorized() {
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    // A node anyone may read but nobody may write: a chroot below it cannot be created,
    // and an election under it cannot be joined.
    let admin = zookeeper_client::Client::connect(zk.endpoint())
        .await
        .expect("admin client");
    admin
        .create(
            "/locked",
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_read()),
        )
        .await
        .expect("create /locked");
    let err =
        ZooKeeperBackend::from_url(&format!("zk://user:s3cret-pw@{}/locked/sub", zk.endpoint()))
            .await
            .expect_err("chroot under a read-only node");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");
    let backend = ZooKeeperBackend::from_url(&format!("zk://{}/locked", zk.endpoint()))
        .await
        .expect("a readable chroot connects");
    let session = tenure_core::Session::open(
        std::sync::Arc::new(backend),
        tenure_core::Timing::from_ttl(TTL),
    )
    .await
    .expect("session");
    let err = session
        .campaign(
            &tenure_core::ElectionName::new("e").expect("name"),
            &tenure_core::Candidate::new("a").expect("id"),
        )
        .await
        .expect_err("campaign under a read-only node");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // A malformed chroot is invalid, before any connection.
    let err = ZooKeeperBackend::from_url("zk://127.0.0.1:1/a//b")
        .await
        .expect_err("bad chroot");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// A campaign whose first request meets a server that stops answering for longer than
/// the client's connection timeout (an eighth of the session timeout: a JVM pause, a
/// starved machine) but well within the session timeout keeps going: the client reports
/// the silence as an error without a code, which is a lost connection (retried), not a
/// final backend error. The waiter is then granted when the holder resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_rides_through_a_server_silent_past_the_connection_timeout() {
    use std::sync::Arc;
    use tenure_core::{Candidate, ElectionName, Session, Timing};

    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    let backend = Arc::new(
        ZooKeeperBackend::from_url(&format!("zk://{}", zk.endpoint()))
            .await
            .expect("backend"),
    );
    // Session timeout 4 s: the connection timeout is 500 ms; the silence lasts 1.5 s.
    let timing = Timing::from_ttl(Duration::from_secs(4));
    let a = Session::open(backend.clone(), timing.clone())
        .await
        .expect("session a");
    let b = Session::open(backend, timing).await.expect("session b");
    let election = ElectionName::new(tenure_core::testing::random_prefix()).expect("name");
    let held = a
        .campaign(&election, &Candidate::new("a").expect("id"))
        .await
        .expect("a leads");
    zk.pause().expect("pause");
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move {
            b.campaign(&election, &Candidate::new("b").expect("id"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    zk.resume().expect("resume");
    tokio::time::sleep(Duration::from_millis(500)).await;
    if waiter.is_finished() {
        let outcome = waiter.await.expect("waiter task");
        panic!(
            "the waiter's campaign ended during the silence: {:?}",
            outcome.map(|l| l.token())
        );
    }
    let first_token = held.token();
    held.resign().await.expect("resign");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted within 10 s of the resign")
        .expect("waiter task")
        .expect("the waiter's campaign succeeds");
    assert!(granted.token() > first_token);
}
