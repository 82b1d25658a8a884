//! The whole election contract against a real etcd: one server for this test binary
//! (or the one named by `TENURE_TEST_ETCD`, every member of a cluster given as
//! `http://h1:2379,h2:2379,h3:2379`), a random election prefix per test, a TTL of
//! 2 s, and faults injected through a TCP proxy (disconnect) and lease revocation
//! (expiry).

use std::time::Duration;

use tenure_core::testing::Env;
use tenure_integration::{assert_ttls_refused, EtcdServer};

tenure_integration::shared_server!(EtcdServer, "etcd");

/// The URL for `hosts` (`host:port`, or every member of an external cluster).
fn url(hosts: &str) -> String {
    let hosts = hosts.trim_start_matches("http://");
    format!("etcd://{hosts}?prefix=tenure-test&connect_timeout_ms=1000&request_timeout_ms=1000")
}

/// Every member when `TENURE_TEST_ETCD` names a cluster (see
/// [`etcd_env`](tenure_integration::etcd_env) for the timing and faults).
async fn etcd_env() -> Env {
    let (endpoint, server) = shared_server();
    tenure_integration::etcd_env(&endpoint, server, url).await
}

tenure_core::conformance_tests!(etcd_env());

/// Not in the shared suite: sub-second TTLs are refused, naming the field.
#[tokio::test]
async fn sub_second_ttl_is_rejected() {
    let ttls = [Duration::from_millis(900)];
    assert_ttls_refused(&etcd_env().await.backend, &ttls).await;
}
