//! Print the ZooKeeper latency table: graceful handover and crash failover.
//!
//! ```text
//! cargo run -p tenure-integration --example bench_zookeeper [-- --runs 20 --failovers 5 --ttl 2 --tick-ms 1000 --endpoint host:port]
//! ```
//!
//! Without `--endpoint` (or `TENURE_TEST_ZOOKEEPER`) a local ZooKeeper is started on
//! loopback with `tickTime` = `--tick-ms` (default 1000 ms, as the tests use).

use std::time::Duration;

use tenure_core::Timing;
use tenure_integration::{bench_zookeeper, BenchOptions};

fn main() {
    let mut options = BenchOptions::default();
    let mut endpoint = std::env::var("TENURE_TEST_ZOOKEEPER").ok();
    let mut tick = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || match args.next() {
            Some(v) => v,
            None => fail(&format!("{arg} needs a value")),
        };
        match arg.as_str() {
            "--runs" => options.handover_runs = number(&arg, &value()) as usize,
            "--failovers" => options.failover_runs = number(&arg, &value()) as usize,
            "--ttl" => {
                options.timing = Timing::from_ttl(Duration::from_secs_f64(number(&arg, &value())))
            }
            "--endpoint" => endpoint = Some(value()),
            "--tick-ms" => tick = Some(Duration::from_millis(number(&arg, &value()) as u64)),
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("runtime: {e}")),
    };
    match runtime.block_on(bench_zookeeper(endpoint.as_deref(), tick, &options)) {
        Ok(table) => print!("{table}"),
        Err(e) => fail(&e),
    }
}

fn number(arg: &str, value: &str) -> f64 {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => v,
        _ => fail(&format!("{arg}: {value:?} is not a positive number")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("bench_zookeeper: {message}");
    std::process::exit(2)
}
