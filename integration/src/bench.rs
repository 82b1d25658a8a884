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
use std::time::{Duration, Instant};

use tenure_core::backend::{BackendSession, SessionEvents};
use tenure_core::{Backend, Candidate, ElectionName};

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

/// `n` election names `<prefix>/<what>-<n>/<i>`.
pub(crate) fn names(prefix: &str, what: &str, n: usize) -> Result<Vec<ElectionName>, String> {
    (0..n)
        .map(|i| ElectionName::new(format!("{prefix}/{what}-{n}/{i:05}")))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// A backend session with `ttl` (renewed by nothing but the caller) holding `n`
/// elections, campaigned for `batch` at once.
pub(crate) async fn session_holding(
    backend: &dyn Backend,
    ttl: Duration,
    prefix: &str,
    n: usize,
    batch: usize,
) -> Result<Arc<dyn BackendSession>, String> {
    let (events, _) = SessionEvents::channel();
    let session = backend
        .open_session(ttl, events)
        .await
        .map_err(|e| format!("open session: {e}"))?;
    let me = Candidate::new("renewer").map_err(|e| e.to_string())?;
    for chunk in names(prefix, "renew", n)?.chunks(batch) {
        let grants = futures::future::join_all(chunk.iter().map(|e| session.campaign(e, &me)));
        for g in grants.await {
            g.map_err(|e| format!("campaign: {e}"))?;
        }
    }
    Ok(session)
}

/// The latencies of `renewals` renewals (`keep_alive`) of `session`.
pub(crate) async fn renewal_samples(
    session: &Arc<dyn BackendSession>,
    renewals: usize,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::with_capacity(renewals);
    for _ in 0..renewals {
        let t0 = Instant::now();
        session
            .keep_alive()
            .await
            .map_err(|e| format!("renewal: {e}"))?;
        samples.push(t0.elapsed());
    }
    Ok(samples)
}

/// Closes `session` (which held `n` elections) and makes the figure of its renewal
/// `samples`, with `note`.
pub(crate) async fn renewal_figure(
    session: Arc<dyn BackendSession>,
    n: usize,
    note: String,
    samples: Vec<Duration>,
) -> Result<Figure, String> {
    session
        .close()
        .await
        .map_err(|e| format!("close session: {e}"))?;
    let name = format!("renewal of a session holding {n} election(s)");
    Ok(Figure {
        name,
        note,
        samples,
    })
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
