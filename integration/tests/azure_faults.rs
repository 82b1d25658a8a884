//! Fault tests against Azurite with real candidate processes (the `tenure` CLI, whose
//! leader command writes its token to a guarded resource): SIGKILL and SIGSTOP of the
//! holder, SIGSTOP of Azurite, a cut connection, and bad input (unreachable endpoint,
//! wrong key, missing container, a lease broken by an operator). Each test starts its
//! own Azurite; candidates get the development account through
//! `AZURE_STORAGE_CONNECTION_STRING`.
//!
//! Tests that stop the server need a local one; with `TENURE_TEST_AZURITE` set they say
//! so and stop. Leases are 15 s (the shortest Azure grants), so these tests take about
//! two minutes; run with `--test-threads=2` or fewer on small machines.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::testing::random_prefix;
use tenure_core::{Candidate, ElectionName, ErrorKind, LossReason, Session, Timing};
use tenure_integration::cli_faults::{
    assert_fenced, assert_no_stale_write_accepted, campaign_args, is, ms, stop_all, tenure_bin,
    wait,
};
use tenure_integration::fault_suite::{self, FaultSpec};
use tenure_integration::{
    monotonic_now_ns, AzuriteServer, CandidateProcess, Event, GuardedResource, TcpProxy,
};

#[path = "support/capture.rs"]
mod capture;
use capture::Captured;

/// The candidates' session TTL: the lease duration.
const TTL: Duration = Duration::from_secs(15);
/// The CLI's renew deadline for that TTL (TTL × 2/3).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// The candidates' poll interval.
const POLL: Duration = Duration::from_millis(100);
/// How often a leader's command writes its token.
const WRITE_EVERY: Duration = Duration::from_millis(100);

/// A container of its own for each test.
fn container() -> String {
    random_prefix().to_ascii_lowercase()
}

/// The backend URL candidates get (credentials go through the environment).
fn url(container: &str) -> String {
    format!("azblob:///{container}?poll_interval_ms=100&request_timeout_ms=1000&connect_timeout_ms=2000")
}

/// `tenure campaign` for `id`, reaching Azurite at `endpoint`, writing its token to
/// `resource` while it leads.
fn candidate(
    endpoint: &str,
    container: &str,
    election: &str,
    id: &str,
    resource: &GuardedResource,
) -> CandidateProcess {
    let writes = resource.write_loop_command(WRITE_EVERY);
    let args = campaign_args(
        &url(container),
        election,
        id,
        TTL,
        Duration::from_secs(2),
        Duration::from_secs(90),
        &writes,
    );
    let env = [
        ("RUST_LOG", "warn".to_string()),
        (
            "AZURE_STORAGE_CONNECTION_STRING",
            AzuriteServer::connection_string(endpoint, AzuriteServer::ACCOUNT_KEY),
        ),
    ];
    match CandidateProcess::spawn(&tenure_bin(), &args, env) {
        Ok(c) => c,
        Err(e) => panic!("starting candidate {id}: {e}"),
    }
}

/// `endpoint` with the server's address replaced by `proxy`'s.
fn via(server: &AzuriteServer, proxy: &TcpProxy) -> String {
    server
        .endpoint()
        .replacen(&server.addr().to_string(), &proxy.addr().to_string(), 1)
}

/// The shared fault scenarios' settings for this store: a container per test,
/// credentials in the environment, leases of 15 s (so the holder is stopped for the
/// lease and 3 s more), waiters polling every 100 ms.
fn spec(azurite: &AzuriteServer) -> FaultSpec {
    let mut spec = FaultSpec::new(url(&container()), TTL, POLL + Duration::from_secs(1));
    spec.env = vec![(
        "AZURE_STORAGE_CONNECTION_STRING",
        AzuriteServer::connection_string(azurite.endpoint(), AzuriteServer::ACCOUNT_KEY),
    )];
    spec.connect_timeout = Duration::from_secs(2);
    spec.start_bound = Duration::from_secs(20);
    spec.holder_pause = TTL + Duration::from_secs(3);
    spec.successor_bound = TTL + Duration::from_secs(5);
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_lease_and_poll() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    fault_suite::sigkill_of_the_holder(&spec(&azurite)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_past_the_lease() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    fault_suite::sigstop_of_the_holder(&spec(&azurite)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_azurite_fires_lost_by_the_deadline() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    fault_suite::sigstop_of_the_store(&spec(&azurite), &azurite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_then_the_campaign_goes_on() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let resource = GuardedResource::start().await.expect("resource");
    let proxy = TcpProxy::start(azurite.addr()).await.expect("proxy");
    let c = container();
    let election = "faults/cut";
    let a = candidate(&via(&azurite, &proxy), &c, election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(20)).await;
    let mut b = candidate(azurite.endpoint(), &c, election, "b", &resource);
    wait(&b, is("campaigning"), Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = monotonic_now_ns();
    proxy.cut().await.expect("cut");
    let lost = wait(&a, is(Event::LOST), RENEW_DEADLINE + Duration::from_secs(2)).await;
    let b_elected = wait(&b, is(Event::ELECTED), TTL + Duration::from_secs(5)).await;
    assert!(lost.mono_ns <= b_elected.mono_ns);
    assert!(lost.mono_ns <= cut + RENEW_DEADLINE.as_nanos() as u64);
    proxy.heal().await.expect("heal");
    // a campaigns again by itself; when b leaves, a leads with a new token.
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.terminate().await.expect("terminate b");
    let again = wait(
        &a,
        |e| e.is(Event::ELECTED) && e.mono_ns > lost.mono_ns,
        Duration::from_secs(10),
    )
    .await;
    eprintln!(
        "cut: lost {:.0} ms after the cut, b elected after {:.0} ms, a again {:.0} ms after b resigned",
        ms(lost.mono_ns - cut),
        ms(b_elected.mono_ns - cut),
        ms(again.mono_ns - cut),
    );
    assert!(b_elected.token > a_elected.token);
    assert!(again.token > b_elected.token);
    assert_no_stale_write_accepted(&resource);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_is_unauthorized_and_never_shown() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let wrong = "d3Jvbmcta2V5LVMzQ1JFVC1ub3QtdGhlLWRldi1rZXk="; // base64, not the dev key
    let config = AzureConfig::new(AzuriteServer::ACCOUNT, container())
        .endpoint(azurite.endpoint())
        .shared_key(wrong);
    let text = format!("{config:?} {config}");
    assert!(!text.contains(wrong), "{text}");
    let err = AzureBackend::connect(config).await.expect_err("wrong key");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!format!("{err} {err:?}").contains(wrong), "{err}");
    // A SAS Azurite cannot verify is refused the same way, and not repeated.
    let config = AzureConfig::new(AzuriteServer::ACCOUNT, container())
        .endpoint(azurite.endpoint())
        .sas("sv=2025-11-05&ss=b&srt=sco&sp=rwdlc&se=2099-01-01T00:00:00Z&sig=UzNDUkVUc2ln");
    let err = AzureBackend::connect(config).await.expect_err("bad sas");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!format!("{err} {err:?}").contains("UzNDUkVUc2ln"), "{err}");
    // The CLI says it on one line and exits 1, without the key.
    let out = Command::new(tenure_bin())
        .args([
            "campaign",
            "--backend",
            &url(&container()),
            "--election",
            "x",
            "--id",
            "a",
            "--ttl",
            "15",
        ])
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            AzuriteServer::connection_string(azurite.endpoint(), wrong),
        )
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("tenure: unauthorized"), "{stderr}");
    assert!(!stderr.contains(wrong), "{stderr}");
    // The right key works end to end.
    let backend = AzureBackend::connect(AzureConfig::development(azurite.endpoint(), container()))
        .await
        .expect("right key");
    let session = Session::open(Arc::new(backend), Timing::from_ttl(TTL))
        .await
        .expect("session");
    let l = session
        .campaign(
            &ElectionName::new("x").unwrap(),
            &Candidate::new("a").unwrap(),
        )
        .await
        .expect("campaign");
    assert_eq!(l.token().get(), 1);
    l.resign().await.expect("resign");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoint_fails_within_the_connect_timeout() {
    let limit = Duration::from_millis(700);
    // Nothing listens: refused at once.
    let port = tenure_integration::free_port().expect("port");
    let started = Instant::now();
    let err = AzureConfig::development(format!("http://127.0.0.1:{port}/devstoreaccount1"), "abc")
        .connect_timeout(limit)
        .connect()
        .await
        .expect_err("nothing listens");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
    // Something accepts but never answers (a black hole): a timeout, not a hang.
    let azurite = AzuriteServer::start().await.expect("azurite");
    let proxy = TcpProxy::start(azurite.addr()).await.expect("proxy");
    proxy.blackhole().await.expect("blackhole");
    let started = Instant::now();
    let err = AzureConfig::development(via(&azurite, &proxy), "abc")
        .connect_timeout(limit)
        .connect()
        .await
        .expect_err("black hole");
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_container_without_creation_is_invalid_argument() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let c = container();
    let err = AzureConfig::development(azurite.endpoint(), &c)
        .create_container(false)
        .connect()
        .await
        .expect_err("no container");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("create_container"), "{err}");
    // With creation allowed (the default) it is created, and later connects find it.
    AzureConfig::development(azurite.endpoint(), &c)
        .connect()
        .await
        .expect("created");
    AzureConfig::development(azurite.endpoint(), &c)
        .create_container(false)
        .connect()
        .await
        .expect("exists now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_broken_by_an_operator_is_lost_at_the_next_renewal() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let config = AzureConfig::development(azurite.endpoint(), container())
        .poll_interval(POLL)
        .request_timeout(Duration::from_secs(1));
    let backend = AzureBackend::connect(config).await.expect("connect");
    let mut timing = Timing::from_ttl(TTL);
    timing.renew_interval = Duration::from_millis(500);
    let s = Session::open(Arc::new(backend.clone()), timing.clone())
        .await
        .expect("session");
    let election = ElectionName::new("operator/break").unwrap();
    let l = s
        .campaign(&election, &Candidate::new("a").unwrap())
        .await
        .expect("campaign");
    let other = Session::open(Arc::new(backend.clone()), timing)
        .await
        .expect("session");
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move {
            let l = other
                .campaign(&election, &Candidate::new("b").unwrap())
                .await
                .expect("campaign b");
            (l, other)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    backend.break_lease(&election).await.expect("break");
    let reason = tokio::time::timeout(Duration::from_secs(3), l.lost_wait())
        .await
        .expect("lost within a renewal");
    assert!(matches!(reason, LossReason::Revoked(_)), "{reason:?}");
    let (b, _other) = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("b granted within a poll")
        .expect("waiter");
    assert!(b.token() > l.token());
    // The old holder's renewal failed because the lease is b's now; observers see b.
    let info = s.leader(&election).await.expect("leader").expect("held");
    assert_eq!((info.id.as_str(), info.token), ("b", b.token()));
}

/// Not a fault, but measured here with the others: handover after a resign, with a
/// 100 ms poll interval, through the CLI (one line per handover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_resign_hands_over_within_the_poll_interval() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let resource = GuardedResource::start().await.expect("resource");
    let c = container();
    let election = "faults/handover";
    let mut a = candidate(azurite.endpoint(), &c, election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(20)).await;
    let b = candidate(azurite.endpoint(), &c, election, "b", &resource);
    wait(&b, is("campaigning"), Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.terminate().await.expect("terminate a");
    let resigned = a
        .events()
        .into_iter()
        .find(|e| e.is(Event::RESIGNED))
        .expect("a resigned");
    let b_elected = wait(&b, is(Event::ELECTED), Duration::from_secs(5)).await;
    let gap = b_elected.mono_ns.saturating_sub(resigned.mono_ns);
    eprintln!("CLI handover: b elected {:.0} ms after a resigned", ms(gap));
    assert!(b_elected.token > a_elected.token);
    assert!(resigned.mono_ns <= b_elected.mono_ns);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

/// Keys and signatures stay out of every log line, at the most verbose level, on
/// success and on failure (azure_core's own pipeline logging included).
#[tokio::test]
async fn secrets_never_reach_tracing() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let (captured, _guard) = Captured::install_default();
    let wrong = "d3Jvbmcta2V5LVMzQ1JFVC1ub3QtdGhlLWRldi1rZXk=";
    let err = AzureConfig::new(AzuriteServer::ACCOUNT, container())
        .endpoint(azurite.endpoint())
        .shared_key(wrong)
        .connect()
        .await
        .expect_err("wrong key");
    tracing::error!(error = %err, debug = ?err, "connect failed");
    let sas = "sv=2025-11-05&sp=rwdlc&se=2099-01-01T00:00:00Z&sig=U0lHTkFUVVJFLVMzQ1JFVA";
    let _ = AzureConfig::new(AzuriteServer::ACCOUNT, container())
        .endpoint(azurite.endpoint())
        .sas(sas)
        .connect()
        .await
        .expect_err("bad sas");
    let config = AzureConfig::development(azurite.endpoint(), container());
    tracing::info!(?config, %config, "config");
    let backend = config.connect().await.expect("right key");
    tracing::info!(?backend, "backend");
    let s = Session::open(Arc::new(backend), Timing::from_ttl(TTL))
        .await
        .expect("session");
    let l = s
        .campaign(
            &ElectionName::new("traced").unwrap(),
            &Candidate::new("a").unwrap(),
        )
        .await
        .expect("campaign");
    l.resign().await.expect("resign");
    s.close().await.expect("close");
    let text = captured.text();
    assert!(text.contains("connect failed"), "nothing captured: {text}");
    for secret in [wrong, AzuriteServer::ACCOUNT_KEY, "U0lHTkFUVVJFLVMzQ1JFVA"] {
        assert!(!text.contains(secret), "a secret reached the log:\n{text}");
    }
}
