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

/// `tenure <args>`, which must succeed: its stdout and stderr.
fn demo(args: &[&str]) -> (String, String) {
    let out = tenure().args(args).output().expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tenure demo failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// `tenure <args>` with `--json` among `args`: the JSON summary and stderr.
fn demo_json(args: &[&str]) -> (Value, String) {
    let (stdout, stderr) = demo(args);
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout}"));
    (v, stderr)
}

/// Asserts that every one of `needles` stands in `stdout`.
fn assert_shows(stdout: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}

#[test]
fn the_json_summary_is_complete_and_sane() {
    let (v, stderr) = demo_json(&["demo", "--json"]);
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
    let (stdout, stderr) = demo(&[
        "demo",
        "--nodes",
        "3",
        "--shards",
        "32",
        "--replication",
        "2",
        "--ttl",
        "1",
    ]);
    assert!(
        !stdout.contains('\x1b'),
        "escape codes in piped output: {stdout:?}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in piped stderr: {stderr:?}"
    );
    assert_shows(
        &stdout,
        &[
            "starting 3 nodes",
            "converged in",
            "crashed node-2",
            "added node-4",
            "drained node-1",
            "| time to converge |",
            "| failover after crash of node-2 |",
            "| moves on join of node-4 vs optimum |",
            "32 of 32 shards led",
        ],
    );
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
        vec!["demo", "--load", "pareto"],
        vec!["demo", "--load", ""],
    ] {
        let out = tenure().args(&args).output().expect("run tenure");
        assert_invalid_argument(&out, &args);
    }
    // An unknown --load names the values it takes, on its one line.
    let out = tenure()
        .args(["demo", "--load", "pareto"])
        .output()
        .expect("run tenure");
    let line = assert_invalid_argument(&out, &"--load pareto");
    assert!(
        line.contains("'pareto'") && line.contains("--load") && line.contains("none, zipf"),
        "{line}"
    );
}

/// `--load zipf`: the JSON summary's load per node by count (the cold start's leaders)
/// and once balanced by load, checked against each other and the lower bound.
#[test]
fn load_zipf_balances_the_load_per_node_beside_the_count_baseline() {
    let (v, stderr) = demo_json(&[
        "demo", "--load", "zipf", "--nodes", "4", "--shards", "200", "--json",
    ]);
    let load = &v["load"];
    let (by_count, by_load, bound) = (
        f(load, &["max_over_mean_by_count"]),
        f(load, &["max_over_mean_by_load"]),
        f(load, &["lower_bound"]),
    );
    assert!(by_load < by_count, "{load:#}");
    assert!(by_load <= (1.02 * bound).max(1.10), "{load:#}");
    assert!(bound >= 1.0, "{load:#}");

    // The per-node figures add up and give the ratios reported.
    let per_node = load["per_node"].as_object().expect("per_node");
    assert_eq!(per_node.len(), 4, "{load:#}");
    let total = f(load, &["total"]);
    for (column, shards) in [
        ("by_count", "shards_by_count"),
        ("by_load", "shards_by_load"),
    ] {
        let loads: Vec<f64> = per_node.values().map(|n| f(n, &[column])).collect();
        let sum: f64 = loads.iter().sum();
        assert!(
            (sum - total).abs() < 1e-6 * total,
            "{column}: {sum} of {total}"
        );
        let led: f64 = per_node.values().map(|n| f(n, &[shards])).sum();
        assert_eq!(led, 200.0, "{shards}: {load:#}");
        let max = loads.iter().copied().fold(0.0, f64::max);
        let ratio = max / (sum / 4.0);
        let reported = f(load, &[&format!("max_over_mean_{column}")]);
        assert!(
            (ratio - reported).abs() < 1e-9,
            "{column}: {ratio} vs {reported}"
        );
    }
    // The count plan: shares of 50 shards (±1); the bound from the largest figure.
    for n in per_node.values() {
        assert!(
            (49.0..=51.0).contains(&f(n, &["shards_by_count"])),
            "{load:#}"
        );
    }
    let largest = f(load, &["largest"]);
    assert!(
        (bound - (largest / (total / 4.0)).max(1.0)).abs() < 1e-9,
        "{load:#}"
    );
    // It took moves to get there, and the script still ran to its end.
    assert!(f(load, &["moves"]) > 0.0, "{load:#}");
    assert_eq!(f(&v, &["end", "led"]), 200.0);
    let end = f(&v, &["end", "load_imbalance"]);
    assert!(
        end >= 1.0 && end <= (1.02 * f(&v, &["end", "load_lower_bound"])).max(1.10),
        "{v:#}"
    );
    assert!(stderr.contains("balanced by load in"), "{stderr}");
}

/// `--load zipf` with zones, piped: the bars of each node, by count and by load, in
/// the progress and under the table.
#[test]
fn load_zipf_with_zones_draws_the_bars() {
    let (stdout, _) = demo(&[
        "demo", "--load", "zipf", "--nodes", "6", "--zones", "3", "--shards", "120", "--ttl", "1",
    ]);
    assert_shows(
        &stdout,
        &[
            "balanced by load in",
            "| load per node, max / mean: by count → by load |",
            "| balance by load |",
            "| load per node at the end, max / mean |",
            "| leaders per zone at the end |",
            "load per node after the cold start (by count) and once balanced by load:",
            "120 of 120 shards led",
        ],
    );
    // Each of the six nodes has a line of bars in the progress and under the table.
    for i in 1..=6 {
        let bars = stdout
            .lines()
            .filter(|l| {
                l.starts_with(&format!("  node-{i}  by count █"))
                    && l.contains(" by load █")
                    && (l.ends_with(" shards)") || l.ends_with(" 1 shard)"))
            })
            .count();
        assert_eq!(bars, 2, "node-{i}:\n{stdout}");
    }
}

#[test]
fn zones_spread_the_leaders_and_the_summary_counts_them() {
    let (v, _) = demo_json(&[
        "demo", "--nodes", "6", "--zones", "3", "--shards", "120", "--ttl", "1", "--json",
    ]);
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
