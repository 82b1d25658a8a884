//! The engine's primitive suite on Azure Blob Storage (Azurite), and the store round
//! trips for the election operations on Azure Blob Storage (Azurite),
//! counted in the backend's client (every request it sends, renewals included): a grant
//! (campaign on a free seat), a join (campaign behind a holder), a release (resign with
//! a waiter, until the waiter holds the seat), and a batch of 64 tries on free seats.
//! Printed as a table, never asserted.

use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
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

tenure_integration::primitive_tests!(backend(), "Azure", requests);
