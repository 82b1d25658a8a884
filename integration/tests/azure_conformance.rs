//! The whole election contract against Azurite: one Azurite for this test binary (or
//! the one named by `TENURE_TEST_AZURITE`), a fresh random container per test, leases
//! of 15 s (the shortest TTL the backend accepts), a 100 ms poll interval, disconnects
//! injected through a TCP proxy (black hole) and expiry by deleting a session's blob.

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::backend::Clause;
use tenure_core::testing::{random_prefix, Env};
use tenure_core::{DynBackend, Session, Timing};
use tenure_integration::{assert_ttls_refused, timing_ms, AzuriteServer, ProxyFaults};

tenure_integration::shared_server!(AzuriteServer, "Azurite");

/// A container name of its own: `t-<random>`.
fn container() -> String {
    random_prefix().to_ascii_lowercase()
}

fn config(endpoint: &str, container: &str) -> AzureConfig {
    AzureConfig::development(endpoint, container)
        .poll_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(1))
}

async fn azure_env() -> Env {
    let (endpoint, server) = shared_server();
    let container = container();
    let backend = match AzureBackend::connect(config(&endpoint, &container)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to Azurite at {server}: {e}"),
    };
    // Disconnects black-hole a victim backend's link through a proxy.
    let faults = ProxyFaults::new(&endpoint, server, move |at| {
        let config = config(&at, &container);
        async move { Ok(Arc::new(AzureBackend::connect(config).await?) as DynBackend) }
    });
    let main = backend.clone();
    let faults = faults.expire_with(move |id| {
        let backend = main.clone();
        async move { backend.expire_session(&id).await }
    });
    // TTL 15 s, renew every second, leadership valid for 10 s after the last
    // confirmed renewal was sent.
    faults.env(
        Arc::new(backend),
        timing_ms(15_000, 1000, 10_000, 2000),
        1500,
    )
}

tenure_core::conformance_tests!(azure_env());

/// Not in the shared suite: leases Azure does not grant are refused at session open,
/// naming the field.
#[tokio::test]
async fn lease_durations_azure_does_not_grant_are_rejected() {
    let env = azure_env().await;
    let ttls = [10_000, 61_000, 15_500].map(Duration::from_millis);
    for err in assert_ttls_refused(&env.backend, &ttls).await {
        assert!(err.message().contains("15"), "{err}");
    }
    for secs in [15, 60] {
        let s = Session::open(
            env.backend.clone(),
            Timing::from_ttl(Duration::from_secs(secs)),
        )
        .await
        .expect("a lease Azure grants");
        s.close().await.expect("close");
    }
}

/// The capability table the backend declares.
#[tokio::test]
async fn capabilities_declare_polling() {
    let env = azure_env().await;
    let caps = env.backend.capabilities();
    assert_eq!(caps.handover_poll, Some(Duration::from_millis(100)));
    assert_eq!(caps.observe_poll, Some(Duration::from_millis(100)));
    assert!(caps.supports(Clause::NoHerd).is_err());
    assert!(caps.supports(Clause::AtMostOneHolder).is_ok());
    assert!(caps.supports(Clause::Membership).is_ok());
    assert!(caps.supports(Clause::Priority).is_ok());
}
