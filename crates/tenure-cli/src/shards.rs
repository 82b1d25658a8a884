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
    let _ = writeln!(s, "| member | weight | draining | leads | target |");
    let _ = writeln!(s, "|---|---:|---|---:|---:|");
    for n in &view.nodes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            n.id,
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
