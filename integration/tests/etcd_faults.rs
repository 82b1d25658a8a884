//! The shared fault scenarios (`fault_suite`) against a real etcd, store restart
//! included, plus a wrong password.

use std::time::Duration;

use tenure_integration::fault_suite::{self, FaultSpec, Restart, TIMEOUTS};
use tenure_integration::EtcdServer;

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach etcd at `endpoint`, keys under `prefix`: 1 s timeouts,
/// failover within the TTL and one second.
fn spec_in(endpoint: &str, prefix: &str) -> FaultSpec {
    let host = endpoint.trim_start_matches("http://");
    let url = format!("etcd://{host}?prefix={prefix}&{TIMEOUTS}");
    FaultSpec::new(url, TTL, Duration::from_secs(1))
}

tenure_integration::fault_tests!(EtcdServer::start(), spec_in, restart: Restart::DownPastTheTtl);

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
