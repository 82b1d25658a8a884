//! The `tenure` binary as a process: its handling of signals and bad input. (Campaigns
//! driven in-process, two on one in-memory store, are unit tests in `src/campaign.rs`.)

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{assert_invalid_argument, tenure};
use serde_json::Value;

fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); look at /proc for its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}

#[test]
fn bad_input_prints_one_line_and_exits_2() {
    let e = ["campaign", "--election", "e", "--id", "x"];
    let campaign = |more: &[&'static str]| [&e[..], more].concat();
    let cases: Vec<Vec<&str>> = vec![
        vec!["campaign", "--election", "a b", "--id", "x"],
        vec!["campaign", "--election", "", "--id", "x"],
        campaign(&["--ttl", "0"]),
        campaign(&["--ttl", "-1"]),
        campaign(&["--ttl", "10", "--renew-interval", "20"]),
        campaign(&["--ttl", "10", "--renew-deadline", "10"]),
        campaign(&["--backend", "zz://x"]),
        campaign(&["--backend", "not a url"]),
        campaign(&["--", "/no/such/program"]),
        vec!["observe", "--election", "a//b"],
        vec!["campaign", "--election", "e"],
        campaign(&["--ttl", "soon"]),
        vec!["frobnicate"],
    ];
    for args in &cases {
        let out = tenure().args(args).stdin(Stdio::null()).output().unwrap();
        assert_invalid_argument(&out, args);
    }
}

#[test]
fn sigterm_steps_down_resigns_and_exits_0() {
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
    assert_eq!(
        kinds,
        ["campaigning", "elected", "stepping_down", "resigned"]
    );
    assert_eq!(seen[2]["reason"], "shutdown");
    assert_eq!(seen[3]["cause"], "shutdown");
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
