//! `tenure bench` on local servers: starts etcd, Redis, ZooKeeper, PostgreSQL and Azurite with the
//! harness (or uses the ones named by `TENURE_TEST_*`), then runs the `tenure` binary
//! (`TENURE_BIN`, else built with cargo in this example's profile) as `tenure bench --etcd … --redis … --zk
//! … --postgres … --azure …`, which measures them and the in-memory backend, prints the Markdown
//! table and writes the SVG chart. `scripts/bench.sh` runs this.
//!
//! ```text
//! cargo run --release -p tenure-integration --example bench_all [-- --runs 20 --failovers 5 --ttl 2 --azure-ttl 15 --svg bench.svg --no-azure --no-shards]
//! ```
//!
//! A server that cannot be started (e.g. its program is missing) is listed as such in
//! rows added under the table (not in the chart).
//!
//! `--baseline <tenure binary>` runs an older build's `tenure bench` first, on the same
//! servers with the same flags (without the shard manager's benchmark), and prints a
//! table of each figure's median, the older build beside this one, under the table.

use std::process::{Command, Stdio};

use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::{AzuriteServer, EtcdServer, PostgresServer, RedisServer, ZooKeeperServer};

struct Flags {
    runs: usize,
    failovers: usize,
    ttl: f64,
    azure_ttl: f64,
    svg: String,
    azure: bool,
    shards: bool,
    baseline: Option<String>,
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
        baseline: None,
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
            "--baseline" => f.baseline = Some(value()),
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    if f.azure
        && std::env::var_os("AZURE_STORAGE_KEY").is_none()
        && std::env::var_os("AZURE_STORAGE_CONNECTION_STRING").is_none()
    {
        // Before any other thread exists.
        std::env::set_var("AZURE_STORAGE_KEY", AzuriteServer::ACCOUNT_KEY);
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
    let tenure = tenure_bin();
    let mut args: Vec<String> = vec!["bench".into()];
    let mut missing = Vec::new();
    say("starting etcd, Redis, ZooKeeper, PostgreSQL and Azurite");
    let etcd = EtcdServer::start().await;
    let redis = RedisServer::start().await;
    let zk = ZooKeeperServer::start().await;
    let postgres = PostgresServer::start().await;
    let azurite = if f.azure {
        Some(AzuriteServer::start().await)
    } else {
        None
    };
    let azure_url = |s: &AzuriteServer| {
        let id = std::process::id();
        format!(
            "azblob://devstoreaccount1/bench-{id}?endpoint={}&poll_interval_ms=100",
            s.endpoint()
        )
    };
    let servers = [
        (
            "etcd",
            "etcd",
            etcd.as_ref()
                .map(|s| format!("etcd://{}?prefix=tenure-bench", s.addr())),
        ),
        (
            "redis",
            "Redis",
            redis.as_ref().map(|s| s.endpoint().to_string()),
        ),
        (
            "zk",
            "ZooKeeper",
            zk.as_ref()
                .map(|s| format!("zk://{}/tenure-bench", s.endpoint())),
        ),
        (
            "postgres",
            "PostgreSQL",
            postgres.as_ref().map(|s| postgres_url(s.endpoint())),
        ),
    ];
    let azure = azurite
        .as_ref()
        .map(|a| ("azure", "Azurite", a.as_ref().map(azure_url)));
    for (flag, what, url) in servers.into_iter().chain(azure) {
        match url {
            Ok(url) => args.extend([format!("--{flag}"), url]),
            Err(e) => {
                let name = if flag == "zk" { "zookeeper" } else { flag };
                missing.push((name, format!("{what} could not be started: {e}")));
            }
        }
    }
    for (flag, value) in [
        ("--runs", f.runs.to_string()),
        ("--failovers", f.failovers.to_string()),
        ("--ttl", f.ttl.to_string()),
        ("--azure-ttl", f.azure_ttl.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    let baseline = f.baseline.as_ref().map(|old| {
        say(&format!("the baseline first: {old}"));
        let chart = std::env::temp_dir().join(format!("bench-baseline-{}.svg", std::process::id()));
        let mut old_args = args.clone();
        old_args.extend(["--no-shards".into(), "--svg".into()]);
        old_args.push(chart.display().to_string());
        let out = bench(old.as_ref(), &old_args);
        let _ = std::fs::remove_file(chart);
        out
    });
    args.extend(["--svg".to_string(), f.svg.clone()]);
    if !f.shards {
        args.push("--no-shards".into());
    }
    // The table goes to our stdout once `tenure bench` is done, with the missing servers'
    // rows under it; its progress lines go to stderr as they come.
    let out = bench(&tenure, &args);
    let table = String::from_utf8_lossy(&out.stdout);
    print!("{table}");
    for (name, why) in &missing {
        println!(
            "| {name} | {} | – | – | – | – | |",
            why.replace(['\n', '|'], " ")
        );
    }
    if let (Some(old), Some(path)) = (&baseline, &f.baseline) {
        print!(
            "{}",
            beside(&String::from_utf8_lossy(&old.stdout), &table, path)
        );
    }
    drop((etcd, redis, zk, postgres, azurite));
    for out in baseline.iter().chain([&out]) {
        if !out.status.success() {
            fail(&format!("tenure bench failed: {}", out.status));
        }
    }
}

/// Run `bin` with `args` (only the servers started here are measured), its progress
/// lines going to stderr as they come.
fn bench(bin: &std::path::Path, args: &[String]) -> std::process::Output {
    let mut bench = Command::new(bin);
    for name in ["ETCD", "REDIS", "ZK", "POSTGRES", "AZURE"] {
        bench.env_remove(format!("TENURE_BENCH_{name}"));
    }
    match bench.args(args).stderr(Stdio::inherit()).output() {
        Ok(out) => out,
        Err(e) => fail(&format!("running {}: {e}", bin.display())),
    }
}

/// The medians of the figures both tables have, `old`'s beside `new`'s.
fn beside(old: &str, new: &str, old_bin: &str) -> String {
    let old = medians(old);
    let mut out = format!(
        "\nMedians, the baseline (`{old_bin}`, run first) beside this build, same servers:\n\n\
         | backend | figure | baseline | this build | ratio |\n|---|---|---:|---:|---:|\n"
    );
    for (key, median) in medians(new) {
        let Some((_, was)) = old.iter().find(|(k, _)| *k == key) else {
            continue;
        };
        let ratio = match (number_of(was), number_of(&median)) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}×", b / a),
            _ => "–".into(),
        };
        out += &format!("| {} | {} | {was} | {median} | {ratio} |\n", key.0, key.1);
    }
    out
}

/// `((backend, figure), median)` of each row of a `tenure bench` table.
fn medians(table: &str) -> Vec<((String, String), String)> {
    let mut column = None;
    let mut rows = Vec::new();
    for line in table.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() < 3 {
            continue;
        }
        match column {
            None => column = cells.iter().position(|c| *c == "median"),
            Some(i) => {
                if let Some(median) = cells.get(i).filter(|m| m.ends_with("ms")) {
                    rows.push((
                        (cells[0].to_string(), cells[1].to_string()),
                        median.to_string(),
                    ));
                }
            }
        }
    }
    rows
}

/// `1.5` from `1.5 ms` (`None` for anything else).
fn number_of(cell: &str) -> Option<f64> {
    cell.strip_suffix("ms")?.trim().parse().ok()
}

/// The bench's PostgreSQL URL: tenure's tables in a schema of their own.
fn postgres_url(endpoint: &str) -> String {
    tenure_integration::with_query(endpoint, "schema=tenure_bench")
}

fn number(arg: &str, value: &str) -> f64 {
    tenure_integration::positive_arg(arg, value).unwrap_or_else(|e| fail(&e))
}

fn fail(message: &str) -> ! {
    eprintln!("bench_all: {message}");
    std::process::exit(2)
}
