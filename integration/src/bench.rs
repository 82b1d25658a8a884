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

use crate::{EtcdServer, Result as HarnessResult, StoreServer};

/// The store a bench measures: the endpoint the user `given` as is, else a local server
/// from `start` (or the external one its `TENURE_TEST_*` variable names). Returns the
/// server (keep it until the bench is done: dropping it stops it), the endpoint, and
/// where the store runs, for the table's title.
pub(crate) async fn given_or_local<S: std::ops::Deref<Target = StoreServer>>(
    given: Option<&str>,
    start: impl std::future::Future<Output = HarnessResult<S>>,
) -> Result<(Option<S>, String, String), String> {
    if let Some(e) = given {
        return Ok((None, e.to_string(), "the given endpoint".into()));
    }
    let s = start.await.map_err(|e| e.to_string())?;
    let where_ = match s.is_external() {
        true => format!("the {} named by {}", s.name(), s.env_var()),
        false => format!("a local {} started by the harness (loopback)", s.name()),
    };
    let endpoint = s.endpoint().to_string();
    Ok((Some(s), endpoint, where_))
}

/// The value of the command-line argument `arg` as a positive number, or why not.
pub fn positive_arg(arg: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{arg}: {value:?} is not a positive number")),
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
    let (server, endpoint, where_) = given_or_local(endpoint, EtcdServer::start()).await?;
    let hosts = endpoint.trim_start_matches("http://");
    let backend =
        tenure_etcd::EtcdBackend::from_url(&format!("etcd://{hosts}?prefix=tenure-bench"))
            .await
            .map_err(|e| format!("connect to etcd at {hosts}: {e}"))?;
    let title = format!("etcd at {hosts}, {where_}");
    let table = bench_backend(Arc::new(backend), &title, options).await;
    drop(server);
    table
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
