//! The whole election contract against a real etcd: one server for this test binary
//! (or the one named by `TENURE_TEST_ETCD`, every member of a cluster given as
//! `http://h1:2379,h2:2379,h3:2379`), a random election prefix per test, a TTL of
//! 2 s, and faults injected through a TCP proxy (disconnect) and lease revocation
//! (expiry).

use std::sync::Arc;
use std::time::Duration;

use tenure_core::testing::Env;
use tenure_core::DynBackend;
use tenure_etcd::EtcdBackend;
use tenure_integration::{assert_ttls_refused, timing_ms, EtcdServer, ProxyFaults};

tenure_integration::shared_server!(EtcdServer, "etcd");

/// The URL for `hosts` (`host:port`, or every member of an external cluster).
fn url(hosts: &str) -> String {
    let hosts = hosts.trim_start_matches("http://");
    format!("etcd://{hosts}?prefix=tenure-test&connect_timeout_ms=1000&request_timeout_ms=1000")
}

async fn etcd_env() -> Env {
    let server = shared_server().1;
    // Every member when `TENURE_TEST_ETCD` names a cluster.
    let backend = match EtcdBackend::from_url(&url(&shared_server().0)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to etcd at {server}: {e}"),
    };
    // Disconnects cut a victim backend's link through a proxy; expiry revokes the
    // lease through the main backend.
    let faults = ProxyFaults::new(&server.to_string(), server, |at| async move {
        let b = EtcdBackend::from_url(&url(&at)).await?;
        Ok(Arc::new(b) as DynBackend)
    });
    let main = backend.clone();
    let faults = faults.expire_with(move |id| {
        let backend = main.clone();
        async move { backend.revoke_session(&id).await }
    });
    // TTL 2 s (etcd leases are whole seconds), renew every 300 ms, leadership valid
    // for 1.2 s after the last confirmed renewal was sent.
    faults.env(Arc::new(backend), timing_ms(2000, 300, 1200, 1000), 500)
}

tenure_core::conformance_tests!(etcd_env());

/// Not in the shared suite: sub-second TTLs are refused, naming the field.
#[tokio::test]
async fn sub_second_ttl_is_rejected() {
    let ttls = [Duration::from_millis(900)];
    assert_ttls_refused(&etcd_env().await.backend, &ttls).await;
}
