//! The engine's primitive suite on Azure Blob Storage (Azurite), and the store round
//! trips for the election operations on Azure Blob Storage (Azurite),
//! counted in the backend's client (every request it sends, renewals included): a grant
//! (campaign on a free seat), a join (campaign behind a holder), a release (resign with
//! a waiter, until the waiter holds the seat), and a batch of 64 tries on free seats.
//! Printed as a table, never asserted.

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::DynBackend;
use tenure_integration::AzuriteServer;

tenure_integration::shared_server!(AzuriteServer, "Azurite");

async fn backend() -> AzureBackend {
    let (endpoint, server) = shared_server();
    let container = tenure_core::testing::random_prefix().to_ascii_lowercase();
    let config = AzureConfig::development(&endpoint, &container)
        .poll_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2));
    match AzureBackend::connect(config).await {
        Ok(b) => b,
        Err(e) => panic!("connect to Azurite at {server}: {e}"),
    }
}

/// The primitive suite of the election engine against Azurite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primitives_keep_their_contract() {
    let backend = backend().await;
    let prefix = tenure_integration::run_prefix();
    tenure_core::testing::primitives::check_primitives(backend.primitives(), prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation() {
    let backend = backend().await;
    let dyn_backend: DynBackend = Arc::new(backend.clone());
    tenure_integration::print_round_trips(dyn_backend, "Azure", || backend.requests()).await;
}
