//! Bad arguments are reported as such even when the store cannot be reached: every
//! command checks its pure input (names, ids, namespaces, timings, …) before it
//! connects. The backends here are closed ports (nothing listens on port 1), so a
//! command that connected first would fail with `unavailable` or `timeout` (exit 1).

mod common;

use std::process::{Output, Stdio};

use common::assert_invalid_argument;

/// Backend URLs on a closed port, one per network backend built in by default.
const CLOSED: &[&str] = &[
    "redis://127.0.0.1:1",
    "zk://127.0.0.1:1",
    "etcd://127.0.0.1:1",
    "azblob://devstoreaccount1/c?endpoint=http://127.0.0.1:1",
];

fn tenure(args: &[&str]) -> Output {
    common::tenure()
        .args(args)
        // Azure needs a key to get as far as connecting; Azurite's well-known one.
        .env(
            "AZURE_STORAGE_KEY",
            "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
        )
        .stdin(Stdio::null())
        .output()
        .expect("run tenure")
}

/// `args` (a command line without `--backend`) is rejected on every closed backend with
/// exit 2 and one line `tenure: invalid_argument: …` that mentions `field`.
fn rejected_before_connecting(args: &[&str], field: &str) {
    for backend in CLOSED {
        let mut argv: Vec<&str> = args.to_vec();
        // After the subcommand(s), before a `--` command.
        let at = argv
            .iter()
            .position(|a| a.starts_with("--"))
            .unwrap_or(argv.len());
        argv.splice(at..at, ["--backend", backend]);
        if !argv.contains(&"--connect-timeout") {
            // Bounds the failure of a command that would connect first.
            argv.splice(at..at, ["--connect-timeout", "2"]);
        }
        let stderr = assert_invalid_argument(&tenure(&argv), &argv);
        assert!(stderr.contains(field), "{argv:?}: no {field:?} in {stderr}");
    }
}

#[test]
fn campaign_checks_before_connecting() {
    let e = ["campaign", "--election", "jobs/nightly", "--id", "a"];
    rejected_before_connecting(
        &["campaign", "--election", "bad name!!", "--id", "a"],
        "bad name!!",
    );
    rejected_before_connecting(&["campaign", "--election", "a//b", "--id", "a"], "a//b");
    rejected_before_connecting(
        &["campaign", "--election", "jobs/nightly", "--id", ""],
        "id",
    );
    rejected_before_connecting(
        &["campaign", "--election", "jobs/nightly", "--id", "bad id\n"],
        "id",
    );
    rejected_before_connecting(&[&e[..], &["--value", "bell\u{7}"]].concat(), "value");
    rejected_before_connecting(&[&e[..], &["--grace", "-1"]].concat(), "grace");
    rejected_before_connecting(&[&e[..], &["--ttl", "0"]].concat(), "ttl");
    rejected_before_connecting(
        &[&e[..], &["--ttl", "10", "--renew-interval", "20"]].concat(),
        "renew_interval",
    );
    rejected_before_connecting(
        &[&e[..], &["--ttl", "10", "--renew-deadline", "10"]].concat(),
        "renew_deadline",
    );
    rejected_before_connecting(
        &[&e[..], &["--", "/no/such/program"]].concat(),
        "/no/such/program",
    );
}

#[test]
fn observe_checks_before_connecting() {
    rejected_before_connecting(&["observe", "--election", "bad name!!"], "bad name!!");
    rejected_before_connecting(&["observe", "--election", ""], "election");
    rejected_before_connecting(
        &[
            "observe",
            "--election",
            "jobs/nightly",
            "--connect-timeout",
            "0",
        ],
        "connect_timeout",
    );
}

#[test]
fn shards_status_checks_before_connecting() {
    let s = ["shards", "status"];
    rejected_before_connecting(
        &[&s[..], &["--namespace", "bad ns!!", "--shards", "8"]].concat(),
        "bad ns!!",
    );
    rejected_before_connecting(
        &[&s[..], &["--namespace", "orders", "--shards", "0"]].concat(),
        "shards",
    );
    // A valid command line but for one option.
    let orders = [&s[..], &["--namespace", "orders", "--shards", "8"]].concat();
    rejected_before_connecting(
        &[&orders[..], &["--replication", "0"]].concat(),
        "replication",
    );
    rejected_before_connecting(
        &[&orders[..], &["--connect-timeout", "0"]].concat(),
        "connect_timeout",
    );
}

#[test]
fn demo_checks_before_connecting() {
    for (args, field) in [
        (&["demo", "--nodes", "1"][..], "nodes"),
        (&["demo", "--shards", "0"][..], "shards"),
        (&["demo", "--ttl", "0"][..], "ttl"),
        (&["demo", "--namespace", "bad ns!!"][..], "bad ns!!"),
    ] {
        // demo has no --connect-timeout (its TTL's timing has one): add the backend only.
        for backend in CLOSED {
            let argv = [args, &["--backend", backend]].concat();
            let stderr = assert_invalid_argument(&tenure(&argv), &argv);
            assert!(stderr.contains(field), "{argv:?}: no {field:?} in {stderr}");
        }
    }
}
