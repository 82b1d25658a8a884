//! `tenure bench` on local servers: starts etcd, Redis, ZooKeeper and Azurite with the
//! harness (or uses the ones named by `TENURE_TEST_*`), measures them and the in-memory
//! backend through `tenure_cli::bench_all` (the code `tenure bench` runs), prints the
//! Markdown table and writes the SVG chart. `scripts/bench.sh` runs this.
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench_all [-- --runs 20 --failovers 5 --ttl 2 --azure-ttl 15 --svg bench.svg --no-azure --no-shards]
//! ```
//!
//! A server that cannot be started (e.g. its program is missing) is listed as such.

use std::time::Duration;

use tenure_cli::bench_all::{self, BenchPlan, Machine, Outcome, Target};
use tenure_core::Timing;
use tenure_integration::{AzuriteServer, EtcdServer, RedisServer, ZooKeeperServer};

/// Azurite's well-known development account key (public; not a secret).
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

struct Flags {
    runs: usize,
    failovers: usize,
    ttl: f64,
    azure_ttl: f64,
    svg: String,
    azure: bool,
    shards: bool,
}

fn main() {
    let mut f = Flags {
        runs: 20,
        failovers: 5,
        ttl: 2.0,
        azure_ttl: 15.0,
        svg: "bench.svg".into(),
        azure: true,
        shards: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || match args.next() {
            Some(v) => v,
            None => fail(&format!("{arg} needs a value")),
        };
        match arg.as_str() {
            "--runs" => f.runs = number(&arg, &value()) as usize,
            "--failovers" => f.failovers = number(&arg, &value()) as usize,
            "--ttl" => f.ttl = number(&arg, &value()),
            "--azure-ttl" => f.azure_ttl = number(&arg, &value()),
            "--svg" => f.svg = value(),
            "--no-azure" => f.azure = false,
            "--no-shards" => f.shards = false,
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    if f.azure
        && std::env::var_os("AZURE_STORAGE_KEY").is_none()
        && std::env::var_os("AZURE_STORAGE_CONNECTION_STRING").is_none()
    {
        // Before any other thread exists.
        std::env::set_var("AZURE_STORAGE_KEY", AZURITE_KEY);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("runtime: {e}")),
    };
    runtime.block_on(run(f));
}

fn target(name: &str, url: String, timing: &Timing, shards: bool) -> Target {
    Target {
        name: name.into(),
        url,
        timing: timing.clone(),
        shards,
    }
}

fn failed(name: &str, what: &str, e: impl std::fmt::Display, timing: &Timing) -> Outcome {
    Outcome {
        target: target(name, String::new(), timing, false),
        result: Err(format!("{what} could not be started: {e}")),
        shards: None,
    }
}

async fn run(f: Flags) {
    let timing = Timing::from_ttl(Duration::from_secs_f64(f.ttl));
    let azure_timing = Timing::from_ttl(Duration::from_secs_f64(f.azure_ttl));
    let say = |s: &str| eprintln!("bench_all: {s}");
    let mut targets = vec![target("mem", "mem://tenure-bench".into(), &timing, true)];
    let mut missing = Vec::new();
    say("starting etcd, Redis, ZooKeeper and Azurite");
    let etcd = EtcdServer::start().await;
    match &etcd {
        Ok(s) => targets.push(target(
            "etcd",
            format!("etcd://{}?prefix=tenure-bench", s.addr()),
            &timing,
            true,
        )),
        Err(e) => missing.push(failed("etcd", "etcd", e, &timing)),
    }
    let redis = RedisServer::start().await;
    match &redis {
        Ok(s) => targets.push(target("redis", s.endpoint().to_string(), &timing, true)),
        Err(e) => missing.push(failed("redis", "Redis", e, &timing)),
    }
    let zk = ZooKeeperServer::start().await;
    match &zk {
        Ok(s) => targets.push(target(
            "zookeeper",
            format!("zk://{}/tenure-bench", s.endpoint()),
            &timing,
            true,
        )),
        Err(e) => missing.push(failed("zookeeper", "ZooKeeper", e, &timing)),
    }
    let azurite = if f.azure {
        Some(AzuriteServer::start().await)
    } else {
        None
    };
    match &azurite {
        Some(Ok(s)) => {
            targets.push(target(
                "azure",
                format!(
                    "azblob://devstoreaccount1/bench-{}?endpoint={}&poll_interval_ms=100",
                    std::process::id(),
                    s.endpoint()
                ),
                &azure_timing,
                false,
            ));
        }
        Some(Err(e)) => missing.push(failed("azure", "Azurite", e, &azure_timing)),
        None => {}
    }
    let shard_config = f.shards.then(|| {
        let mut cfg = tenure_shard_config();
        cfg.timing = timing.clone();
        cfg
    });
    let plan = BenchPlan {
        targets,
        handover_runs: f.runs,
        failover_runs: f.failovers,
        shard_config,
    };
    let progress = |line: String| eprintln!("bench_all: {line}");
    let mut outcomes = bench_all::run(&plan, &progress).await;
    outcomes.extend(missing);
    let machine = Machine::detect();
    let mut command = String::from("bash scripts/bench.sh");
    for a in std::env::args().skip(1) {
        command.push(' ');
        command.push_str(&a);
    }
    print!("{}", bench_all::markdown(&outcomes, &machine, &command));
    match std::fs::write(&f.svg, bench_all::svg(&outcomes, &machine)) {
        Ok(()) => say(&format!("chart written to {}", f.svg)),
        Err(e) => fail(&format!("svg: cannot write {}: {e}", f.svg)),
    }
    drop((etcd, redis, zk, azurite));
}

/// The shard benchmark as `tenure bench` runs it by default: 256 shards, 5 nodes,
/// replication 3, a 2 s quiet stretch.
fn tenure_shard_config() -> tenure_shard::bench::BenchConfig {
    let mut cfg = tenure_shard::bench::BenchConfig::new(256);
    cfg.nodes = 5;
    cfg.steady_window = Duration::from_secs(2);
    cfg
}

fn number(arg: &str, value: &str) -> f64 {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => v,
        _ => fail(&format!("{arg}: {value:?} is not a positive number")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("bench_all: {message}");
    std::process::exit(2)
}
