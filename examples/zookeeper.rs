//! Leader election on ZooKeeper: one ZooKeeper session per tenure session, Curator LeaderLatch-style ephemeral sequential nodes, the fencing token the node's czxid.
//!
//! ```text
//! cargo run --example zookeeper --features zookeeper [-- zk://127.0.0.1:2181/tenure]
//! ```
//!
//! The URL comes from the first argument, else `TENURE_BACKEND`, else `zk://127.0.0.1:2181/tenure`
//! (e.g. `docker compose -f docker/docker-compose.yml up`). This connects by URL
//! through `tenure::connect`; the typed way is `tenure::ZooKeeperBackend::from_url / tenure::ZooKeeperConfig`.

mod common;

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::url("zk://127.0.0.1:2181/tenure");
    common::connect_campaign_observe(
        &url,
        tenure::Timing::from_ttl(std::time::Duration::from_secs(5)),
    )
    .await
}
