//! Leader election on Azure Blob Storage (or Azurite): an election is a blob, the seat
//! its lease (15 to 60 s, so the TTL is at least 15 s and a crash fails over that
//! slowly), the fencing token a metadata counter written under the lease; waiters and
//! observers poll.
//!
//! ```text
//! AZURE_STORAGE_CONNECTION_STRING=UseDevelopmentStorage=true \
//!   cargo run --example azure --features azure [-- azblob://devstoreaccount1/elections?endpoint=http://127.0.0.1:10000/devstoreaccount1&poll_interval_ms=100]
//! ```
//!
//! The URL comes from the first argument, else `TENURE_BACKEND`, else the Azurite one
//! above; credentials from the environment (see the tenure-azure README). This connects
//! by URL through `tenure::connect`; the typed way is `tenure::AzureBackend::from_url` /
//! `tenure::AzureConfig`.

mod common;

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::url(
        "azblob://devstoreaccount1/elections?endpoint=http://127.0.0.1:10000/devstoreaccount1&poll_interval_ms=100",
    );
    let timing = tenure::Timing::from_ttl(std::time::Duration::from_secs(15));
    common::connect_campaign_observe(&url, timing).await
}
