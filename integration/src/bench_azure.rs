//! Azure Blob figures for the bench table: graceful handover and crash failover through
//! [`bench_backend`] on a local Azurite (or a given endpoint), the latency of one renewal
//! for a session holding 1 and 100 elections, and the steady-state request rate per held
//! election.

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::{Candidate, Session};
use tokio::time::Instant;

use crate::bench::{
    bench_backend, given_or_local, names, renewal_figure, renewal_samples, session_holding,
    BenchOptions, BenchTable, Figure,
};
use crate::AzuriteServer;

/// Held-election counts for the renewal figures.
pub const AZURE_RENEW_ELECTIONS: [usize; 2] = [1, 100];

/// Renewals measured per held-election count.
const RENEWALS: usize = 10;

/// Measure Azure Blob leases: on `endpoint` (an account URL such as
/// `http://127.0.0.1:10000/devstoreaccount1`, with Azurite's development key) if given,
/// else on a local Azurite started by the harness (or the one in `TENURE_TEST_AZURITE`),
/// stopped afterwards. Waiters poll every `poll`; the TTL of `options.timing` is the
/// lease duration (15–60 s).
pub async fn bench_azure(
    endpoint: Option<&str>,
    options: &BenchOptions,
    poll: Duration,
    renew_elections: &[usize],
) -> Result<BenchTable, String> {
    let (server, endpoint, where_) = given_or_local(endpoint, AzuriteServer::start()).await?;
    let container = format!("bench-{}", std::process::id());
    let backend = AzureConfig::development(&endpoint, &container)
        .poll_interval(poll)
        .connect()
        .await
        .map_err(|e| format!("connect to Azurite at {endpoint}: {e}"))?;
    let ttl = options.timing.ttl;
    let title = format!(
        "Azure Blob leases on {endpoint}, {where_}; lease = TTL {ttl:?}, poll interval {poll:?}"
    );
    let mut table = bench_backend(Arc::new(backend.clone()), &title, options).await?;
    for &n in renew_elections {
        table
            .figures
            .push(measure_renewal(&backend, n, options).await?);
    }
    for &n in renew_elections {
        table
            .figures
            .push(measure_steady_state(&backend, n, options).await?);
    }
    drop(server);
    Ok(table)
}

/// One renewal (`keep_alive`) of a backend session holding `n` elections: latency
/// samples, and requests per renewal.
async fn measure_renewal(
    backend: &AzureBackend,
    n: usize,
    options: &BenchOptions,
) -> Result<Figure, String> {
    let session = session_holding(backend, options.timing.ttl, &options.prefix, n, 16).await?;
    let before = backend.requests();
    let samples = renewal_samples(&session, RENEWALS).await?;
    let per_renewal = (backend.requests() - before) as f64 / RENEWALS as f64;
    let note =
        format!("{per_renewal:.0} requests per renewal (one per held lease, up to 32 at once)");
    renewal_figure(session, n, note, samples).await
}

/// A session (renewed by the core) holding `n` elections for several renew intervals:
/// the requests it sends per second per held election. The samples are the window.
async fn measure_steady_state(
    backend: &AzureBackend,
    n: usize,
    options: &BenchOptions,
) -> Result<Figure, String> {
    let session = Session::open(Arc::new(backend.clone()), options.timing.clone())
        .await
        .map_err(|e| format!("open session: {e}"))?;
    let me = Candidate::new("steady").map_err(|e| e.to_string())?;
    let mut held = Vec::new();
    for e in names(&options.prefix, "steady", n)? {
        held.push(
            session
                .campaign(&e, &me)
                .await
                .map_err(|e| format!("campaign: {e}"))?,
        );
    }
    let window = options.timing.renew_interval * 4;
    let before = backend.requests();
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let took = t0.elapsed();
    let sent = backend.requests() - before;
    let rate = sent as f64 / took.as_secs_f64() / n as f64;
    if !held.iter().all(|l| l.is_leader()) {
        return Err("a grant lapsed during the steady-state window".into());
    }
    for l in held {
        l.resign().await.map_err(|e| format!("resign: {e}"))?;
    }
    let _ = session.close().await;
    Ok(Figure {
        name: format!("steady state, {n} held election(s): requests per second per held election"),
        note: format!(
            "**{rate:.3} req/s per held election** ({sent} requests in {:.1} s; renew every {:?})",
            took.as_secs_f64(),
            options.timing.renew_interval
        ),
        samples: vec![took],
    })
}
