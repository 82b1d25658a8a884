//! Fault tests against a real etcd with real candidate processes (the `tenure` CLI):
//! SIGKILL and SIGSTOP of the holder, SIGSTOP and restart of etcd, a cut connection,
//! and bad input (unreachable endpoint, wrong password). Each test starts its own etcd
//! (they pause and restart it) and checks the fencing of every candidate's event log.
//!
//! Run with `--test-threads=2` or fewer on small machines: every test runs an etcd and
//! two or three candidate processes. The tests that pause, restart or reconfigure etcd
//! need a local server and say so if `TENURE_TEST_ETCD` names an external one.

use std::time::Duration;

use tenure_integration::fault_suite::{self, FaultSpec, Restart};
use tenure_integration::{EtcdServer, StoreServer};

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach etcd at `endpoint`: 1 s timeouts, failover within the TTL and
/// one second.
fn spec(endpoint: &str) -> FaultSpec {
    let host = endpoint.trim_start_matches("http://");
    FaultSpec::new(
        format!("etcd://{host}?prefix=faults&connect_timeout_ms=1000&request_timeout_ms=1000"),
        TTL,
        Duration::from_secs(1),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_ttl() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigkill_of_the_holder(&spec(etcd.endpoint())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_for_two_ttls() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigstop_of_the_holder(&spec(etcd.endpoint())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_etcd_fires_lost_before_the_lease_could_expire() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::sigstop_of_the_store(&spec(etcd.endpoint()), &etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_campaigns_resume() {
    let mut etcd = EtcdServer::start().await.expect("etcd");
    let spec = spec(etcd.endpoint());
    fault_suite::store_restart(&spec, &mut etcd, Restart::DownPastTheTtl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_campaigns_resume() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::cut_connection(&etcd, &spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoint_fails_within_the_connect_timeout() {
    let etcd = EtcdServer::start().await.expect("etcd");
    fault_suite::unreachable_store(&etcd, &spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_unauthorized() {
    let etcd = EtcdServer::start().await.expect("etcd");
    etcd.require_local("it turns authentication on");
    let password = "right-Pa55word";
    etcd.enable_auth(password).expect("etcd auth");
    let host = etcd.addr();
    let at = |url: String| FaultSpec::new(url, TTL, Duration::from_secs(1));
    fault_suite::wrong_credentials(
        &[
            at(format!("etcd://root:wrong-pw@{host}")),
            at(format!("etcd://{host}")),
        ],
        &at(format!("etcd://{host}?username=root&password={password}")),
        "wrong-pw",
    )
    .await;
}
