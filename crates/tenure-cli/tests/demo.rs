//! `tenure demo` end to end on the in-memory backend: the binary's JSON summary and
//! its piped (non-terminal) output.

mod common;

use common::{assert_invalid_argument, tenure};
use serde_json::Value;

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v:#}"))
}

#[test]
fn the_json_summary_is_complete_and_sane() {
    let out = tenure()
        .args(["demo", "--json"])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tenure demo failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(v["backend"], "mem://");
    assert_eq!(f(&v, &["nodes"]), 5.0);
    assert_eq!(f(&v, &["shards"]), 256.0);
    assert_eq!(f(&v, &["replication"]), 3.0);
    assert_eq!(f(&v, &["ttl_ms"]), 2000.0);
    assert!(f(&v, &["converge_ms"]) > 0.0);

    // One crash; its shards are led again, after no more than TTL + a renew interval
    // plus slack for a loaded machine.
    let crashes = v["crashes"].as_array().expect("crashes");
    assert_eq!(crashes.len(), 1);
    assert!(f(&crashes[0], &["shards"]) > 0.0);
    let failover = f(&crashes[0], &["failover_ms"]);
    assert!(failover > 0.0 && failover < 20_000.0, "failover {failover}");

    // The join moves about the newcomer's share and nothing else.
    let (moves, optimum) = (f(&v, &["join", "moves"]), f(&v, &["join", "optimum"]));
    assert!(optimum >= (256 / 5) as f64, "optimum {optimum}");
    assert!(
        moves >= optimum && moves <= 1.1 * optimum,
        "{moves} moves, optimum {optimum}"
    );
    assert_eq!(f(&v, &["join", "gaps", "count"]), moves);

    // The drain hands over everything the drained node led.
    assert!(f(&v, &["drain", "handoffs"]) > 0.0);
    assert!(f(&v, &["drain", "gaps", "max_ms"]) >= f(&v, &["drain", "gaps", "min_ms"]));

    // At the end: every shard led, four nodes left, balanced.
    assert_eq!(f(&v, &["end", "led"]), 256.0);
    assert_eq!(f(&v, &["end", "leaderless"]), 0.0);
    let per_node = v["end"]["per_node"].as_object().expect("per_node");
    assert_eq!(per_node.len(), 4, "{per_node:?}");
    assert_eq!(
        per_node.values().filter_map(Value::as_u64).sum::<u64>(),
        256
    );
    assert!(f(&v, &["end", "imbalance"]) <= 1.1);
    assert!(f(&v, &["end", "max_leaders"]) <= 1.1 * f(&v, &["end", "mean_leaders"]));
    assert!(f(&v, &["wall_ms"]) < 60_000.0);
    // Progress went to stderr, readable.
    assert!(stderr.contains("converged in"), "{stderr}");
}

#[test]
fn piped_output_has_lines_and_a_table_without_escape_codes() {
    let out = tenure()
        .args([
            "demo",
            "--nodes",
            "3",
            "--shards",
            "32",
            "--replication",
            "2",
            "--ttl",
            "1",
        ])
        .output()
        .expect("run tenure");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tenure demo failed: {stderr}");
    assert!(
        !stdout.contains('\x1b'),
        "escape codes in piped output: {stdout:?}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in piped stderr: {stderr:?}"
    );
    for needle in [
        "starting 3 nodes",
        "converged in",
        "crashed node-2",
        "added node-4",
        "drained node-1",
        "| time to converge |",
        "| failover after crash of node-2 |",
        "| moves on join of node-4 vs optimum |",
        "32 of 32 shards led",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}

#[test]
fn bad_demo_arguments_exit_2_with_one_line() {
    for args in [
        vec!["demo", "--nodes", "1"],
        vec!["demo", "--shards", "0"],
        vec!["demo", "--replication", "0"],
        vec!["demo", "--ttl", "-1"],
        vec!["demo", "--backend", "nope://x"],
        vec!["demo", "--nodes", "3", "--zones", "4"],
    ] {
        let out = tenure().args(&args).output().expect("run tenure");
        assert_invalid_argument(&out, &args);
    }
}

#[test]
fn zones_spread_the_leaders_and_the_summary_counts_them() {
    let out = tenure()
        .args([
            "demo", "--nodes", "6", "--zones", "3", "--shards", "120", "--ttl", "1", "--json",
        ])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tenure demo failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(f(&v, &["end", "led"]), 120.0);
    // Six nodes dealt into three zones; node-4 (zone-1) crashed, node-7 joined
    // (zone-1), node-1 (zone-1) drained: zone-1 keeps one node, the others two.
    let per_zone = v["end"]["per_zone"].as_object().expect("per_zone");
    let zone = |z: &str| {
        per_zone[z]
            .as_f64()
            .unwrap_or_else(|| panic!("{z}: {per_zone:?}"))
    };
    assert_eq!(zone("zone-1") + zone("zone-2") + zone("zone-3"), 120.0);
    assert_eq!(zone("zone-2"), 2.0 * zone("zone-1"), "{per_zone:?}");
    assert_eq!(zone("zone-3"), 2.0 * zone("zone-1"), "{per_zone:?}");
}
