//! Print one store's bench table: graceful handover and crash failover (what `tenure
//! bench` measures for every backend), plus the figures only that store has (Redis and
//! Azure: the cost of one renewal by held elections; ZooKeeper: a crash that drops the
//! connection at once).
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench -- STORE [--runs 20] [--failovers 5]
//!     [--ttl 2] [--endpoint E] [--tick-ms 1000 (zookeeper)] [--poll-ms 100 (azure)]
//! ```
//!
//! STORE is `etcd`, `redis`, `zookeeper` or `azure`. Without `--endpoint` (or the
//! store's `TENURE_TEST_*` variable) a local server is started on loopback and stopped
//! afterwards. Azure defaults to a 15 s lease and 3 failovers (its lease is 15–60 s).

use std::time::Duration;

use tenure_core::Timing;
use tenure_integration::{
    bench_azure, bench_etcd, bench_redis, bench_zookeeper, BenchOptions, AZURE_RENEW_ELECTIONS,
    RENEW_ELECTIONS,
};

const STORES: &str = "etcd, redis, zookeeper or azure";

fn main() {
    let mut args = std::env::args().skip(1);
    let store = args
        .next()
        .unwrap_or_else(|| fail(&format!("name the store: {STORES}")));
    let (variable, mut options) = match store.as_str() {
        "etcd" => ("TENURE_TEST_ETCD", BenchOptions::default()),
        "redis" => ("TENURE_TEST_REDIS", BenchOptions::default()),
        "zookeeper" => ("TENURE_TEST_ZOOKEEPER", BenchOptions::default()),
        "azure" => (
            "TENURE_TEST_AZURITE",
            BenchOptions {
                failover_runs: 3,
                timing: Timing::from_ttl(Duration::from_secs(15)),
                ..BenchOptions::default()
            },
        ),
        other => fail(&format!("unknown store {other:?}: expected {STORES}")),
    };
    let mut endpoint = std::env::var(variable).ok();
    let mut tick = None;
    let mut poll = Duration::from_millis(100);
    while let Some(arg) = args.next() {
        let Some(value) = args.next() else {
            fail(&format!("{arg} needs a value"))
        };
        let millis = || Duration::from_millis(positive(&arg, &value) as u64);
        match (arg.as_str(), store.as_str()) {
            ("--runs", _) => options.handover_runs = positive(&arg, &value) as usize,
            ("--failovers", _) => options.failover_runs = positive(&arg, &value) as usize,
            ("--ttl", _) => {
                options.timing = Timing::from_ttl(Duration::from_secs_f64(positive(&arg, &value)))
            }
            ("--endpoint", _) => endpoint = Some(value),
            ("--tick-ms", "zookeeper") => tick = Some(millis()),
            ("--poll-ms", "azure") => poll = millis(),
            (other, _) => fail(&format!("{other:?} is not an argument for {store}")),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    let endpoint = endpoint.as_deref();
    let table = runtime.block_on(async {
        match store.as_str() {
            "etcd" => bench_etcd(endpoint, &options).await,
            "redis" => bench_redis(endpoint, &options, &RENEW_ELECTIONS).await,
            "zookeeper" => bench_zookeeper(endpoint, tick, &options).await,
            _ => bench_azure(endpoint, &options, poll, &AZURE_RENEW_ELECTIONS).await,
        }
    });
    match table {
        Ok(table) => print!("{table}"),
        Err(e) => fail(&e),
    }
}

fn positive(arg: &str, value: &str) -> f64 {
    tenure_integration::positive_arg(arg, value).unwrap_or_else(|e| fail(&e))
}

fn fail(message: &str) -> ! {
    eprintln!("bench: {message}");
    std::process::exit(2)
}
