//! Scenarios of membership changes, balanced by count: cold start, a join, crashes,
//! the loss of a zone, a quiet cluster and a drain.

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_core::FencingToken;
use tokio::time::Instant;

use super::cluster::Cluster;
use super::env::ShardEnv;
use crate::{Layout, ShardEvent, ShardManager};

/// Cold start: every shard led once, by a node of its replica set, ⌊P/N⌋ or ⌈P/N⌉
/// each; every node's own counters agree with the store.
pub async fn check_cold_start(env: &ShardEnv) {
    let c = env.started().await;
    let per_node = c.check_balanced().await;
    assert_eq!(per_node.values().sum::<usize>(), env.shards);
    for (id, m) in &c.nodes {
        assert_eq!(m.held().len(), per_node[id]);
        assert_eq!(m.status().borrow().target, per_node[id]);
    }
    c.close_all().await;
}

/// A join moves at most 1.1 × the optimum, the newcomer's share (⌊P/(N+1)⌋ or
/// ⌈P/(N+1)⌉: each of its shards must move once and nothing else needs to).
pub async fn check_join(env: &ShardEnv) {
    let mut c = env.started().await;
    let before = c.leaders().await;
    c.add("node-new").await;
    c.settle(env.settle).await;
    let per_node = c.check_balanced().await;
    let after = c.leaders().await;
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.as_ref().map(|x| &x.0) != a.as_ref().map(|x| &x.0))
        .count();
    let n = env.nodes + 1;
    let optimum = per_node["node-new"];
    assert!(optimum == env.shards / n || optimum == env.shards.div_ceil(n));
    // The newcomer's share is the optimum when every old node holds enough shards whose
    // replica set now includes the newcomer; when one does not, a shard moves on a
    // chain (old → old → new) and even the plan computed straight from the holdings
    // before the join needs more (seen in about 1 of 500 random 64-shard layouts). The
    // cluster must not move more than the larger of the two, give or take 10 %.
    let planned = planned_moves(&c, &before);
    let bound = optimum.max(planned);
    assert!(
        moved as f64 <= 1.1 * bound as f64,
        "{moved} moves for an optimum of {optimum} (the plan from the holdings before \
         the join: {planned})"
    );
    eprintln!("join: {moved} moves, optimum {optimum}, planned from before {planned}");
    c.close_all().await;
}

/// The moves of the plan computed from `before`'s holders over the cluster's nodes now
/// (weight 1, none draining, sorted by id as the shard manager sorts them).
fn planned_moves(c: &Cluster, before: &[Option<(String, FencingToken)>]) -> usize {
    let ids: Vec<&String> = c.nodes.keys().collect();
    let specs: Vec<crate::assign::NodeSpec> = ids
        .iter()
        .map(|id| crate::assign::NodeSpec::new(id.as_str()))
        .collect();
    let holders: Vec<Option<u32>> = before
        .iter()
        .map(|b| {
            let (id, _) = b.as_ref()?;
            ids.iter().position(|x| *x == id).map(|i| i as u32)
        })
        .collect();
    crate::assign::plan(&c.layout.hashes, &specs, c.layout.replication, &holders)
        .moves_from(&holders)
}

/// A crash moves only the dead node's shards (the others keep leader and token), and
/// each of them is led again within TTL + one renew interval + the member grace (+
/// slack).
pub async fn check_crash(env: &ShardEnv) {
    let mut c = env.started().await;
    let victim = c.nodes.keys().nth(env.nodes / 2).cloned().expect("a node");
    let dead = crash_and_check(&mut c, &[victim], env).await;
    eprintln!("crash: {dead} shards led again");
    c.close_all().await;
}

/// Crash `victims` at once; then every shard they led is led again within TTL + one
/// renew interval + the member grace (+ slack) with a greater token, no other shard
/// changes leader or token, nothing else is acquired, and the survivors end balanced.
/// Returns how many shards were led again.
async fn crash_and_check(c: &mut Cluster, victims: &[String], env: &ShardEnv) -> usize {
    let before = c.leaders().await;
    let t0 = Instant::now();
    for id in victims {
        c.crash(id);
    }
    c.settle(env.settle).await;
    c.check_balanced().await;
    let after = c.leaders().await;
    // The survivors keep a vanished member's shards for the grace: a crashed node's
    // member goes with its session at the TTL, and its shards after the grace.
    let grace = c
        .nodes
        .values()
        .map(ShardManager::member_grace)
        .max()
        .unwrap_or_default();
    let bound = c.timing.ttl + c.timing.renew_interval + grace + env.slack;
    let acquired: std::collections::HashMap<usize, Instant> = c
        .events_since(t0)
        .into_iter()
        .filter_map(|l| match l.event {
            ShardEvent::Acquired { shard, .. } => Some((shard.index(), l.at)),
            _ => None,
        })
        .collect();
    let mut dead = 0;
    let mut failovers = Vec::new();
    for (s, (b, a)) in before.iter().zip(&after).enumerate() {
        let (b, a) = (b.as_ref().expect("led"), a.as_ref().expect("led"));
        if victims.contains(&b.0) {
            dead += 1;
            let took = acquired[&s] - t0;
            failovers.push(took);
            assert!(
                took <= bound,
                "shard {s} led again after {took:?} > {bound:?}"
            );
            assert!(a.1 > b.1, "shard {s}: token {} after {}", a.1, b.1);
        } else {
            assert_eq!(a, b, "shard {s} of a live node moved or was re-granted");
        }
    }
    failovers.sort();
    eprintln!(
        "crash of {victims:?}: {dead} shards led again, from the crash min {:?} median {:?} \
         max {:?} (TTL {:?}, renew interval {:?}, member grace {grace:?})",
        failovers.first().copied().unwrap_or_default(),
        failovers
            .get(failovers.len() / 2)
            .copied()
            .unwrap_or_default(),
        failovers.last().copied().unwrap_or_default(),
        c.timing.ttl,
        c.timing.renew_interval,
    );
    assert!(dead > 0, "{victims:?} led nothing");
    assert_eq!(
        acquired.len(),
        dead,
        "acquisitions other than the dead nodes' shards"
    );
    dead
}

/// Nodes in three zones (`env.nodes` of them, at least 3, dealt round-robin): every
/// shard's replicas span the three zones, and with a multiple of three nodes each zone
/// leads within one shard of P / 3; when a whole zone crashes at once, every
/// shard it led is led again within TTL + one renew interval + the member grace (+ slack), no shard of
/// the other zones moves, and the survivors end balanced.
pub async fn check_zone_loss(env: &ShardEnv) {
    let layout = Layout::new(&env.namespace(), env.shards, 3).expect("layout");
    let mut c = Cluster::new(env.connect.clone(), layout, env.timing.clone()).await;
    let zone_of = |i: usize| format!("zone-{}", i % 3);
    for i in 0..env.nodes.max(3) {
        c.add_in_zone(&format!("node-{i:02}"), &zone_of(i)).await;
    }
    c.settle(env.settle).await;
    c.check_balanced().await;
    let view = c.nodes.values().next().expect("a node").view();
    let zone: BTreeMap<String, Option<String>> = view
        .nodes
        .iter()
        .map(|n| (n.id.clone(), n.zone.clone()))
        .collect();
    for s in &view.shards {
        let mut spanned: Vec<_> = s.replicas.iter().map(|r| zone[r].clone()).collect();
        spanned.sort();
        spanned.dedup();
        assert_eq!(spanned.len(), 3, "{}: replicas {:?}", s.shard, s.replicas);
    }
    // Leaders per zone within one of P / 3.
    let mut per_zone: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for n in &view.nodes {
        *per_zone.entry(n.zone.clone()).or_default() += n.leads;
    }
    let nodes = env.nodes.max(3);
    if nodes.is_multiple_of(3) {
        let (lo, hi) = (env.shards / 3, env.shards.div_ceil(3));
        for (z, l) in &per_zone {
            assert!(
                lo <= *l && *l <= hi,
                "zone {z:?} leads {l}, not within one of P/3: {per_zone:?}"
            );
        }
    }
    let lost: Vec<String> = zone
        .iter()
        .filter(|(_, z)| z.as_deref() == Some("zone-1"))
        .map(|(id, _)| id.clone())
        .collect();
    crash_and_check(&mut c, &lost, env).await;
    c.close_all().await;
}

/// A balanced cluster without membership changes makes no moves over `stretch`.
pub async fn check_quiet(env: &ShardEnv, stretch: Duration) {
    let c = env.started().await;
    let before = c.leaders().await;
    let t0 = Instant::now();
    tokio::time::sleep(stretch).await;
    assert!(c.events_since(t0).is_empty(), "{:?}", c.events_since(t0));
    assert_eq!(c.leaders().await, before);
    c.close_all().await;
}

/// Drain hands every shard of a node to the next in line: no losses, every handoff's
/// seat free for at most `max_gap`, the node leads nothing after, the rest balanced.
/// Other nodes may hand a shard on too, when the replica sets make perfect balance
/// need a chain of moves; those handoffs obey the same gap.
pub async fn check_drain(env: &ShardEnv, max_gap: Duration) {
    let mut c = env.started().await;
    let t0 = Instant::now();
    let node = c.nodes.keys().nth(1).cloned().expect("a node");
    let theirs = c.nodes[&node].held().len();
    c.nodes[&node].drain().await.expect("drain");
    assert_eq!(c.nodes[&node].held().len(), 0);
    c.settle(env.settle).await;
    let per_node = c.check_balanced().await;
    assert_eq!(per_node[&node], 0);
    let log = c.events_since(t0);
    // Each node's events are logged by a task of its own when it receives them, so
    // across nodes the log's order is not the order of events: under load the new
    // holder's acquisition can be logged before the old holder's handoff. So pair them
    // by shard, not by order: every handoff first, then every acquisition takes the
    // earliest open handoff of its shard (a gap shorter than the logging skew counts
    // as zero).
    let mut handed: std::collections::HashMap<usize, Vec<Instant>> =
        std::collections::HashMap::new();
    let (mut from_node, mut chained) = (0, 0);
    for l in &log {
        match &l.event {
            ShardEvent::HandedOff { shard, to, .. } => {
                assert!(to.is_some(), "handed off to nobody: {l:?}");
                if l.node == node {
                    from_node += 1;
                } else {
                    chained += 1;
                }
                handed.entry(shard.index()).or_default().push(l.at);
            }
            ShardEvent::Acquired { .. } => {}
            ShardEvent::Lost { .. } => panic!("a loss during drain: {l:?}"),
        }
    }
    let mut gaps = Vec::new();
    for l in &log {
        if let ShardEvent::Acquired { shard, .. } = &l.event {
            let open = handed.get_mut(&shard.index()).filter(|h| !h.is_empty());
            let Some(open) = open else {
                panic!(
                    "acquired a shard nobody handed off: {l:?}; the log since the drain: {log:?}"
                );
            };
            let h = open.remove(0);
            gaps.push(l.at.saturating_duration_since(h));
        }
    }
    handed.retain(|_, h| !h.is_empty());
    assert!(handed.is_empty(), "handed off, never acquired: {handed:?}");
    assert_eq!(from_node, theirs);
    assert_eq!(gaps.len(), theirs + chained);
    gaps.sort();
    let worst = gaps.last().copied().unwrap_or_default();
    eprintln!(
        "drain: {theirs} handoffs (+{chained} by other nodes), gap median {:?}, max {worst:?}",
        gaps.get(gaps.len() / 2).copied().unwrap_or_default()
    );
    assert!(worst <= max_gap, "handoff gap {worst:?} > {max_gap:?}");
    c.close(&node).await;
    c.settle(env.settle).await;
    c.check_balanced().await;
    c.close_all().await;
}
