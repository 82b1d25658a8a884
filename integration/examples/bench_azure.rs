//! Print the Azure Blob bench table: graceful handover at a 100 ms poll interval, crash
//! failover with a 15 s lease, the cost of one renewal for a session holding 1 and 100
//! elections, and the steady-state requests per second per held election.
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench_azure [-- --runs 20 --failovers 3 --ttl 15 --poll-ms 100 --endpoint http://127.0.0.1:10000/devstoreaccount1]
//! ```
//!
//! Without `--endpoint` (or `TENURE_TEST_AZURITE`) a local Azurite is started on
//! loopback; the endpoint is used with Azurite's development account and key.

use std::time::Duration;

use tenure_core::Timing;
use tenure_integration::{bench_azure, BenchOptions, AZURE_RENEW_ELECTIONS};

fn main() {
    let mut options = BenchOptions {
        failover_runs: 3,
        timing: Timing::from_ttl(Duration::from_secs(15)),
        ..BenchOptions::default()
    };
    let mut poll = Duration::from_millis(100);
    let mut endpoint = std::env::var("TENURE_TEST_AZURITE").ok();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let Some(value) = args.next() else {
            fail(&format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--runs" => options.handover_runs = positive(&arg, &value) as usize,
            "--failovers" => options.failover_runs = positive(&arg, &value) as usize,
            "--ttl" => {
                options.timing =
                    Timing::from_ttl(Duration::from_secs(positive(&arg, &value) as u64))
            }
            "--poll-ms" => poll = Duration::from_millis(positive(&arg, &value) as u64),
            "--endpoint" => endpoint = Some(value),
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    match runtime.block_on(bench_azure(
        endpoint.as_deref(),
        &options,
        poll,
        &AZURE_RENEW_ELECTIONS,
    )) {
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
    eprintln!("bench_azure: {message}");
    std::process::exit(2)
}
