//! `--metrics-addr`: the Prometheus exporter for the `metrics` facade that tenure's
//! crates record into (`tenure_leader`, `tenure_renew_latency_seconds`,
//! `tenure_shard_leaders`, …).

use std::net::SocketAddr;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tenure::{Error, Result};

/// Install the Prometheus recorder and serve `GET /metrics` on `addr` from the current
/// tokio runtime. Fails with `InvalidArgument` naming `metrics_addr` if the address
/// cannot be bound (or a recorder is installed already).
pub fn serve(addr: SocketAddr) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| Error::invalid(format!("metrics_addr: cannot serve metrics on {addr}: {e}")))
}

/// Install the Prometheus recorder without a listener of its own, for `/metrics` on
/// the `--health-addr` listener (the same address was given to both flags); its upkeep
/// runs every 5 s on the current tokio runtime. Fails with `InvalidArgument` naming
/// `metrics_addr` if a recorder is installed already.
pub fn install() -> Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::invalid(format!("metrics_addr: cannot install the recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}
