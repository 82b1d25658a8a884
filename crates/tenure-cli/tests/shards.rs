//! `tenure shards status` through the library, against shard managers in this process
//! on the in-memory backend (mem:// is per process, so the binary cannot see them).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::shard::{Layout, ShardManager};
use tenure::{DynBackend, MemoryBackend, Timing};
use tenure_cli::shards::{render, run_status, StatusOptions};
use tokio_util::sync::CancellationToken;

fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(2));
    t.connect_timeout = Duration::from_secs(2);
    t
}

async fn cluster(backend: &DynBackend, layout: &Layout, ids: &[&str]) -> Vec<ShardManager> {
    let mut nodes = Vec::new();
    for id in ids {
        let (m, events) = ShardManager::builder(backend.clone())
            .layout(layout.clone())
            .node_id(*id)
            .timing(timing())
            .start()
            .await
            .expect("start");
        drop(events);
        nodes.push(m);
    }
    for _ in 0..1000 {
        if nodes.iter().all(|m| {
            let s = m.status().borrow().clone();
            s.members == ids.len() && s.settled && s.pending_handoffs == 0 && s.campaigning == 0
        }) {
            return nodes;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cluster did not settle");
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_shard_with_its_leader_token_and_replicas() {
    let backend: DynBackend = Arc::new(MemoryBackend::new());
    let layout = Layout::new("orders", 16, 2).unwrap();
    let nodes = cluster(&backend, &layout, &["a", "b", "c"]).await;
    let options = StatusOptions {
        layout: layout.clone(),
        timing: timing(),
        watch: false,
        clear: false,
    };
    let mut out = Buffer::default();
    run_status(
        backend.clone(),
        &options,
        &mut out,
        CancellationToken::new(),
    )
    .await
    .expect("status");
    let text = out.text();
    assert!(
        text.starts_with("namespace orders: 16 shards, replication 2, 3 members; settled"),
        "{text}"
    );
    assert!(!text.contains('\x1b'));
    for shard in layout.shards() {
        let leader = backend
            .leader(layout.election(shard))
            .await
            .unwrap()
            .expect("a leader");
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {} |", shard.name())))
            .unwrap_or_else(|| panic!("no row for {shard}: {text}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[2], leader.id, "{row}");
        assert_eq!(cells[3], leader.token.get().to_string(), "{row}");
        let replicas: Vec<&str> = cells[4].split(", ").collect();
        assert_eq!(replicas.len(), 2, "{row}");
        assert!(replicas.contains(&leader.id.as_str()), "{row}");
    }
    // The histogram and the members agree: 16 = 6 + 5 + 5 in some order.
    let mut counts: Vec<usize> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("| {id} | 1 | no |")))
                .unwrap_or_else(|| panic!("no member row for {id}: {text}"));
            line.split('|')
                .map(str::trim)
                .nth(4)
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![5, 5, 6], "{text}");
    assert!(text.contains("leaders per node:"));
    for m in &nodes {
        m.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_again_when_a_node_leaves() {
    let backend: DynBackend = Arc::new(MemoryBackend::new());
    let layout = Layout::new("jobs", 8, 2).unwrap();
    let mut nodes = cluster(&backend, &layout, &["a", "b"]).await;
    let options = StatusOptions {
        layout: layout.clone(),
        timing: timing(),
        watch: true,
        clear: false,
    };
    let out = Buffer::default();
    let stop = CancellationToken::new();
    // In this task, not spawned: the snapshot future of tenure-shard is not provably
    // Send (a higher-ranked lifetime in its buffered reads).
    let mut writer = out.clone();
    let status = run_status(backend.clone(), &options, &mut writer, stop.clone());
    let driver = async {
        for _ in 0..500 {
            if out.text().contains("2 members; settled") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let first = out.text();
        let b = nodes.pop().unwrap();
        b.close().await.unwrap();
        let mut seen = false;
        for _ in 0..500 {
            if out
                .text()
                .contains("namespace jobs: 8 shards, replication 2, 1 members")
            {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        (first, seen)
    };
    let (result, (first, seen)) = tokio::join!(status, driver);
    result.unwrap();
    assert!(first.contains("2 members; settled"), "{first}");
    assert!(seen, "no refresh after the node left: {}", out.text());
    nodes[0].close().await.unwrap();
}

#[tokio::test]
async fn an_empty_namespace_says_so() {
    let backend: DynBackend = Arc::new(MemoryBackend::new());
    let layout = Layout::new("nobody", 4, 1).unwrap();
    let map = tenure::ShardMap::watch(backend, layout.clone(), timing())
        .await
        .unwrap();
    let text = render(&map.view(), &layout);
    assert!(text.contains("0 members; no members"), "{text}");
    assert_eq!(text.matches("| – | – |").count(), 4, "{text}");
}
