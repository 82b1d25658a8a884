//! Planned transitions (contract clause 15, issue 34) through the CLI on every real
//! store: the old leader's command stops before the successor is granted, and the
//! leaderless gap is the command's drain plus one handover. See
//! `tenure_integration::planned` for what a run does and checks.
//!
//! The bounded suite (one test per store, the stores one at a time): 3 runs of each of
//! SIGTERM to the leader (drain 1 s), a `--priority 10` candidate joining, `tenure
//! handover` and a `tenure shards run` drain (drain 100 ms each); every run must put
//! the successor's grant after the old command's last write, with a gap under drain +
//! 1 s (Azure: + 2 s); plus one leader whose command ignores SIGTERM (`--grace 1`): it
//! is SIGKILLed at the grace and only then is the successor granted.
//!
//! The full runs: `TENURE_PLANNED_RUNS=10` makes each store's test run every transition
//! with drains of 0 ms, 100 ms and 1 s, 10 times each; the ignored test runs that on
//! every store and prints one table:
//!
//! ```text
//! cargo build -p tenure-cli
//! cargo test -p tenure-integration --test planned_transitions -- --ignored --nocapture
//! ```
//!
//! `TENURE_PLANNED_ONLY=drain` (a comma-separated list of `shutdown`, `preempt`,
//! `handover`, `drain`) keeps only those transitions, to repeat one.

use std::time::Duration;

use tenure_integration::planned::{PlannedBench, PlannedPlan, PlannedStore, PlannedTable};

/// The stores one at a time: the runs measure latency on 2 cores.
static ONE_STORE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `plan` on `store` and the grace check; prints the table; returns it with the
/// problems found (failed runs, gaps over the bound, a failed grace check).
async fn on_store(store: PlannedStore, plan: &PlannedPlan) -> (PlannedTable, Vec<String>) {
    let mut bench = PlannedBench::start(store)
        .await
        .unwrap_or_else(|e| panic!("starting {}: {e}", store.name()));
    let table = bench.run_plan(plan).await;
    let mut problems = table.failures();
    // Runs that kept the order but took longer than a transition should, with their
    // event lines.
    problems.extend(bench.slow_runs().iter().cloned());
    match bench.unacknowledged_step_down().await {
        Ok((last_write, grant)) => {
            let grace = Duration::from_secs(1).as_nanos() as u64;
            println!(
                "{}: a command that ignores SIGTERM (--grace 1): last write {:.0} ms and the successor's grant {:.0} ms after stepping_down",
                store.name(),
                last_write as f64 / 1e6,
                grant as f64 / 1e6
            );
            let over = grant.saturating_sub(grace);
            if over > store.bound().as_nanos() as u64 {
                problems.push(format!(
                    "{}: the successor of a deaf command was granted {:.0} ms after the 1 s grace",
                    store.name(),
                    over as f64 / 1e6
                ));
            }
        }
        Err(why) => problems.push(format!("{}: deaf command: {why}", store.name())),
    }
    let (median, p99) = bench.write_interval();
    println!(
        "{}: the commands wrote every {median:.1?} (median; 99th percentile {p99:.1?})",
        store.name()
    );
    println!("{}", table.markdown());
    (table, problems)
}

async fn check_store(store: PlannedStore) {
    let _one = ONE_STORE_AT_A_TIME.lock().await;
    let (_, problems) = on_store(store, &PlannedPlan::from_env()).await;
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_transitions_on_etcd() {
    check_store(PlannedStore::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_transitions_on_zookeeper() {
    check_store(PlannedStore::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_transitions_on_redis() {
    check_store(PlannedStore::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_transitions_on_postgres() {
    check_store(PlannedStore::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_transitions_on_azure() {
    check_store(PlannedStore::Azure).await;
}

/// The README's table: 10 runs (or `TENURE_PLANNED_RUNS`) of every transition with
/// every drain on every store, one store after another; one table at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 10 minutes: the full runs for the README's table"]
async fn planned_transitions_full_table() {
    let _one = ONE_STORE_AT_A_TIME.lock().await;
    let runs = match PlannedPlan::from_env() {
        p if p.cells.len() > 4 => p.runs,
        _ => 10,
    };
    let plan = PlannedPlan::full(runs);
    let mut all = PlannedTable::default();
    let mut problems = Vec::new();
    for store in PlannedStore::ALL {
        let (table, found) = on_store(store, &plan).await;
        all.extend(table);
        problems.extend(found);
    }
    println!("all stores, {runs} runs each:\n{}", all.markdown());
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
