//! The `tenure` binary against a real store: `tenure shards status` reads the map of
//! shard managers running in this test process on Redis, and `tenure demo --backend`
//! runs its script there.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use tenure_core::Timing;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::RedisServer;
use tenure_shard::testing::Cluster;
use tenure_shard::Layout;

fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(2));
    t.connect_timeout = Duration::from_secs(2);
    t
}

/// `tenure ARGS` run to its exit; panics with its stderr if it fails.
async fn tenure(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = move || Command::new(tenure_bin()).args(&args).output();
    let out = tokio::task::spawn_blocking(run)
        .await
        .unwrap()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_status_reads_managers_of_another_process() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix=cli-shards", server.endpoint());
    let layout = Layout::new("billing", 16, 2).unwrap();
    let connect_url = url.clone();
    let connect = Arc::new(move || {
        let url = connect_url.clone();
        Box::pin(async move { tenure::connect(&url).await }) as _
    });
    let mut cluster = Cluster::new(connect, layout, timing()).await;
    for id in ["n1", "n2", "n3"] {
        cluster.add(id).await;
    }
    cluster.settle(Duration::from_secs(10)).await;
    let status = "shards status --namespace billing --shards 16 --replication 2 --backend";
    let mut args: Vec<&str> = status.split(' ').collect();
    args.push(&url);
    let out = tenure(&args).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.starts_with("namespace billing: 16 shards, replication 2, 3 members; settled"),
        "{text}"
    );
    let snapshot = cluster.nodes["n1"].snapshot().await.expect("snapshot");
    for info in &snapshot.shards {
        let leader = info.leader.clone().expect("a leader");
        let token = info.token.expect("a token").get();
        let row = format!("| {} | {leader} | {token} | ", info.shard.name());
        assert!(text.contains(&row), "{row:?} missing from:\n{text}");
    }
    for id in ["n1", "n2", "n3"] {
        assert!(text.contains(&format!("| {id} | - | 1 | no |")), "{text}");
    }
    cluster.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_redis() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix=cli-demo", server.endpoint());
    let demo = "demo --json --nodes 4 --shards 64 --replication 2 --backend";
    let mut args: Vec<&str> = demo.split(' ').collect();
    args.push(&url);
    let out = tenure(&args).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(v["end"]["led"], 64, "{v:#}");
    assert_eq!(v["end"]["leaderless"], 0, "{v:#}");
    assert!(v["end"]["imbalance"].as_f64().unwrap() <= 1.1, "{v:#}");
    let (moves, optimum) = (
        v["join"]["moves"].as_f64().unwrap(),
        v["join"]["optimum"].as_f64().unwrap(),
    );
    assert!(optimum > 0.0 && moves <= 1.1 * optimum, "{v:#}");
}
