//! A plain Redis client for tests that set things up on the server or look at it:
//! one connection, commands as string slices, and the server's counters; and the
//! backend those tests measure.

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;
use redis::FromRedisValue;
use tenure_redis::RedisBackend;

/// The backend on `endpoint` with keys under [`run_prefix`](crate::run_prefix), a 1 s
/// connect and a 500 ms request timeout, and the query pairs `extra` (`&k=v…`).
pub async fn backend(endpoint: &str, extra: &str) -> RedisBackend {
    let prefix = crate::run_prefix();
    let timeouts = "connect_timeout_ms=1000&request_timeout_ms=500";
    let url = crate::with_query(endpoint, &format!("prefix={prefix}&{timeouts}{extra}"));
    match RedisBackend::from_url(&url).await {
        Ok(b) => b,
        Err(e) => panic!("connect to {endpoint}: {e}"),
    }
}

/// A connection to the Redis at `endpoint` (a `redis://` URL).
pub async fn connect(endpoint: &str) -> MultiplexedConnection {
    let client = redis::Client::open(endpoint).expect("redis client");
    match client.get_multiplexed_async_connection().await {
        Ok(c) => c,
        Err(e) => panic!("a plain connection to {endpoint}: {e}"),
    }
}

/// Runs the command `args` on `c`; panics on an error.
pub async fn cmd<T: FromRedisValue>(c: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query_async(c).await {
        Ok(v) => v,
        Err(e) => panic!("{args:?}: {e}"),
    }
}

/// Resets the server's command counters (`CONFIG RESETSTAT`).
pub async fn reset_stats(c: &mut MultiplexedConnection) {
    cmd::<()>(c, &["CONFIG", "RESETSTAT"]).await;
}

/// Calls per command since the last [`reset_stats`], without `INFO` and `CONFIG`.
pub async fn command_calls(c: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = cmd(c, &["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

/// The counter `field` of the server's `INFO stats` (`total_connections_received`, …).
pub async fn stat(c: &mut MultiplexedConnection, field: &str) -> u64 {
    let info: String = cmd(c, &["INFO", "stats"]).await;
    let value = info
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'));
    let value = value.and_then(|n| n.trim().parse().ok());
    value.unwrap_or_else(|| panic!("INFO stats has no {field}"))
}
