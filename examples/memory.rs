//! Leader election on the in-memory store (`mem://`, this process only): the same
//! steps as the etcd, redis, zookeeper and azure examples, with no server.
//!
//! ```text
//! cargo run --example memory
//! ```

mod common;

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::url("mem://");
    common::connect_campaign_observe(
        &url,
        tenure::Timing::from_ttl(std::time::Duration::from_secs(2)),
    )
    .await
}
