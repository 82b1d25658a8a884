//! Helpers for fault tests that run the `tenure` CLI as candidate processes. They are
//! test code: they panic with the candidates' logs when something does not happen.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{check_fencing, CandidateProcess, Event, GuardedResource};

/// The arguments of `tenure shards run` as node `id` of `namespace` on `url`, with
/// `shards` shards and replication 2; the caller adds its options, `--` and the
/// command.
pub fn shards_run_args(url: &str, namespace: &str, shards: usize, id: &str) -> Vec<String> {
    let shards = shards.to_string();
    [
        "shards",
        "run",
        "--backend",
        url,
        "--namespace",
        namespace,
        "--shards",
        &shards,
        "--replication",
        "2",
        "--id",
        id,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
/// The `tenure` binary: `TENURE_BIN` if set, else built with cargo into the target
/// directory the running test binary lives in (same profile).
pub fn tenure_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Some(b) = std::env::var_os("TENURE_BIN") {
            return Ok(PathBuf::from(b));
        }
        // <target>/<profile>/deps/<test>-… → <target>/<profile>
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .ok_or("cannot locate the target directory")?;
        build_tenure_cli(profile_dir)
    });
    match bin {
        Ok(b) => b.clone(),
        Err(e) => panic!("building the tenure CLI: {e}"),
    }
}

/// Builds the `tenure` CLI with cargo into `profile_dir` (`<target>/debug` or
/// `<target>/release`, the same profile) and returns its path.
pub fn build_tenure_cli(profile_dir: &Path) -> Result<PathBuf, String> {
    let target_dir = profile_dir
        .parent()
        .ok_or("cannot locate the target directory")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-q", "-p", "tenure-cli", "--bin", "tenure"])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(crate::workspace_root());
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let status = build.status().map_err(|e| format!("running cargo: {e}"))?;
    let bin = profile_dir.join("tenure");
    if !status.success() || !bin.is_file() {
        return Err(format!("cargo build -p tenure-cli failed: {status}"));
    }
    Ok(bin)
}

/// The arguments of `tenure campaign` for `id` in `election` on `backend_url` (session
/// `ttl`, `connect_timeout`, 1 s grace) whose leader command runs `script` with bash,
/// stopped by `timeout` after `lifetime` (so that a write loop orphaned by a SIGKILLed
/// candidate does not outlive the test for long).
pub fn campaign_args(
    backend_url: &str,
    election: &str,
    id: &str,
    ttl: Duration,
    connect_timeout: Duration,
    lifetime: Duration,
    script: &str,
) -> Vec<String> {
    let secs = |d: Duration| d.as_secs_f64().to_string();
    [
        "campaign",
        "--backend",
        backend_url,
        "--election",
        election,
        "--id",
        id,
        "--ttl",
        &secs(ttl),
        "--connect-timeout",
        &secs(connect_timeout),
        "--grace",
        "1",
        "--",
        "timeout",
        &secs(lifetime),
        "bash",
        "-c",
        script,
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// A predicate matching events of `kind`.
pub fn is(kind: &'static str) -> impl Fn(&Event) -> bool {
    move |e| e.is(kind)
}

/// The first event of `c` matching `pred` within `within`, or a panic with its stderr.
pub async fn wait(c: &CandidateProcess, pred: impl Fn(&Event) -> bool, within: Duration) -> Event {
    match c.wait_for_event(pred, within).await {
        Ok(e) => e,
        Err(e) => panic!("{e}\nstderr:\n{}", c.stderr_tail()),
    }
}

/// The first `elected` after `after_ns` among `candidates`, with the candidate's index.
pub async fn next_leader(
    candidates: &[&CandidateProcess],
    after_ns: u64,
    within: Duration,
) -> (usize, Event) {
    let deadline = Instant::now() + within;
    loop {
        let found = candidates.iter().enumerate().find_map(|(i, c)| {
            c.events()
                .into_iter()
                .find(|e| e.is(Event::ELECTED) && e.mono_ns > after_ns)
                .map(|e| (i, e))
        });
        if let Some(f) = found {
            return f;
        }
        if Instant::now() >= deadline {
            panic!("nobody elected within {within:?}:\n{}", dump(candidates));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Each candidate's label, events and stderr, for a failure message.
pub fn dump(candidates: &[&CandidateProcess]) -> String {
    let dump_one = |c: &&CandidateProcess| {
        let events: Vec<String> = c.events().iter().map(Event::to_string).collect();
        let (label, stderr) = (c.label(), c.stderr_tail());
        format!("{label}:\n  {}\n  stderr: {stderr}", events.join("\n  "))
    };
    candidates
        .iter()
        .map(dump_one)
        .collect::<Vec<_>>()
        .join("\n")
}

/// No fencing violation in the candidates' logs: no overlapping tenures, tokens
/// strictly increasing.
pub fn assert_fenced(candidates: &[&CandidateProcess]) {
    let logs: Vec<Vec<Event>> = candidates.iter().map(|c| c.events()).collect();
    let violations = check_fencing(&logs);
    assert!(
        violations.is_empty(),
        "fencing violations: {violations:#?}\nlogs: {logs:#?}"
    );
}

/// The resource never accepted a write with a token below one it had accepted before.
pub fn assert_no_stale_write_accepted(resource: &GuardedResource) {
    let mut highest = 0;
    for w in resource.accepted() {
        assert!(
            w.token >= highest,
            "a stale write was accepted: {w:?} after token {highest}"
        );
        highest = w.token;
    }
}

/// Asserts that the resource refused writes of `writer` with `token` (`what` they are).
pub fn assert_refused(resource: &GuardedResource, writer: &str, token: u64, what: &str) {
    let refused = resource.refused();
    assert!(
        refused
            .iter()
            .any(|w| w.writer == writer && w.token == token),
        "{what} were not refused: {:?}",
        resource.writes()
    );
}

/// The end of a fault scenario: no stale write accepted, no fencing violation among
/// `candidates`, and every one of them stopped.
pub async fn finish(resource: &GuardedResource, candidates: Vec<CandidateProcess>) {
    assert_no_stale_write_accepted(resource);
    assert_fenced(&candidates.iter().collect::<Vec<_>>());
    stop_all(candidates).await;
}

/// Terminate every candidate still running (SIGTERM, then wait).
pub async fn stop_all(candidates: Vec<CandidateProcess>) {
    for mut c in candidates {
        if c.try_exit_status().is_none() {
            let _ = c.terminate().await;
        }
    }
}

/// Nanoseconds as milliseconds, for messages.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
