//! Redis figures for the bench table: graceful handover and crash failover through
//! [`bench_backend`], plus the cost of one renewal for a session holding 1, 100 and
//! 10,000 elections (the client's latency per renewal, and the server's count of script
//! calls per renewal, which is the number of round trips).

use std::sync::Arc;
use std::time::Duration;

use tenure_redis::RedisBackend;

use crate::bench::{
    bench_backend, given_or_local, renewal_figure, renewal_samples, session_holding, BenchOptions,
    BenchTable, Figure,
};
use crate::RedisServer;

/// Held-election counts for the renewal figures.
pub const RENEW_ELECTIONS: [usize; 3] = [1, 100, 10_000];

/// Renewals measured per held-election count.
const RENEWALS: usize = 20;

/// Campaigns sent at once while filling a session with elections.
const CAMPAIGN_BATCH: usize = 200;

/// Measure Redis: on `endpoint` (a `redis://` URL) if given, else on a local Redis
/// started by the harness (or the one in `TENURE_TEST_REDIS`), stopped afterwards. The
/// renewal figures read `INFO commandstats`, so the server should be otherwise idle.
pub async fn bench_redis(
    endpoint: Option<&str>,
    options: &BenchOptions,
    renew_elections: &[usize],
) -> Result<BenchTable, String> {
    let given = endpoint.map(|e| match e.contains("://") {
        true => e.to_string(),
        false => format!("redis://{e}"),
    });
    let (server, endpoint, where_) = given_or_local(given.as_deref(), RedisServer::start()).await?;
    let backend = RedisBackend::from_url(&crate::with_query(&endpoint, "prefix=tenure-bench"))
        .await
        .map_err(|e| format!("connect to Redis: {e}"))?;
    let title = format!("Redis at {}, {where_}", backend.config());
    let mut table = bench_backend(Arc::new(backend.clone()), &title, options).await?;
    let client =
        redis::Client::open(endpoint.as_str()).map_err(|e| format!("stats client: {e}"))?;
    let mut stats = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("stats connection: {e}"))?;
    for &n in renew_elections {
        table
            .figures
            .push(measure_renewal(&backend, &mut stats, n, options).await?);
    }
    drop(server);
    Ok(table)
}

/// One renewal of a session holding `n` elections: latency samples, and script calls
/// per renewal counted by the server.
async fn measure_renewal(
    backend: &RedisBackend,
    stats: &mut redis::aio::MultiplexedConnection,
    n: usize,
    options: &BenchOptions,
) -> Result<Figure, String> {
    let ttl = options.timing.ttl.max(Duration::from_secs(60));
    let session = session_holding(backend, ttl, &options.prefix, n, CAMPAIGN_BATCH).await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(stats)
        .await
        .map_err(|e| format!("CONFIG RESETSTAT: {e}"))?;
    let samples = renewal_samples(&session, RENEWALS).await?;
    let (calls, usec) = script_calls(stats).await?;
    let per = calls as f64 / RENEWALS as f64;
    let note = format!(
        "{per:.2} round trips (script calls) per renewal, {usec:.0} µs of server time each"
    );
    renewal_figure(session, n, note, samples).await
}

/// `EVALSHA` calls and microseconds per call since the last `CONFIG RESETSTAT`.
async fn script_calls(stats: &mut redis::aio::MultiplexedConnection) -> Result<(u64, f64), String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(stats)
        .await
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or("");
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((field("calls=") as u64, field("usec_per_call=")))
}
