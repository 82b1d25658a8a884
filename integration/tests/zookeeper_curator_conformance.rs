//! The whole election contract against a real ZooKeeper with `layout=curator` (Curator
//! `LeaderLatch` names, the lowest sequence leads), as `zookeeper_conformance` runs it
//! for the default layout: the same server set-up, TTL and faults. Clause 14
//! checks the refusal here (`Unsupported`: Curator's recipe has no priority).

use tenure_core::testing::Env;
use tenure_integration::ZooKeeperServer;

#[path = "support/zookeeper.rs"]
mod zookeeper;

tenure_integration::shared_server!(ZooKeeperServer, "ZooKeeper");

/// The URL for `hosts` (`host:port`, or every server of an external ensemble), with
/// `layout=curator`.
fn url(hosts: impl std::fmt::Display) -> String {
    format!(
        "zk://{hosts}/tenure-curator-test?connect_timeout=2s&request_timeout=1s&session_timeout=4s&layout=curator"
    )
}

async fn zk_env() -> Env {
    zookeeper::env(shared_server(), |hosts| url(hosts)).await
}

tenure_core::conformance_tests!(zk_env());
