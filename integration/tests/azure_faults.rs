//! The shared fault scenarios (`fault_suite`) against Azurite, candidates getting the
//! development account through `AZURE_STORAGE_CONNECTION_STRING`, plus a wrong key, a
//! missing container, a lease broken by an operator and secrets kept out of logs. Leases
//! are 15 s (the shortest Azure grants), so these take about two minutes.

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::testing::random_prefix;
use tenure_core::{Candidate, ElectionName, ErrorKind, LossReason, Session, Timing};
use tenure_integration::cli_faults::{finish, is, ms, wait};
use tenure_integration::cluster_faults::{elect_and_resign, spawn_campaign, wait_grant};
use tenure_integration::fault_suite::{self, FaultSpec};
use tenure_integration::{AzuriteServer, Event, GuardedResource};

#[path = "support/capture.rs"]
mod capture;
use capture::Captured;

/// The candidates' session TTL: the lease duration.
const TTL: Duration = Duration::from_secs(15);
/// The candidates' poll interval.
const POLL: Duration = Duration::from_millis(100);

/// A container of its own for each test.
fn container() -> String {
    random_prefix().to_ascii_lowercase()
}

/// The development account on `azurite`, in a container of its own, without a key.
fn account(azurite: &AzuriteServer) -> AzureConfig {
    AzureConfig::new(AzuriteServer::ACCOUNT, container()).endpoint(azurite.endpoint())
}

/// How candidates reach Azurite at `endpoint` with the account `key`, in `container`:
/// credentials through the environment, leases of 15 s (so the holder is stopped for
/// the lease and 3 s more), waiters polling every 100 ms.
fn spec_with_key(endpoint: &str, container: &str, key: &str) -> FaultSpec {
    let url = format!(
        "azblob:///{container}?poll_interval_ms=100&request_timeout_ms=1000&connect_timeout_ms=2000"
    );
    let mut spec = FaultSpec::new(url, TTL, POLL + Duration::from_secs(1));
    spec.env = vec![(
        "AZURE_STORAGE_CONNECTION_STRING",
        AzuriteServer::connection_string(endpoint, key),
    )];
    spec.connect_timeout = Duration::from_secs(2);
    spec.start_bound = Duration::from_secs(20);
    spec.holder_pause = TTL + Duration::from_secs(3);
    spec.successor_bound = TTL + Duration::from_secs(5);
    spec
}

/// How candidates reach Azurite at `endpoint` in `container`, with the right key.
fn spec_in(endpoint: &str, container: &str) -> FaultSpec {
    spec_with_key(endpoint, container, AzuriteServer::ACCOUNT_KEY)
}

/// How candidates reach Azurite at `endpoint`, in a container of their own.
fn spec(endpoint: &str) -> FaultSpec {
    spec_in(endpoint, &container())
}

tenure_integration::fault_tests!(AzuriteServer::start(), spec_in);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_is_unauthorized_and_never_shown() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let wrong = "d3Jvbmcta2V5LVMzQ1JFVC1ub3QtdGhlLWRldi1rZXk="; // base64, not the dev key
    let config = account(&azurite).shared_key(wrong);
    let text = format!("{config:?} {config}");
    assert!(!text.contains(wrong), "{text}");
    let err = AzureBackend::connect(config).await.expect_err("wrong key");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!format!("{err} {err:?}").contains(wrong), "{err}");
    // A SAS Azurite cannot verify is refused the same way, and not repeated.
    let config = account(&azurite)
        .sas("sv=2025-11-05&ss=b&srt=sco&sp=rwdlc&se=2099-01-01T00:00:00Z&sig=UzNDUkVUc2ln");
    let err = AzureBackend::connect(config).await.expect_err("bad sas");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!format!("{err} {err:?}").contains("UzNDUkVUc2ln"), "{err}");
    // The CLI says it on one line and exits 1, without the key; the right key works.
    fault_suite::wrong_credentials(
        &[spec_with_key(azurite.endpoint(), &container(), wrong)],
        &spec(azurite.endpoint()),
        wrong,
    )
    .await;
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
    let waiter = spawn_campaign(other, &election, Candidate::new("b").unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    backend.break_lease(&election).await.expect("break");
    let reason = tokio::time::timeout(Duration::from_secs(3), l.lost_wait())
        .await
        .expect("lost within a renewal");
    assert!(matches!(reason, LossReason::Revoked(_)), "{reason:?}");
    let (b, _other) = wait_grant(waiter, Duration::from_secs(3), "b granted within a poll").await;
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
    let spec = spec(azurite.endpoint());
    let election = "faults/handover";
    let mut a = spec.candidate(election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(20)).await;
    let b = spec.candidate(election, "b", &resource);
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
    finish(&resource, vec![a, b]).await;
}

/// Keys and signatures stay out of every log line, at the most verbose level, on
/// success and on failure (azure_core's own pipeline logging included).
#[tokio::test]
async fn secrets_never_reach_tracing() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let (captured, _guard) = Captured::install_default();
    let wrong = "d3Jvbmcta2V5LVMzQ1JFVC1ub3QtdGhlLWRldi1rZXk=";
    let sas = "sv=2025-11-05&sp=rwdlc&se=2099-01-01T00:00:00Z&sig=U0lHTkFUVVJFLVMzQ1JFVA";
    for (config, what) in [
        (account(&azurite).shared_key(wrong), "wrong key"),
        (account(&azurite).sas(sas), "bad sas"),
    ] {
        let err = config.connect().await.expect_err(what);
        tracing::error!(error = %err, debug = ?err, "connect failed");
    }
    let config = AzureConfig::development(azurite.endpoint(), container());
    tracing::info!(?config, %config, "config");
    let backend = config.connect().await.expect("right key");
    tracing::info!(?backend, "backend");
    elect_and_resign(Arc::new(backend), TTL, "traced").await;
    let text = captured.text();
    assert!(text.contains("connect failed"), "nothing captured: {text}");
    for secret in [wrong, AzuriteServer::ACCOUNT_KEY, "U0lHTkFUVVJFLVMzQ1JFVA"] {
        assert!(!text.contains(secret), "a secret reached the log:\n{text}");
    }
}
