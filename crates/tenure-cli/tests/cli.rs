//! The `tenure` binary as a process: its handling of signals and bad input. (Campaigns
//! driven in-process, two on one in-memory store, are unit tests in `src/campaign.rs`.)

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

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
