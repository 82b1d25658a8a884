//! Fault tests against a real etcd with real candidate processes (the `tenure` CLI):
//! SIGKILL and SIGSTOP of the holder, SIGSTOP and restart of etcd, a cut connection,
//! and bad input (unreachable endpoint, wrong password). Each test starts its own etcd
//! (they pause and restart it) and checks the fencing of every candidate's event log.
//!
//! Run with `--test-threads=2` or fewer on small machines: every test runs an etcd and
//! two or three candidate processes. The tests that pause, restart or reconfigure etcd
//! need a local server and say so if `TENURE_TEST_ETCD` names an external one.

use std::process::Command;
use std::time::{Duration, Instant};

use tenure_core::ErrorKind;
use tenure_etcd::EtcdBackend;
use tenure_integration::cli_faults::{
    assert_fenced, is, ms, next_leader, spawn_writer, stop_all, tenure_bin, wait,
};
use tenure_integration::fault_suite::{self, FaultSpec};
use tenure_integration::{
    monotonic_now_ns, CandidateProcess, EtcdServer, Event, GuardedResource, TcpProxy,
};

/// The candidates' session TTL.
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

fn url(endpoint: &str) -> String {
    let host = endpoint.trim_start_matches("http://");
    format!("etcd://{host}?prefix=faults&connect_timeout_ms=1000&request_timeout_ms=1000")
}

/// The shared fault scenarios' settings for this store.
fn spec(etcd: &EtcdServer) -> FaultSpec {
    FaultSpec::new(url(etcd.endpoint()), TTL, Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_ttl() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigkill_of_the_holder(&spec(&etcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_for_two_ttls() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigstop_of_the_holder(&spec(&etcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_etcd_fires_lost_before_the_lease_could_expire() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigstop_of_the_store(&spec(&etcd), &etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_campaigns_resume() {
    let mut etcd = EtcdServer::start().await.expect("etcd");
    let resource = GuardedResource::start().await.expect("resource");
    let url = url(etcd.endpoint());
    let election = "faults/restart";
    let a = candidate(&url, election, "a", &resource);
    let b = candidate(&url, election, "b", &resource);
    let (_, first) = next_leader(&[&a, &b], 0, Duration::from_secs(10)).await;
    etcd.kill().await.expect("kill etcd");
    let down = monotonic_now_ns();
    // Down longer than the TTL: the holder must give up at its deadline.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    etcd.restart().await.expect("restart etcd");
    let (_, again) = next_leader(&[&a, &b], down, TTL * 5).await;
    eprintln!(
        "etcd restart: leader again {:.0} ms after etcd came back",
        ms(again.mono_ns.saturating_sub(down)) - (TTL.as_millis() + 500) as f64
    );
    assert!(again.token > first.token, "tokens continue after a restart");
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_campaigns_resume() {
    let etcd = EtcdServer::start().await.expect("etcd");
    let resource = GuardedResource::start().await.expect("resource");
    let proxy = TcpProxy::start(etcd.addr()).await.expect("proxy");
    let direct = url(etcd.endpoint());
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
    // a campaigns again by itself; once b leaves, a leads with a new token.
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
async fn unreachable_endpoint_fails_within_the_connect_timeout() {
    let limit = Duration::from_millis(700);
    // Nothing listens: refused.
    let port = tenure_integration::free_port().expect("port");
    let started = Instant::now();
    let err = EtcdBackend::from_url(&format!(
        "etcd://127.0.0.1:{port}?connect_timeout_ms={}",
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
    // Something accepts but never answers (a black hole): a timeout, not a hang.
    let etcd = EtcdServer::start().await.expect("etcd");
    let proxy = TcpProxy::start(etcd.addr()).await.expect("proxy");
    proxy.blackhole().await.expect("blackhole");
    let started = Instant::now();
    let err = EtcdBackend::from_url(&format!(
        "etcd://{}?connect_timeout_ms={}",
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
    // The CLI reports it on one line and exits 1.
    let started = Instant::now();
    let out = Command::new(tenure_bin())
        .args([
            "campaign",
            "--backend",
            &format!("etcd://127.0.0.1:{port}?connect_timeout_ms=700"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_unauthorized() {
    let etcd = EtcdServer::start().await.expect("etcd");
    assert!(
        !etcd.is_external(),
        "this test turns authentication on, so it needs a local etcd: unset {}",
        EtcdServer::ENV
    );
    let password = "right-Pa55word";
    etcd.enable_auth(password).expect("etcd auth");
    let host = etcd.addr();
    let err = EtcdBackend::from_url(&format!("etcd://root:wrong-pw@{host}"))
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!err.to_string().contains("wrong-pw"), "{err}");
    let err = EtcdBackend::from_url(&format!("etcd://{host}"))
        .await
        .expect_err("no credentials");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // The right password works end to end.
    let backend =
        EtcdBackend::from_url(&format!("etcd://{host}?username=root&password={password}"))
            .await
            .expect("right password");
    let session = tenure_core::Session::open(
        std::sync::Arc::new(backend),
        tenure_core::Timing::from_ttl(TTL),
    )
    .await
    .expect("session");
    let election = tenure_core::ElectionName::new("auth/check").expect("name");
    let l = session
        .campaign(&election, &tenure_core::Candidate::new("a").expect("id"))
        .await
        .expect("campaign");
    l.resign().await.expect("resign");
    session.close().await.expect("close");
    // The CLI says so on one line and exits 1.
    let out = Command::new(tenure_bin())
        .args([
            "campaign",
            "--backend",
            &format!("etcd://root:wrong-pw@{host}"),
            "--election",
            "x",
            "--id",
            "a",
        ])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("tenure: unauthorized"), "{stderr}");
    assert!(!stderr.contains("wrong-pw"), "{stderr}");
}
