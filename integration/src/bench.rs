//! Handover and failover latency of a backend, as a table (not a timed test).
//!
//! The measuring code is the one `tenure bench` runs: the CLI's
//! `crates/tenure-cli/src/bench.rs`, compiled here as a private module (the published
//! `tenure` command is a binary with no library, so there is no crate to depend on) and
//! re-exported: [`bench_backend`] measures any backend; [`bench_etcd`] runs it on a
//! local etcd started by the harness (or the one named by `TENURE_TEST_ETCD`).
//! [`BenchTable`] prints min/median/max per figure, so every backend's numbers look the
//! same.

use std::sync::Arc;

#[path = "../../crates/tenure-cli/src/bench.rs"]
mod measure;

pub use measure::{
    bench_backend, measure_failover, measure_failover_with, measure_handover, BenchOptions,
    BenchTable, Figure,
};

use crate::EtcdServer;

/// Measure etcd: on `endpoint` (`host:port`) if given, else on a local etcd started by
/// the harness (or the one in `TENURE_TEST_ETCD`), stopped afterwards.
pub async fn bench_etcd(
    endpoint: Option<&str>,
    options: &BenchOptions,
) -> Result<BenchTable, String> {
    let (server, endpoint) = match endpoint {
        Some(e) => (None, e.trim_start_matches("http://").to_string()),
        None => {
            let server = EtcdServer::start().await.map_err(|e| e.to_string())?;
            let e = server.addr().to_string();
            (Some(server), e)
        }
    };
    let backend =
        tenure_etcd::EtcdBackend::from_url(&format!("etcd://{endpoint}?prefix=tenure-bench"))
            .await
            .map_err(|e| format!("connect to etcd at {endpoint}: {e}"))?;
    let where_ = match &server {
        Some(_) => "a local etcd started by the harness (loopback)",
        None => "the given etcd",
    };
    let table = bench_backend(
        Arc::new(backend),
        &format!("etcd at {endpoint}, {where_}"),
        options,
    )
    .await?;
    drop(server);
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::DynBackend;

    #[tokio::test]
    async fn the_memory_backend_benches() {
        let backend: DynBackend = Arc::new(tenure_core::MemoryBackend::new());
        let options = BenchOptions {
            handover_runs: 3,
            failover_runs: 1,
            timing: tenure_core::testing::memory_timing(),
            ..BenchOptions::default()
        };
        let table = bench_backend(backend, "mem", &options).await.unwrap();
        assert_eq!(table.figures[0].samples.len(), 3);
        assert_eq!(table.figures[1].samples.len(), 1);
        assert!(table.figures[1].samples[0] <= options.timing.ttl * 2);
    }
}
