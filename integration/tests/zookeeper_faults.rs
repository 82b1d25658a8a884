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

use std::process::Command;
use std::time::{Duration, Instant};

use tenure_core::ErrorKind;
use tenure_integration::cli_faults::{
    assert_fenced, is, ms, spawn_writer, stop_all, tenure_bin, wait,
};
use tenure_integration::fault_suite::{self, FaultSpec};
use tenure_integration::{
    monotonic_now_ns, CandidateProcess, Event, GuardedResource, TcpProxy, ZooKeeperServer,
};
use tenure_zookeeper::ZooKeeperBackend;

/// The candidates' session TTL (= ZooKeeper session timeout; 2 s is the shortest at
/// tickTime 1000 ms).
const TTL: Duration = Duration::from_secs(2);
/// The CLI's default renew deadline for that TTL (TTL × 2/3).
const RENEW_DEADLINE: Duration = Duration::from_millis(1333);
/// How often a leader's command writes its token to the guarded resource.
const WRITE_EVERY: Duration = Duration::from_millis(100);
fn candidate(
    backend_url: &str,
    election: &str,
    id: &str,
    resource: &GuardedResource,
) -> CandidateProcess {
    spawn_writer(backend_url, election, id, TTL, resource, WRITE_EVERY)
}

fn candidate_with_ttl(
    backend_url: &str,
    election: &str,
    id: &str,
    resource: &GuardedResource,
    ttl: Duration,
) -> CandidateProcess {
    spawn_writer(backend_url, election, id, ttl, resource, WRITE_EVERY)
}

fn url(endpoint: &str) -> String {
    format!("zk://{endpoint}/faults?connect_timeout=1s&request_timeout=1s")
}

/// The shared fault scenarios' settings for this store: the server expires sessions
/// in tickTime buckets, up to 1 s after the timeout.
fn spec(zk: &ZooKeeperServer) -> FaultSpec {
    FaultSpec::new(url(zk.endpoint()), TTL, Duration::from_millis(1500))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_the_session_timeout() {
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    fault_suite::sigkill_of_the_holder(&spec(&zk)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_for_two_session_timeouts() {
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    fault_suite::sigstop_of_the_holder(&spec(&zk)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_zookeeper_fires_lost_before_the_session_could_expire() {
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    fault_suite::sigstop_of_the_store(&spec(&zk), &zk).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_within_the_session_timeout_keeps_leadership() {
    let mut zk = ZooKeeperServer::start().await.expect("zookeeper");
    assert!(
        !zk.is_external(),
        "this test restarts the server: unset {}",
        ZooKeeperServer::ENV
    );
    let resource = GuardedResource::start().await.expect("resource");
    let url = url(zk.endpoint());
    let election = "faults/restart";
    // A 10 s session (deadline 6.7 s) outlives a restart of about a second.
    let ttl = Duration::from_secs(10);
    let a = candidate_with_ttl(&url, election, "a", &resource, ttl);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(10)).await;
    let b = candidate_with_ttl(&url, election, "b", &resource, ttl);
    wait(&b, is("campaigning"), Duration::from_secs(10)).await;
    let t0 = Instant::now();
    zk.kill().await.expect("kill zookeeper");
    zk.restart().await.expect("restart zookeeper");
    let down = t0.elapsed();
    // Well past reconnecting, still within the deadline had the renewals failed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("ZooKeeper restart: down for {down:?}");
    assert!(
        !a.events().iter().any(|e| e.is(Event::LOST)),
        "the holder lost leadership across a {down:?} restart: {:?}\n{}",
        a.events(),
        a.stderr_tail()
    );
    assert!(
        !b.events().iter().any(|e| e.is(Event::ELECTED)),
        "the waiter was elected"
    );
    let backend = ZooKeeperBackend::from_url(&url).await.expect("connect");
    let leader = tenure_core::Backend::leader(
        &backend,
        &tenure_core::ElectionName::new(election).expect("name"),
    )
    .await
    .expect("leader")
    .expect("a leader");
    assert_eq!(
        (leader.id.as_str(), Some(leader.token.get())),
        ("a", a_elected.token)
    );
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_fires_lost_and_campaigns_resume() {
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    let resource = GuardedResource::start().await.expect("resource");
    let proxy = TcpProxy::start(zk.addr()).await.expect("proxy");
    let direct = url(zk.endpoint());
    let through_proxy = url(&proxy.addr().to_string());
    let election = "faults/cut";
    let a = candidate(&through_proxy, election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(10)).await;
    let mut b = candidate(&direct, election, "b", &resource);
    wait(&b, is("campaigning"), Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = monotonic_now_ns();
    proxy.cut().await.expect("cut");
    let lost = wait(&a, is(Event::LOST), TTL + Duration::from_secs(1)).await;
    let b_elected = wait(&b, is(Event::ELECTED), TTL * 2).await;
    assert!(lost.mono_ns <= b_elected.mono_ns);
    assert!(lost.mono_ns <= cut + RENEW_DEADLINE.as_nanos() as u64);
    proxy.heal().await.expect("heal");
    tokio::time::sleep(TTL).await;
    b.terminate().await.expect("terminate b");
    let again = wait(
        &a,
        |e| e.is(Event::ELECTED) && e.mono_ns > lost.mono_ns,
        TTL * 3,
    )
    .await;
    eprintln!(
        "cut: lost {:.0} ms after the cut, b elected {:.0} ms after it",
        ms(lost.mono_ns - cut),
        ms(b_elected.mono_ns - cut)
    );
    assert!(again.token > b_elected.token);
    assert!(b_elected.token > a_elected.token);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_fast_with_the_right_kind() {
    let limit = Duration::from_millis(700);
    // Nothing listens: refused.
    let port = tenure_integration::free_port().expect("port");
    let started = Instant::now();
    let err = ZooKeeperBackend::from_url(&format!(
        "zk://127.0.0.1:{port}/x?connect_timeout={}ms",
        limit.as_millis()
    ))
    .await
    .expect_err("nothing listens");
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
    // Something accepts but never answers: a timeout, not a hang.
    let zk = ZooKeeperServer::start().await.expect("zookeeper");
    let proxy = TcpProxy::start(zk.addr()).await.expect("proxy");
    proxy.blackhole().await.expect("blackhole");
    let started = Instant::now();
    let err = ZooKeeperBackend::from_url(&format!(
        "zk://{}/x?connect_timeout={}ms",
        proxy.addr(),
        limit.as_millis()
    ))
    .await
    .expect_err("black hole");
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
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
    // The CLI reports an unreachable server on one line and exits 1.
    let bin = tenure_bin();
    let started = Instant::now();
    let out = Command::new(bin)
        .args([
            "campaign",
            "--backend",
            &format!("zk://127.0.0.1:{port}/x?connect_timeout=700ms"),
            "--election",
            "x",
            "--id",
            "a",
        ])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("tenure: unavailable") || stderr.starts_with("tenure: timeout"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}
