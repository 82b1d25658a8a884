//! The `tenure` binary against a real store: `tenure shards status` reads the map of
//! shard managers running in this test process on Redis, and `tenure demo --backend`
//! runs its script there.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::{DynBackend, Timing};
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::RedisServer;
use tenure_redis::RedisBackend;
use tenure_shard::{Layout, ShardManager};

fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(2));
    t.connect_timeout = Duration::from_secs(2);
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_status_reads_managers_of_another_process() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix=cli-shards", server.endpoint());
    let layout = Layout::new("billing", 16, 2).unwrap();
    let mut nodes = Vec::new();
    for id in ["n1", "n2", "n3"] {
        let backend: DynBackend = Arc::new(RedisBackend::from_url(&url).await.expect("connect"));
        let (m, events) = ShardManager::builder(backend)
            .layout(layout.clone())
            .node_id(id)
            .timing(timing())
            .start()
            .await
            .expect("start");
        drop(events);
        nodes.push(m);
    }
    let mut settled = false;
    for _ in 0..1000 {
        settled = nodes.iter().all(|m| {
            let s = m.status().borrow().clone();
            s.members == 3 && s.settled && s.pending_handoffs == 0 && s.campaigning == 0
        });
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(settled, "the managers did not settle");
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Command::new(tenure_bin())
                .args(["shards", "status", "--backend", &url])
                .args([
                    "--namespace",
                    "billing",
                    "--shards",
                    "16",
                    "--replication",
                    "2",
                ])
                .output()
                .expect("run tenure")
        }
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("namespace billing: 16 shards, replication 2, 3 members; settled"),
        "{text}"
    );
    let snapshot = nodes[0].snapshot().await.expect("snapshot");
    for info in &snapshot.shards {
        let leader = info.leader.clone().expect("a leader");
        let token = info.token.expect("a token").get();
        let row = format!("| {} | {leader} | {token} | ", info.shard.name());
        assert!(text.contains(&row), "{row:?} missing from:\n{text}");
    }
    for id in ["n1", "n2", "n3"] {
        assert!(text.contains(&format!("| {id} | 1 | no |")), "{text}");
    }
    for m in &nodes {
        m.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_redis() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix=cli-demo", server.endpoint());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(tenure_bin())
            .args(["demo", "--json", "--backend", &url])
            .args(["--nodes", "4", "--shards", "64", "--replication", "2"])
            .output()
            .expect("run tenure")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
