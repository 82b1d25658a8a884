//! The shared fault scenarios (`fault_suite`) against a real ZooKeeper (tickTime
//! 1000 ms), a restart within the session timeout (leadership survives) included, plus a
//! chroot the client may not use and a server silent past the connection timeout.

use std::time::Duration;

use tenure_core::ErrorKind;
use tenure_integration::cluster_faults::{election, lead_in, session, spawn_campaign, wait_grant};
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
    // The session's node cannot be made there (the default layout): refused when the
    // session opens; else when it campaigns.
    let timing = tenure_core::Timing::from_ttl(TTL);
    let err = match tenure_core::Session::open(std::sync::Arc::new(backend), timing).await {
        Err(e) => e,
        Ok(session) => session
            .campaign(
                &tenure_core::ElectionName::new("e").expect("name"),
                &tenure_core::Candidate::new("a").expect("id"),
            )
            .await
            .expect_err("campaign under a read-only node"),
    };
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
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    let url = format!("zk://{}", zk.endpoint());
    let backend = std::sync::Arc::new(ZooKeeperBackend::from_url(&url).await.expect("backend"));
    // Session timeout 4 s: the connection timeout is 500 ms; the silence lasts 1.5 s.
    let ttl = Duration::from_secs(4);
    let (a, b) = (
        session(backend.clone(), ttl).await,
        session(backend, ttl).await,
    );
    let election = election("silent");
    let held = lead_in(&a, &election).await;
    zk.pause().expect("pause");
    let waiter = spawn_campaign(b, &election, tenure_core::Candidate::new("b").expect("id"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    zk.resume().expect("resume");
    tokio::time::sleep(Duration::from_millis(500)).await;
    if waiter.is_finished() {
        let (outcome, _) = waiter.await.expect("waiter task");
        let token = outcome.map(|l| l.token());
        panic!("the waiter's campaign ended during the silence: {token:?}");
    }
    let first_token = held.token();
    held.resign().await.expect("resign");
    let within = "the waiter is granted within 10 s of the resign";
    let (granted, _) = wait_grant(waiter, Duration::from_secs(10), within).await;
    assert!(granted.token() > first_token);
}
