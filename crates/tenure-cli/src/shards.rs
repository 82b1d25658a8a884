//! `tenure shards status`: the shard map of a namespace (leader, token and replica set
//! of every shard), a leaders-per-node histogram and the members, read through a
//! [`ShardMap`] (no registration, no campaigning).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

use tenure::shard::{Layout, ShardMap, ShardView};
use tenure::{DynBackend, Error, ErrorKind, Result, Timing};
use tokio_util::sync::CancellationToken;

/// What `status` reads.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// Namespace, shard count and replication: the same as the nodes'.
    pub layout: Layout,
    /// Session timing of the reader (its TTL matters little: it holds nothing).
    pub timing: Timing,
    /// Keep printing the map on every change.
    pub watch: bool,
    /// Clear the screen before each refresh (a terminal).
    pub clear: bool,
}

/// The map as text: a summary line, a table of shards, a histogram, the members.
pub fn render(view: &ShardView, layout: &Layout) -> String {
    let mut s = String::new();
    let state = if view.nodes.is_empty() {
        "no members".to_string()
    } else if view.settled() {
        "settled".to_string()
    } else {
        format!(
            "{} leaderless, {} not on their preferred node",
            view.leaderless(),
            view.misplaced()
        )
    };
    let _ = writeln!(
        s,
        "namespace {}: {} shards, replication {}, {} members; {state}",
        layout.namespace(),
        view.shards.len(),
        layout.replication(),
        view.nodes.len()
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "| shard | leader | token | replicas |");
    let _ = writeln!(s, "|---|---|---:|---|");
    for info in &view.shards {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            info.shard.name(),
            info.leader.as_deref().unwrap_or("–"),
            info.token.map_or("–".to_string(), |t| t.get().to_string()),
            info.replicas.join(", ")
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "leaders per node:");
    let mut leads: BTreeMap<&str, usize> =
        view.nodes.iter().map(|n| (n.id.as_str(), 0usize)).collect();
    for l in view.shards.iter().filter_map(|i| i.leader.as_deref()) {
        *leads.entry(l).or_default() += 1;
    }
    let leaderless = view.leaderless();
    let max = leads
        .values()
        .copied()
        .max()
        .unwrap_or(0)
        .max(leaderless)
        .max(1);
    let width = leads.keys().map(|k| k.len()).max().unwrap_or(0).max(10);
    for (id, c) in &leads {
        let _ = writeln!(s, "  {id:<width$} {:<40} {c}", "#".repeat(c * 40 / max));
    }
    if leaderless > 0 {
        let _ = writeln!(
            s,
            "  {:<width$} {:<40} {leaderless}",
            "(none)",
            "#".repeat(leaderless * 40 / max)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "members:");
    let _ = writeln!(s, "| member | zone | weight | draining | leads | target |");
    let _ = writeln!(s, "|---|---|---:|---|---:|---:|");
    for n in &view.nodes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            n.id,
            n.zone.as_deref().unwrap_or("-"),
            n.weight,
            if n.draining { "yes" } else { "no" },
            leads.get(n.id.as_str()).copied().unwrap_or(0),
            n.target
        );
    }
    for (id, why) in &view.ignored {
        let _ = writeln!(s, "ignored member {id}: {why}");
    }
    s
}

/// Print the map of `options.layout` on `backend` to `out`: once, or (with `watch`)
/// again on every change until `shutdown`.
pub async fn run_status(
    backend: DynBackend,
    options: &StatusOptions,
    out: &mut (dyn Write + Send),
    shutdown: CancellationToken,
) -> Result<()> {
    let limit = options.timing.connect_timeout;
    let mut map = tokio::time::timeout(
        limit,
        ShardMap::watch(backend, options.layout.clone(), options.timing.clone()),
    )
    .await
    .map_err(|_| timeout(limit))??;
    // The first member list arrives through the watch; an empty namespace may never
    // send one, so give up waiting after a moment.
    let _ = tokio::time::timeout(limit.min(Duration::from_secs(2)), map.changed()).await;
    loop {
        let view = tokio::time::timeout(limit * 4, map.snapshot())
            .await
            .map_err(|_| timeout(limit * 4))??;
        let mut text = String::new();
        if options.clear {
            text.push_str("\x1b[H\x1b[2J");
        }
        text.push_str(&render(&view, map.layout()));
        write(out, &text)?;
        if !options.watch {
            return Ok(());
        }
        tokio::select! {
            r = map.changed() => r?,
            _ = shutdown.cancelled() => return Ok(()),
        }
        // Let a burst of changes (a handoff wave) settle into one refresh.
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !options.clear {
            write(out, "\n")?;
        }
    }
}

fn timeout(limit: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("no answer from the store within {limit:?}"),
    )
}

fn write(out: &mut (dyn Write + Send), text: &str) -> Result<()> {
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("writing the map: {e}")))
}

/// `status` against shard managers in this process on the in-memory backend (mem:// is
/// per process, so the binary could not see them).
#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tenure::shard::{Layout, ShardManager};
    use tenure::{DynBackend, MemoryBackend, Timing};
    use tokio_util::sync::CancellationToken;

    use super::{render, run_status, StatusOptions};

    fn timing() -> Timing {
        let mut t = Timing::from_ttl(Duration::from_secs(2));
        t.connect_timeout = Duration::from_secs(2);
        t
    }

    async fn cluster(backend: &DynBackend, layout: &Layout, ids: &[&str]) -> Vec<ShardManager> {
        let mut nodes = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let (m, events) = ShardManager::builder(backend.clone())
                .layout(layout.clone())
                .node_id(*id)
                .zone(format!("zone-{}", i % 2))
                .timing(timing())
                .start()
                .await
                .expect("start");
            drop(events);
            nodes.push(m);
        }
        for _ in 0..1000 {
            if nodes
                .iter()
                .all(|m| m.status().borrow().is_quiet(ids.len()))
            {
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
            .enumerate()
            .map(|(i, id)| {
                let zone = i % 2;
                let line = text
                    .lines()
                    .find(|l| l.starts_with(&format!("| {id} | zone-{zone} | 1 | no |")))
                    .unwrap_or_else(|| panic!("no member row for {id}: {text}"));
                line.split('|')
                    .map(str::trim)
                    .nth(5)
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
}
