//! Leader election on a Redis primary: Lua scripts keep the session key, the seat and a per-election counter (the fencing token); waiters are woken by pub/sub.
//!
//! ```text
//! cargo run --example redis --features redis [-- redis://127.0.0.1:6379]
//! ```
//!
//! The URL comes from the first argument, else `TENURE_BACKEND`, else `redis://127.0.0.1:6379`
//! (e.g. `docker compose -f docker/docker-compose.yml up`). This connects by URL
//! through `tenure::connect`; the typed way is `tenure::RedisBackend::from_url / tenure::RedisConfig`.

mod common;

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::url("redis://127.0.0.1:6379");
    common::connect_campaign_observe(
        &url,
        tenure::Timing::from_ttl(std::time::Duration::from_secs(5)),
    )
    .await
}
