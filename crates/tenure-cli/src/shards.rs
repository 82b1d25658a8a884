//! `tenure shards status`: the shard map of a namespace (leader, token and replica set
//! of every shard), a leaders-per-node histogram and the members, read through a
//! [`ShardMap`] (no registration, no campaigning). When the nodes balance by load and
//! report figures, also each shard's load, each node's load and a load-per-node
//! histogram; without figures the output is as before.

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

/// A load figure as the tables show it: thousands separated above 100, three
/// significant digits or so below.
fn show_load(v: f64) -> String {
    if v >= 100.0 {
        crate::demo::thousands(v)
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The map as text: a summary line, a table of shards, a histogram, the members. With
/// load figures published: a load column in both tables and a load histogram.
pub fn render(view: &ShardView, layout: &Layout) -> String {
    let loaded = view.shards.iter().any(|i| i.load.is_some());
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
    if loaded {
        let _ = writeln!(s, "| shard | leader | token | replicas | load |");
        let _ = writeln!(s, "|---|---|---:|---|---:|");
    } else {
        let _ = writeln!(s, "| shard | leader | token | replicas |");
        let _ = writeln!(s, "|---|---|---:|---|");
    }
    for info in &view.shards {
        let load = match (loaded, info.load) {
            (false, _) => String::new(),
            (true, Some(l)) => format!(" {} |", show_load(l)),
            (true, None) => " – |".to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |{load}",
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
    // Each node's load: the figures of the shards the table shows it leading (so
    // the load column agrees with the leads column).
    let mut loads: BTreeMap<&str, f64> = view.nodes.iter().map(|n| (n.id.as_str(), 0.0)).collect();
    for i in &view.shards {
        if let Some(l) = i.leader.as_deref() {
            *leads.entry(l).or_default() += 1;
            *loads.entry(l).or_default() += i.load.unwrap_or(0.0);
        }
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
    if loaded {
        let top = loads.values().copied().fold(0.0, f64::max);
        // Load per weight of the active nodes: the most over the mean.
        let (mut total, mut weight, mut worst) = (0.0f64, 0.0f64, 0.0f64);
        for n in view.nodes.iter().filter(|n| !n.draining && n.weight > 0) {
            let l = loads.get(n.id.as_str()).copied().unwrap_or(0.0);
            total += l;
            weight += f64::from(n.weight);
            worst = worst.max(l / f64::from(n.weight));
        }
        let imbalance = if total > 0.0 {
            worst * weight / total
        } else {
            0.0
        };
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "load per node (max / mean of the active nodes {imbalance:.3}):"
        );
        for (id, l) in &loads {
            let bar = if top > 0.0 {
                (l / top * 40.0).round() as usize
            } else {
                0
            };
            let _ = writeln!(
                s,
                "  {id:<width$} {:<40} {}",
                "#".repeat(bar),
                show_load(*l)
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "members:");
    if loaded {
        let _ = writeln!(
            s,
            "| member | zone | weight | draining | leads | target | load |"
        );
        let _ = writeln!(s, "|---|---|---:|---|---:|---:|---:|");
    } else {
        let _ = writeln!(s, "| member | zone | weight | draining | leads | target |");
        let _ = writeln!(s, "|---|---|---:|---|---:|---:|");
    }
    for n in &view.nodes {
        let load = if loaded {
            format!(
                " {} |",
                show_load(loads.get(n.id.as_str()).copied().unwrap_or(0.0))
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |{load}",
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

    use tenure::shard::{Layout, NodeInfo, ShardInfo, ShardManager, ShardView};
    use tenure::{DynBackend, FencingToken, MemoryBackend, Timing};
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

    /// What `tenure shards status` (no `--watch`) prints for `layout` once.
    async fn status_once(backend: &DynBackend, layout: &Layout) -> String {
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
        out.text()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_shows_every_shard_with_its_leader_token_and_replicas() {
        let backend: DynBackend = Arc::new(MemoryBackend::new());
        let layout = Layout::new("orders", 16, 2).unwrap();
        let nodes = cluster(&backend, &layout, &["a", "b", "c"]).await;
        let text = status_once(&backend, &layout).await;
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

    /// The cells of the row of `text` that starts with `start`.
    fn cells<'a>(text: &'a str, start: &str) -> Vec<&'a str> {
        let row = text
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row {start:?} in:\n{text}"));
        row.trim_matches('|').split('|').map(str::trim).collect()
    }

    #[test]
    fn loads_show_per_shard_and_per_node_only_when_reported() {
        let layout = Layout::new("hot", 4, 2).unwrap();
        let node = |id: &str, zone: &str| NodeInfo {
            id: id.into(),
            weight: 1,
            draining: false,
            zone: Some(zone.into()),
            leads: 2,
            target: 2,
            planned: 2,
            load: 0.0,
        };
        let shard = |i: usize, leader: &str, other: &str, load: Option<f64>| ShardInfo {
            shard: layout.shards()[i].clone(),
            leader: Some(leader.into()),
            preferred: Some(leader.into()),
            replicas: vec![leader.into(), other.into()],
            token: Some(FencingToken(10 + i as u64)),
            load,
        };
        let mut view = ShardView {
            shards: vec![
                shard(0, "a", "b", Some(1000.0)),
                shard(1, "a", "b", Some(2.5)),
                shard(2, "b", "a", Some(466.0)),
                shard(3, "b", "a", None),
            ],
            nodes: vec![node("a", "zone-1"), node("b", "zone-2")],
            ignored: Vec::new(),
        };
        let text = render(&view, &layout);
        assert!(
            text.contains("| shard | leader | token | replicas | load |\n|---|---|---:|---|---:|"),
            "{text}"
        );
        assert_eq!(
            cells(&text, "| 0000 |"),
            ["0000", "a", "10", "a, b", "1,000"]
        );
        assert_eq!(
            cells(&text, "| 0001 |"),
            ["0001", "a", "11", "a, b", "2.50"]
        );
        assert_eq!(cells(&text, "| 0002 |"), ["0002", "b", "12", "b, a", "466"]);
        // A shard nobody reported a figure for.
        assert_eq!(cells(&text, "| 0003 |"), ["0003", "b", "13", "b, a", "–"]);
        // Members: zone, leads and the load of the shards the table shows them lead.
        assert!(
            text.contains("| member | zone | weight | draining | leads | target | load |"),
            "{text}"
        );
        assert_eq!(
            cells(&text, "| a |"),
            ["a", "zone-1", "1", "no", "2", "2", "1,002"]
        );
        assert_eq!(
            cells(&text, "| b |"),
            ["b", "zone-2", "1", "no", "2", "2", "466"]
        );
        // The histogram: max / mean = 1002.5 / ((1002.5 + 466) / 2).
        let want = 1002.5 * 2.0 / (1002.5 + 466.0);
        assert!(
            text.contains(&format!(
                "load per node (max / mean of the active nodes {want:.3}):"
            )),
            "{text}"
        );
        // Its bars: the most loaded node's 40 wide, the other's in proportion.
        let bars: Vec<(String, usize, String)> = text
            .lines()
            .skip_while(|l| !l.starts_with("load per node"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                let hashes = l.matches('#').count();
                (
                    words[0].to_string(),
                    hashes,
                    words[words.len() - 1].to_string(),
                )
            })
            .collect();
        let b = (466.0f64 / 1002.5 * 40.0).round() as usize;
        assert_eq!(
            bars,
            [
                ("a".into(), 40, "1,002".into()),
                ("b".into(), b, "466".into())
            ],
            "{text}"
        );

        // Without figures: the tables of before, no load anywhere.
        for s in &mut view.shards {
            s.load = None;
        }
        let text = render(&view, &layout);
        assert!(!text.to_lowercase().contains("load"), "{text}");
        assert_eq!(cells(&text, "| 0000 |"), ["0000", "a", "10", "a, b"]);
        assert_eq!(cells(&text, "| a |"), ["a", "zone-1", "1", "no", "2", "2"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_shows_the_loads_the_leaders_report() {
        let backend: DynBackend = Arc::new(MemoryBackend::new());
        let layout = Layout::new("loaded", 12, 2).unwrap();
        let figures = tenure::shard::balance::zipf(12, 1.1);
        let mut nodes = Vec::new();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            let (m, events) = ShardManager::builder(backend.clone())
                .layout(layout.clone())
                .node_id(*id)
                .zone(format!("zone-{i}"))
                .timing(timing())
                .balance_by_load(tenure::shard::balance::LoadPolicy::default())
                .load_interval(Duration::from_millis(50))
                .start()
                .await
                .expect("start");
            drop(events);
            nodes.push(m);
        }
        // Every leader reports its shards' figures until every shard row has one and
        // the cluster is quiet (balancing by load may move a few shards meanwhile).
        let mut text = String::new();
        for _ in 0..300 {
            for m in &nodes {
                for (shard, _) in m.held() {
                    m.report_load(&shard, figures[shard.index()])
                        .expect("report");
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if !nodes.iter().all(|m| m.status().borrow().is_quiet(3)) {
                continue;
            }
            text = status_once(&backend, &layout).await;
            if text.contains("; settled")
                && text.contains("| replicas | load |")
                && !text.contains("| – |\n")
            {
                break;
            }
        }
        assert!(
            text.contains("| shard | leader | token | replicas | load |"),
            "{text}"
        );
        let mut per_node: std::collections::BTreeMap<String, f64> = Default::default();
        for shard in layout.shards() {
            let row = cells(&text, &format!("| {} |", shard.name()));
            let load: f64 = row[4].replace(',', "").parse().expect("a load");
            // Published as one byte: within 4% of the figure (and its rounding).
            let figure = figures[shard.index()];
            assert!(
                (load - figure).abs() <= 0.04 * figure + 0.5,
                "{row:?}: figure {figure}"
            );
            *per_node.entry(row[1].to_string()).or_default() += load;
        }
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            let row = cells(&text, &format!("| {id} |"));
            assert_eq!(row[1], format!("zone-{i}"), "{row:?}");
            let load: f64 = row[6].replace(',', "").parse().expect("a load");
            let sum = per_node.get(*id).copied().unwrap_or(0.0);
            // The sum of rounded figures: within their rounding.
            assert!(
                (load - sum).abs() <= 6.0,
                "{row:?}: its shards sum to {sum}"
            );
        }
        assert!(
            text.contains("load per node (max / mean of the active nodes "),
            "{text}"
        );
        for m in &nodes {
            m.close().await.unwrap();
        }
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
