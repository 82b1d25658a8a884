//! Graceful handover beside each store's own recipe, in one run on one machine: tenure
//! against `etcdctl elect` (Go's `concurrency.Election`) on etcd, and against kazoo's
//! `Election` on ZooKeeper (tickTime 1000 ms), both stores started by the harness.
//!
//! Each run, a holder leads and a waiter is queued behind it (given 0.3 s to queue, 30 ms
//! in tenure's measure); the time from the holder's release to the waiter's grant is
//! taken:
//! - tenure: `Leadership::resign` is called → the waiter's `granted_at` (the measure of
//!   `tenure bench`);
//! - `etcdctl elect`: SIGINT to the holding process, which resigns → the waiter's first
//!   output line is read;
//! - kazoo: the holder's election function returns, and kazoo deletes its lock node →
//!   the waiter's function runs (both clients in one Python process,
//!   `integration/python/kazoo_handover.py`).
//!
//! `bash scripts/bench-handover.sh [--runs 30]` installs what is missing (kazoo into
//! `.tools/python`) and runs this.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tenure_integration::{
    etcdctl_program, measure_handover, BenchOptions, BenchTable, EtcdServer, Figure,
    ZooKeeperServer,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long a waiter is given to queue behind the holder.
const QUEUE: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() {
    let mut runs = 30;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--runs", Some(n)) if n > 0 => runs = n,
            _ => fail("usage: bench_handover [--runs N]"),
        }
    }
    let options = BenchOptions {
        handover_runs: runs,
        ..BenchOptions::default()
    };
    let mut figures = Vec::new();

    let etcd = EtcdServer::start()
        .await
        .unwrap_or_else(|e| fail(&format!("etcd: {e}")));
    let url = format!("etcd://{}?prefix=bench-handover", etcd.addr());
    figures.push(tenure_on(&url, "etcd", &options).await);
    figures.push(figure(
        "etcd: `etcdctl elect` (SIGINT → waiter's line)",
        etcdctl_elect(etcd.endpoint(), runs).await,
    ));
    drop(etcd);

    let zk = ZooKeeperServer::start()
        .await
        .unwrap_or_else(|e| fail(&format!("ZooKeeper: {e}")));
    let url = format!("zk://{}/bench-handover", zk.endpoint());
    figures.push(tenure_on(&url, "ZooKeeper", &options).await);
    figures.push(figure(
        "ZooKeeper: kazoo `Election` (function returns → waiter's runs)",
        kazoo(zk.endpoint(), runs).await,
    ));
    drop(zk);

    let table = BenchTable {
        title: format!(
            "Graceful handover beside the stores' own recipes ({runs} runs each, one machine)"
        ),
        figures,
    };
    println!("{table}");
    let median = |i: usize| table.figures[i].median().unwrap_or_default().as_secs_f64();
    for (store, at) in [("etcd", 0), ("ZooKeeper", 2)] {
        println!(
            "{store}: tenure's median is {:.2}× the recipe's",
            median(at) / median(at + 1).max(f64::EPSILON)
        );
    }
}

fn fail(why: &str) -> ! {
    eprintln!("bench_handover: {why}");
    std::process::exit(1)
}

fn figure(name: &str, samples: Vec<Duration>) -> Figure {
    Figure {
        name: name.into(),
        note: format!("waiter queued {QUEUE:?} before the release"),
        samples,
    }
}

async fn tenure_on(url: &str, store: &str, options: &BenchOptions) -> Figure {
    let backend = tenure::connect(url)
        .await
        .unwrap_or_else(|e| fail(&format!("connect to {url}: {e}")));
    let samples = measure_handover(&backend, options)
        .await
        .unwrap_or_else(|e| fail(&format!("tenure on {store}: {e}")));
    Figure {
        name: format!("{store}: tenure (resign → waiter granted)"),
        note: "waiter queued 30 ms before the release (`tenure bench`'s measure)".into(),
        samples,
    }
}

/// A child whose stdout lines arrive on a channel, each with the instant it was read.
struct Child {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<Instant>,
}

impl Child {
    fn start(program: &PathBuf, args: &[&str]) -> Child {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| fail(&format!("start {}: {e}", program.display())));
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let Some(stdout) = child.stdout.take() else {
            fail("no stdout")
        };
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(_)) = reader.next_line().await {
                if tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        });
        Child { child, lines }
    }

    async fn next_line(&mut self, what: &str) -> Instant {
        match tokio::time::timeout(Duration::from_secs(30), self.lines.recv()).await {
            Ok(Some(at)) => at,
            _ => fail(&format!("{what}: no output within 30 s")),
        }
    }

    fn interrupt(&self) {
        let Some(pid) = self.child.id() else {
            fail("the child exited early")
        };
        // SAFETY: kill(2) on a child this process started and has not reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    }
}

/// `etcdctl elect` holder and waiter, taking turns: SIGINT to the holder → the
/// waiter's first line (its key; `-w simple` prints the key, then the proposal).
async fn etcdctl_elect(endpoint: &str, runs: usize) -> Vec<Duration> {
    let program = etcdctl_program().unwrap_or_else(|e| fail(&e.to_string()));
    let endpoints = format!("--endpoints={endpoint}");
    let elect =
        |proposal: &str| Child::start(&program, &[&endpoints, "elect", "bench/etcdctl", proposal]);
    let mut holder = elect("p0");
    holder.next_line("the first etcdctl elect").await;
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs {
        let mut waiter = elect(&format!("p{}", run + 1));
        tokio::time::sleep(QUEUE).await;
        let t0 = Instant::now();
        holder.interrupt();
        let t1 = waiter.next_line("the waiting etcdctl elect").await;
        samples.push(t1 - t0);
        let _ = holder.child.wait().await;
        // The proposal line follows the key.
        waiter.next_line("the elected etcdctl elect").await;
        holder = waiter;
    }
    holder.interrupt();
    let _ = holder.child.wait().await;
    samples
}

/// kazoo's `Election`, measured inside its Python process.
async fn kazoo(hosts: &str, runs: usize) -> Vec<Duration> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("python/kazoo_handover.py");
    let pylib = root.join("../.tools/python");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .args([hosts, "/bench/kazoo", &runs.to_string()])
        .env("PYTHONPATH", &pylib)
        .stderr(Stdio::inherit())
        .output()
        .await
        .unwrap_or_else(|e| fail(&format!("python3: {e}")));
    if !out.status.success() {
        fail(&format!(
            "{} failed ({}); kazoo is installed by `bash scripts/bench-handover.sh`",
            script.display(),
            out.status
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
        .collect()
}
