//! `tenure-chaos`: a seeded fault campaign against real `tenure campaign` processes,
//! with a safety check at the end. Exit 0 without violations, 1 with any, 2 when the
//! run could not be set up.
//!
//! ```text
//! cargo run --release -p tenure-integration --bin tenure-chaos -- --backend etcd --duration 30m
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use tenure_integration::chaos::parse_duration;
use tenure_integration::cli_faults::build_tenure_cli;
use tenure_integration::{run_chaos, ChaosBackend, ChaosOptions};

/// Run K `tenure campaign` processes against a real backend, inject random faults
/// (seeded), and check that no two tenures overlapped, tokens increased and no stale
/// write was accepted.
#[derive(Debug, Parser)]
#[command(name = "tenure-chaos", version, about)]
struct Args {
    /// etcd, redis, zookeeper, peer or azure; or a cluster with member faults:
    /// etcd-cluster, zookeeper-ensemble or redis-sentinel.
    #[arg(long)]
    backend: String,
    /// How long to inject faults: 90s, 30m, 2h (a bare number is seconds).
    #[arg(long, default_value = "60s")]
    duration: String,
    /// Stop after this many complete rounds of every fault kind (or at --duration,
    /// whichever comes first).
    #[arg(long)]
    rounds: Option<usize>,
    /// Seed of every random choice [default: from the clock; printed first].
    #[arg(long)]
    seed: Option<u64>,
    /// Candidate processes campaigning at a time (peer: nodes in the cluster).
    #[arg(long, default_value_t = 3)]
    candidates: usize,
    /// Session TTL in seconds [default: 2 for etcd, Redis and ZooKeeper, 1 for peer, 15
    /// for azure].
    #[arg(long)]
    ttl: Option<f64>,
    /// The `tenure` binary [default: $TENURE_BIN, else `tenure` next to this program,
    /// built with cargo if missing].
    #[arg(long)]
    tenure: Option<PathBuf>,
    /// Do not print each fault as it is injected.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = match options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tenure-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tenure-chaos: could not start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run_chaos(options)) {
        Ok(report) => {
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                println!("faults:\n{}", report.fault_log.join("\n"));
                println!("leadership events:\n{}", report.timeline.join("\n"));
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("tenure-chaos: {e}");
            ExitCode::from(2)
        }
    }
}

fn options(args: &Args) -> Result<ChaosOptions, String> {
    let backend: ChaosBackend = args.backend.parse().map_err(|e| format!("{e}"))?;
    let mut o = ChaosOptions::new(backend, tenure_bin(args.tenure.as_deref())?);
    o.duration = parse_duration(&args.duration).map_err(|e| format!("--duration: {e}"))?;
    if let Some(seed) = args.seed {
        o.seed = seed;
    }
    o.candidates = args.candidates;
    o.rounds = args.rounds;
    if let Some(ttl) = args.ttl {
        if !ttl.is_finite() || !(0.0..=1e6).contains(&ttl) {
            return Err(format!("--ttl: {ttl} is not a number of seconds"));
        }
        o.ttl = std::time::Duration::from_secs_f64(ttl);
    }
    o.verbose = !args.quiet;
    Ok(o)
}

/// The `tenure` binary: as given, `$TENURE_BIN`, or next to this program (built with
/// cargo into this program's target directory and profile if it is not there).
fn tenure_bin(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os("TENURE_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let profile_dir = exe
        .parent()
        .ok_or("cannot locate this program's directory")?;
    let sibling = profile_dir.join("tenure");
    if sibling.is_file() {
        return Ok(sibling);
    }
    build_tenure_cli(profile_dir).map_err(|e| {
        format!(
            "building the tenure CLI: {e}; build it with `cargo build -p tenure-cli` or pass \
             --tenure PATH"
        )
    })
}
