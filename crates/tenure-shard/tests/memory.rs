//! The shard manager on the in-memory backend with paused (virtual) time.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use support::{timing, Cluster};
use tenure_core::{MemoryBackend, Timing};
use tenure_shard::{Layout, ShardEvent};
use tokio::time::Instant;

const P: usize = 256;

fn cluster(p: usize) -> Cluster {
    Cluster::new(
        Arc::new(MemoryBackend::new()),
        Layout::new("svc", p, 3).unwrap(),
        timing(),
    )
}

async fn started(p: usize, n: usize) -> Cluster {
    let mut c = cluster(p);
    for i in 0..n {
        c.add(&format!("node-{i}")).await;
    }
    c.settle(Duration::from_secs(10)).await;
    c
}

#[tokio::test(start_paused = true)]
async fn cold_start_converges_balanced() {
    let c = started(P, 5).await;
    let per_node = c.check_balanced().await;
    assert_eq!(per_node.values().sum::<usize>(), P);
    // Each node's own counters agree with the store.
    for (id, m) in &c.nodes {
        assert_eq!(m.held().len(), per_node[id]);
        assert_eq!(m.status().borrow().target, per_node[id]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_join_moves_about_the_optimum() {
    let mut c = started(P, 4).await;
    let before = c.leaders().await;
    c.add("node-new").await;
    c.settle(Duration::from_secs(10)).await;
    let per_node = c.check_balanced().await;
    let after = c.leaders().await;
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.as_ref().map(|x| &x.0) != a.as_ref().map(|x| &x.0))
        .count();
    // The optimum: the newcomer must end with its share (⌊256/5⌋ or ⌈256/5⌉) and each
    // of those shards has to move once; nothing else needs to.
    let optimum = per_node["node-new"];
    assert!(optimum == P / 5 || optimum == P.div_ceil(5));
    assert!(
        moved as f64 <= 1.1 * optimum as f64,
        "{moved} moves for an optimum of {optimum}"
    );
    eprintln!("join: {moved} moves, optimum {optimum}");
}

#[tokio::test(start_paused = true)]
async fn a_crash_moves_only_the_dead_nodes_shards_within_ttl() {
    let mut c = started(P, 5).await;
    let before = c.leaders().await;
    let t0 = Instant::now();
    c.crash("node-2");
    c.settle(Duration::from_secs(10)).await;
    c.check_balanced().await;
    let after = c.leaders().await;
    let bound = c.timing.ttl + c.timing.renew_interval;
    let acquired: HashMap<usize, Instant> = c
        .events_since(t0)
        .into_iter()
        .filter_map(|l| match l.event {
            ShardEvent::Acquired { shard, .. } => Some((shard.index(), l.at)),
            _ => None,
        })
        .collect();
    let mut dead = 0;
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().unwrap(), a.as_ref().unwrap());
        if b.0 == "node-2" {
            dead += 1;
            let at = acquired[&s];
            assert!(at - t0 <= bound, "shard {s} led again after {:?}", at - t0);
            assert!(a.1 > b.1);
        } else {
            assert_eq!(a, b, "shard {s} of a live node moved or was re-granted");
        }
    }
    assert!(dead > 0);
    assert_eq!(
        acquired.len(),
        dead,
        "acquisitions other than the dead node's shards"
    );
}

#[tokio::test(start_paused = true)]
async fn a_balanced_cluster_makes_no_moves() {
    let c = started(P, 5).await;
    let before = c.leaders().await;
    let t0 = Instant::now();
    tokio::time::sleep(c.timing.ttl * 30).await;
    assert!(c.events_since(t0).is_empty(), "{:?}", c.events_since(t0));
    assert_eq!(c.leaders().await, before);
}

#[tokio::test(start_paused = true)]
async fn drain_hands_everything_over_with_short_gaps() {
    let mut c = started(P, 5).await;
    let t0 = Instant::now();
    let theirs = c.nodes["node-1"].held().len();
    c.nodes["node-1"].drain().await.expect("drain");
    assert_eq!(c.nodes["node-1"].held().len(), 0);
    c.settle(Duration::from_secs(10)).await;
    let per_node = c.check_balanced().await;
    assert_eq!(per_node["node-1"], 0);
    // Every handoff: the successor was already campaigning, so the seat was free only
    // between the resign and the grant.
    let log = c.events_since(t0);
    let mut handed = HashMap::new();
    let mut gaps = Vec::new();
    for l in &log {
        match &l.event {
            ShardEvent::HandedOff { shard, to, .. } => {
                assert_eq!(l.node, "node-1");
                assert!(to.is_some());
                handed.insert(shard.index(), l.at);
            }
            ShardEvent::Acquired { shard, .. } => {
                let h = handed
                    .get(&shard.index())
                    .expect("acquired a shard nobody handed off");
                gaps.push(l.at - *h);
            }
            ShardEvent::Lost { .. } => panic!("a loss during drain: {l:?}"),
        }
    }
    assert_eq!(handed.len(), theirs);
    assert_eq!(gaps.len(), theirs);
    let worst = gaps.iter().max().copied().unwrap_or_default();
    assert!(worst <= Duration::from_millis(50), "handoff gap {worst:?}");
    c.close("node-1").await;
    c.settle(Duration::from_secs(10)).await;
    c.check_balanced().await;
}

#[tokio::test(start_paused = true)]
async fn weights_and_bad_configuration() {
    let mut c = cluster(300);
    c.add_weighted("heavy", 2).await;
    c.add("light-1").await;
    c.add("light-2").await;
    c.settle(Duration::from_secs(10)).await;
    let held: Vec<usize> = c.nodes.values().map(|m| m.held().len()).collect();
    assert_eq!(held, vec![150, 75, 75]);

    // A node configured with another shard count is ignored by the others, not obeyed.
    let other = tenure_shard::ShardManager::builder(c.backend.clone())
        .layout(Layout::new("svc", 10, 3).unwrap())
        .node_id("misconfigured")
        .timing(Timing::from_ttl(Duration::from_secs(1)))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let view = c.nodes["heavy"].view();
    assert_eq!(view.nodes.len(), 3);
    assert_eq!(view.ignored.len(), 1);
    assert!(
        view.ignored[0].1.contains("10 shards"),
        "{:?}",
        view.ignored
    );
    assert_eq!(c.nodes.values().map(|m| m.held().len()).sum::<usize>(), 300);
    drop(other);
}

#[tokio::test(start_paused = true)]
async fn snapshot_and_shard_map_agree_with_the_store() {
    let c = started(64, 4).await;
    let snap = c.nodes["node-0"].snapshot().await.expect("snapshot");
    let leaders = c.leaders().await;
    for (s, info) in snap.shards.iter().enumerate() {
        let (id, token) = leaders[s].clone().unwrap();
        assert_eq!(info.leader.as_deref(), Some(id.as_str()));
        assert_eq!(info.token, Some(token));
        assert_eq!(info.replicas.len(), 3);
    }
    assert!(snap.imbalance() <= 16.0 / 16.0 + 1e-9);
    let map = tenure_shard::ShardMap::watch(c.backend.clone(), c.layout.clone(), timing())
        .await
        .expect("map");
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (s, l) in leaders.iter().enumerate() {
        assert_eq!(map.leader(s), l.as_ref().map(|x| x.0.clone()));
    }
    assert!(map.view().settled());
}
