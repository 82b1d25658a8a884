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

use crate::{EtcdServer, Result as HarnessResult};

/// The server a bench measures: the endpoint the user `given` as is (and no server to
/// stop), else a local one from `start`, with its endpoint read by `endpoint`. Keep the
/// server until the bench is done: dropping it stops it.
pub(crate) async fn given_or_local<S>(
    given: Option<&str>,
    start: impl std::future::Future<Output = HarnessResult<S>>,
    endpoint: impl Fn(&S) -> String,
) -> Result<(Option<S>, String), String> {
    match given {
        Some(e) => Ok((None, e.to_string())),
        None => {
            let server = start.await.map_err(|e| e.to_string())?;
            let e = endpoint(&server);
            Ok((Some(server), e))
        }
    }
}

/// Measure etcd: on `endpoint` (`host:port`) if given, else on a local etcd started by
/// the harness (or the one in `TENURE_TEST_ETCD`), stopped afterwards.
pub async fn bench_etcd(
    endpoint: Option<&str>,
    options: &BenchOptions,
) -> Result<BenchTable, String> {
    let given = endpoint.map(|e| e.trim_start_matches("http://"));
    let (server, endpoint) =
        given_or_local(given, EtcdServer::start(), |s| s.addr().to_string()).await?;
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
