//! The CLI on `mem://`: in-process campaigns through the library, and the binary's
//! handling of signals and bad input.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;
use tenure::MemoryBackend;
use tenure_cli::args::{CampaignArgs, Cli, Command};
use tenure_cli::campaign::run_campaign;
use tenure_cli::MemorySink;
use tokio_util::sync::CancellationToken;

fn campaign_args(args: &[&str]) -> CampaignArgs {
    let mut argv = vec!["tenure", "campaign"];
    argv.extend_from_slice(args);
    match Cli::parse_from(argv).command {
        Command::Campaign(a) => a,
        other => panic!("parsed {other:?}"),
    }
}

async fn wait_for(sink: &MemorySink, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..500 {
        if let Some(v) = sink.events().into_iter().find(|v| pred(v)) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("event not seen; got {:?}", sink.events());
}

fn is(kind: &'static str) -> impl Fn(&Value) -> bool {
    move |v| v["event"] == kind
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_campaigns_in_one_process_hand_over_on_shutdown() {
    let backend: tenure::DynBackend = Arc::new(MemoryBackend::new());
    let (sa, sb) = (MemorySink::default(), MemorySink::default());
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let args_a = campaign_args(&["--election", "jobs/nightly", "--id", "a", "--ttl", "2"]);
    let args_b = campaign_args(&["--election", "jobs/nightly", "--id", "b", "--ttl", "2"]);
    let a = {
        let (backend, sink, stop) = (backend.clone(), Arc::new(sa.clone()), stop_a.clone());
        tokio::spawn(async move { run_campaign(backend, &args_a, sink, stop).await })
    };
    let elected_a = wait_for(&sa, is("elected")).await;
    let b = {
        let (backend, sink, stop) = (backend.clone(), Arc::new(sb.clone()), stop_b.clone());
        tokio::spawn(async move { run_campaign(backend, &args_b, sink, stop).await })
    };
    wait_for(&sb, is("campaigning")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sb.events().iter().all(|v| v["event"] != "elected"));
    stop_a.cancel();
    a.await.unwrap().unwrap();
    let resigned_a = wait_for(&sa, is("resigned")).await;
    let elected_b = wait_for(&sb, is("elected")).await;

    for v in [&elected_a, &resigned_a, &elected_b] {
        assert_eq!(v["election"], "jobs/nightly");
        assert!(v["mono_ns"].as_u64().unwrap() > 0);
        assert!(v["token"].as_u64().is_some());
    }
    assert_eq!(elected_a["id"], "a");
    assert_eq!(resigned_a["cause"], "shutdown");
    assert_eq!(resigned_a["token"], elected_a["token"]);
    assert_eq!(elected_b["id"], "b");
    assert!(elected_b["token"].as_u64() > elected_a["token"].as_u64());
    // a's tenure ended before b's began.
    assert!(resigned_a["mono_ns"].as_u64() <= elected_b["mono_ns"].as_u64());
    stop_b.cancel();
    b.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_only_while_leader_and_is_killed_on_loss() {
    let mem = MemoryBackend::new();
    let backend: tenure::DynBackend = Arc::new(mem.clone());
    let dir = std::env::temp_dir().join(format!("tenure-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let script = format!(
        "echo \"$$ $TENURE_TOKEN $TENURE_ELECTION $TENURE_ID\" >> {}; exec sleep 1000",
        log.display()
    );
    let args = campaign_args(&[
        "--election",
        "jobs/cmd",
        "--id",
        "runner-1",
        "--ttl",
        "2",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let sink = MemorySink::default();
    let stop = CancellationToken::new();
    let task = {
        let (backend, sink, stop) = (backend.clone(), Arc::new(sink.clone()), stop.clone());
        tokio::spawn(async move { run_campaign(backend, &args, sink, stop).await })
    };
    let first = wait_for(&sink, is("elected")).await;
    let read_lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    for _ in 0..200 {
        if !read_lines().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = read_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let pid: i32 = lines[0][0].parse().unwrap();
    assert_eq!(lines[0][1], first["token"].as_u64().unwrap().to_string());
    assert_eq!(
        lines[0][2..],
        ["jobs/cmd".to_string(), "runner-1".to_string()]
    );
    assert!(alive(pid));

    // The store expires the session: leadership is lost, the command killed, and the
    // campaign goes on with a new token.
    let id = mem.session_ids().pop().unwrap();
    assert!(mem.expire_session(&id));
    let lost = wait_for(&sink, is("lost")).await;
    assert_eq!(lost["reason"], "session expired");
    for _ in 0..200 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!alive(pid), "command survived the loss of leadership");
    let second = wait_for(&sink, |v| {
        v["event"] == "elected" && v["token"] != first["token"]
    })
    .await;
    assert!(second["token"].as_u64() > first["token"].as_u64());
    for _ in 0..200 {
        if read_lines().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        read_lines()[1][1],
        second["token"].as_u64().unwrap().to_string()
    );
    stop.cancel();
    task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at /proc for its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}

fn tenure() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
}

#[test]
fn bad_input_prints_one_line_and_exits_2() {
    let cases: &[&[&str]] = &[
        &["campaign", "--election", "a b", "--id", "x"],
        &["campaign", "--election", "", "--id", "x"],
        &["campaign", "--election", "e", "--id", "x", "--ttl", "0"],
        &["campaign", "--election", "e", "--id", "x", "--ttl", "-1"],
        &[
            "campaign",
            "--election",
            "e",
            "--id",
            "x",
            "--ttl",
            "10",
            "--renew-interval",
            "20",
        ],
        &[
            "campaign",
            "--election",
            "e",
            "--id",
            "x",
            "--ttl",
            "10",
            "--renew-deadline",
            "10",
        ],
        &[
            "campaign",
            "--backend",
            "zz://x",
            "--election",
            "e",
            "--id",
            "x",
        ],
        &[
            "campaign",
            "--backend",
            "not a url",
            "--election",
            "e",
            "--id",
            "x",
        ],
        &[
            "campaign",
            "--election",
            "e",
            "--id",
            "x",
            "--",
            "/no/such/program",
        ],
        &["observe", "--election", "a//b"],
        &["campaign", "--election", "e"],
        &["campaign", "--election", "e", "--id", "x", "--ttl", "soon"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = tenure().args(*args).stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("tenure: invalid_argument: "),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn sigterm_resigns_and_exits_0() {
    use std::io::{BufRead, BufReader};
    let mut child = tenure()
        .args(["campaign", "--election", "e", "--id", "solo", "--ttl", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let elected = v["event"] == "elected";
        seen.push(v);
        if elected {
            break;
        }
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    for line in lines {
        seen.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let kinds: Vec<_> = seen
        .iter()
        .map(|v| v["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["campaigning", "elected", "resigned"]);
    assert_eq!(seen[2]["cause"], "shutdown");
}

#[test]
fn a_killed_supervisor_takes_its_command_with_it() {
    let dir = std::env::temp_dir().join(format!("tenure-cli-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 1000", pidfile.display());
    let mut child = tenure()
        .args([
            "campaign",
            "--election",
            "e",
            "--id",
            "k",
            "--ttl",
            "2",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pid = None;
    for _ in 0..300 {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            pid = Some(p);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = pid.expect("the command started");
    assert!(alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    let mut gone = false;
    for _ in 0..300 {
        if !alive(pid) {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "the command outlived its SIGKILLed supervisor");
    let _ = std::fs::remove_dir_all(&dir);
}
