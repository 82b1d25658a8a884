//! `--metrics-addr`: the binary serves Prometheus metrics while it campaigns.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::assert_invalid_argument;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[test]
fn campaign_serves_leader_metrics() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args([
            "campaign",
            "--backend",
            "mem://",
            "--election",
            "metrics/demo",
            "--id",
            "a",
            "--ttl",
            "1",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tenure");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let elected = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("\"elected\""));
    assert!(elected.is_some(), "never elected");
    // Renewals every 250 ms record their latency; wait for a couple.
    let mut body = String::new();
    for _ in 0..50 {
        body = scrape(port).unwrap_or_default();
        if body.contains("tenure_renew_latency_seconds") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    terminate(&mut child);
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains(r#"tenure_leader{backend="mem",election="metrics/demo"} 1"#),
        "{body}"
    );
    assert!(
        body.contains("tenure_leadership_transitions_total"),
        "{body}"
    );
    assert!(body.contains("tenure_renew_latency_seconds"), "{body}");
}

fn terminate(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[test]
fn a_bad_metrics_address_is_invalid_argument() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for value in ["nonsense", addr.as_str()] {
        let out = common::tenure()
            .args(["observe", "--backend", "mem://", "--election", "x"])
            .args(["--metrics-addr", value])
            .output()
            .expect("run tenure");
        let stderr = assert_invalid_argument(&out, &value);
        assert!(stderr.contains("metrics"), "{value}: {stderr}");
    }
}
