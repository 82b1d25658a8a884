//! `tenure bench` on local servers: starts etcd, Redis, ZooKeeper and Azurite with the
//! harness (or uses the ones named by `TENURE_TEST_*`), then runs the `tenure` binary
//! (built with cargo in this example's profile) as `tenure bench --etcd … --redis … --zk
//! … --azure …`, which measures them and the in-memory backend, prints the Markdown
//! table and writes the SVG chart. `scripts/bench.sh` runs this.
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench_all [-- --runs 20 --failovers 5 --ttl 2 --azure-ttl 15 --svg bench.svg --no-azure --no-shards]
//! ```
//!
//! A server that cannot be started (e.g. its program is missing) is listed as such in
//! rows added under the table (not in the chart).

use std::process::{Command, Stdio};

use tenure_integration::cli_faults::build_tenure_cli;
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
    // Checked here (and whether to start Azurite), then passed on to `tenure bench`.
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

async fn run(f: Flags) {
    let say = |s: &str| eprintln!("bench_all: {s}");
    let tenure = match build_tenure() {
        Ok(b) => b,
        Err(e) => fail(&format!("building the tenure CLI: {e}")),
    };
    let mut bench = Command::new(&tenure);
    bench.arg("bench");
    for name in ["ETCD", "REDIS", "ZK", "AZURE"] {
        // Only the servers started here are measured.
        bench.env_remove(format!("TENURE_BENCH_{name}"));
    }
    let mut missing = Vec::new();
    say("starting etcd, Redis, ZooKeeper and Azurite");
    let etcd = EtcdServer::start().await;
    match &etcd {
        Ok(s) => {
            bench.arg("--etcd");
            bench.arg(format!("etcd://{}?prefix=tenure-bench", s.addr()));
        }
        Err(e) => missing.push(("etcd", format!("etcd could not be started: {e}"))),
    }
    let redis = RedisServer::start().await;
    match &redis {
        Ok(s) => {
            bench.args(["--redis", s.endpoint()]);
        }
        Err(e) => missing.push(("redis", format!("Redis could not be started: {e}"))),
    }
    let zk = ZooKeeperServer::start().await;
    match &zk {
        Ok(s) => {
            bench.arg("--zk");
            bench.arg(format!("zk://{}/tenure-bench", s.endpoint()));
        }
        Err(e) => missing.push(("zookeeper", format!("ZooKeeper could not be started: {e}"))),
    }
    let azurite = if f.azure {
        Some(AzuriteServer::start().await)
    } else {
        None
    };
    match &azurite {
        Some(Ok(s)) => {
            bench.arg("--azure");
            bench.arg(format!(
                "azblob://devstoreaccount1/bench-{}?endpoint={}&poll_interval_ms=100",
                std::process::id(),
                s.endpoint()
            ));
        }
        Some(Err(e)) => missing.push(("azure", format!("Azurite could not be started: {e}"))),
        None => {}
    }
    bench
        .args(["--runs", &f.runs.to_string()])
        .args(["--failovers", &f.failovers.to_string()])
        .args(["--ttl", &f.ttl.to_string()])
        .args(["--azure-ttl", &f.azure_ttl.to_string()])
        .args(["--svg", &f.svg]);
    if !f.shards {
        bench.arg("--no-shards");
    }
    // The table goes to our stdout once `tenure bench` is done, with the missing servers'
    // rows under it; its progress lines go to stderr as they come.
    let out = match bench.stderr(Stdio::inherit()).output() {
        Ok(out) => out,
        Err(e) => fail(&format!("running {}: {e}", tenure.display())),
    };
    print!("{}", String::from_utf8_lossy(&out.stdout));
    for (name, why) in &missing {
        println!(
            "| {name} | {} | – | – | – | – | |",
            why.replace(['\n', '|'], " ")
        );
    }
    drop((etcd, redis, zk, azurite));
    if !out.status.success() {
        fail(&format!("tenure bench failed: {}", out.status));
    }
}

/// The `tenure` binary of this example's profile (`<target>/<profile>/examples/bench_all`
/// → `<target>/<profile>/tenure`), built with cargo.
fn build_tenure() -> Result<std::path::PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = exe
        .parent()
        .and_then(|examples| examples.parent())
        .ok_or("cannot locate the target directory")?;
    build_tenure_cli(profile_dir)
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
