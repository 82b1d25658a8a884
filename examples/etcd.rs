//! Leader election on etcd v3: a lease per session, the seat a key created in a transaction, the fencing token its create revision, waiters watch their predecessor.
//!
//! ```text
//! cargo run --example etcd --features etcd [-- etcd://127.0.0.1:2379]
//! ```
//!
//! The URL comes from the first argument, else `TENURE_BACKEND`, else `etcd://127.0.0.1:2379`
//! (e.g. `docker compose -f docker/docker-compose.yml up`). This connects by URL
//! through `tenure::connect`; the typed way is `tenure::EtcdBackend::from_url / tenure::EtcdConfig`.

mod common;

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::url("etcd://127.0.0.1:2379");
    common::connect_campaign_observe(
        &url,
        tenure::Timing::from_ttl(std::time::Duration::from_secs(5)),
    )
    .await
}
