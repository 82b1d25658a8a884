//! Print the Redis bench table: graceful handover, crash failover, and the cost of one
//! renewal for a session holding 1, 100 and 10,000 elections.
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench_redis [-- --runs 20 --failovers 5 --ttl 2 --endpoint redis://host:port]
//! ```
//!
//! Without `--endpoint` (or `TENURE_TEST_REDIS`) a local Redis is started on loopback.
//! The renewal figures read `INFO commandstats`, so the server should be otherwise idle.

use std::time::Duration;

use tenure_core::Timing;
use tenure_integration::{bench_redis, BenchOptions, RENEW_ELECTIONS};

fn main() {
    let mut options = BenchOptions::default();
    let mut endpoint = std::env::var("TENURE_TEST_REDIS").ok();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let Some(value) = args.next() else {
            fail(&format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--runs" => options.handover_runs = positive(&arg, &value) as usize,
            "--failovers" => options.failover_runs = positive(&arg, &value) as usize,
            "--ttl" => {
                options.timing = Timing::from_ttl(Duration::from_secs_f64(positive(&arg, &value)))
            }
            "--endpoint" => endpoint = Some(value),
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let endpoint = endpoint.map(|e| {
        if e.contains("://") {
            e
        } else {
            format!("redis://{e}")
        }
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    match runtime.block_on(bench_redis(endpoint.as_deref(), &options, &RENEW_ELECTIONS)) {
        Ok(table) => print!("{table}"),
        Err(e) => fail(&e),
    }
}

fn positive(arg: &str, value: &str) -> f64 {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => v,
        _ => fail(&format!("{arg}: {value:?} is not a positive number")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("bench_redis: {message}");
    std::process::exit(2)
}
