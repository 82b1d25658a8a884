//! A cluster of shard managers in one process, for the tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::{DynBackend, FencingToken, Timing};
use tenure_shard::{Layout, ShardEvent, ShardManager};

use tokio::time::Instant;

/// What happened, when, on which node.
#[derive(Clone, Debug)]
pub struct Logged {
    pub at: Instant,
    pub node: String,
    pub event: ShardEvent,
}

pub struct Cluster {
    pub backend: DynBackend,
    pub layout: Layout,
    pub timing: Timing,
    pub nodes: BTreeMap<String, ShardManager>,
    pub log: Arc<Mutex<Vec<Logged>>>,
    /// Whether the last [`check`](Self::check) found the replica sets allow perfect
    /// balance (it then checked it).
    pub feasible: Arc<std::sync::atomic::AtomicBool>,
}

pub fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(1));
    t.renew_interval = Duration::from_millis(100);
    t.renew_deadline = Duration::from_millis(600);
    t.connect_timeout = Duration::from_secs(1);
    t
}

impl Cluster {
    pub fn new(backend: DynBackend, layout: Layout, timing: Timing) -> Self {
        Cluster {
            backend,
            layout,
            timing,
            nodes: BTreeMap::new(),
            log: Arc::new(Mutex::new(Vec::new())),
            feasible: Arc::default(),
        }
    }

    pub async fn add(&mut self, id: &str) {
        self.add_weighted(id, 1).await;
    }

    pub async fn add_weighted(&mut self, id: &str, weight: u32) {
        let (m, mut events) = ShardManager::builder(self.backend.clone())
            .layout(self.layout.clone())
            .node_id(id)
            .weight(weight)
            .timing(self.timing.clone())
            .handoff_rate(10_000.0, 1_000)
            .start()
            .await
            .expect("start shard manager");
        let log = self.log.clone();
        let node = id.to_string();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                log.lock().unwrap().push(Logged {
                    at: Instant::now(),
                    node: node.clone(),
                    event,
                });
            }
        });
        self.nodes.insert(id.to_string(), m);
    }

    /// Crash a node: no resigns, the store frees its seats after the TTL.
    pub fn crash(&mut self, id: &str) {
        let m = self.nodes.remove(id).expect("node");
        m.abandon();
    }

    pub async fn close(&mut self, id: &str) {
        let m = self.nodes.remove(id).expect("node");
        m.close().await.expect("close");
    }

    pub fn events_since(&self, t: Instant) -> Vec<Logged> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.at >= t)
            .cloned()
            .collect()
    }

    /// Leader id and token of every shard, read from the store.
    pub async fn leaders(&self) -> Vec<Option<(String, FencingToken)>> {
        let mut v = Vec::new();
        for s in self.layout.shards() {
            let info = self
                .backend
                .leader(self.layout.election(s))
                .await
                .expect("leader");
            v.push(info.map(|i| (i.id, i.token)));
        }
        v
    }

    /// True when every node's view has all live nodes, nothing pending, and every
    /// shard led by its preferred node.
    fn quiet(&self) -> bool {
        let n = self.nodes.len();
        self.nodes.values().all(|m| {
            let s = m.status().borrow().clone();
            s.members == n && s.settled && s.campaigning == 0 && s.pending_handoffs == 0
        })
    }

    /// Wait until the cluster is quiet and stays so for 100 ms (statuses may be from
    /// before the last change reached every node); returns how long it took until
    /// the quiet began. Panics after `bound`.
    pub async fn settle(&self, bound: Duration) -> Duration {
        let t0 = Instant::now();
        let mut quiet_since: Option<Instant> = None;
        loop {
            if self.quiet() {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(100) {
                    return since - t0;
                }
            } else {
                quiet_since = None;
            }
            assert!(
                t0.elapsed() <= bound,
                "not settled within {bound:?}: {:?}",
                self.nodes
                    .iter()
                    .map(|(k, m)| (k.clone(), m.status().borrow().clone()))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Check the invariants against the store: every shard has exactly one leader, a
    /// live node in the shard's replica set, every node leads what the plan gives it,
    /// and, where the replica sets allow perfect balance, every active node leads
    /// ⌊P/N⌋ or ⌈P/N⌉ shards (equal weights). Returns leaders per node.
    pub async fn check(&self) -> BTreeMap<String, usize> {
        let per_node = self.check_plan().await;
        per_node
    }

    /// [`check`](Self::check), and require that perfect balance was possible.
    pub async fn check_balanced(&self) -> BTreeMap<String, usize> {
        let per_node = self.check_plan().await;
        assert!(
            self.feasible.load(std::sync::atomic::Ordering::SeqCst),
            "the replica sets did not allow perfect balance"
        );
        per_node
    }

    async fn check_plan(&self) -> BTreeMap<String, usize> {
        let leaders = self.leaders().await;
        let any = self.nodes.values().next().expect("a node");
        let view = any.view();
        let mut per_node: BTreeMap<String, usize> =
            self.nodes.keys().map(|k| (k.clone(), 0)).collect();
        for (s, l) in leaders.iter().enumerate() {
            let (id, _) = l.as_ref().unwrap_or_else(|| {
                let events: Vec<_> = self
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|l| match &l.event {
                        ShardEvent::Acquired { shard, .. }
                        | ShardEvent::Lost { shard, .. }
                        | ShardEvent::HandedOff { shard, .. } => shard.index() == s,
                    })
                    .cloned()
                    .collect();
                panic!(
                    "shard {s} has no leader; view says {:?}; its events: {events:#?}",
                    view.shards[s]
                )
            });
            assert!(
                self.nodes.contains_key(id),
                "shard {s} led by {id}, not a live node"
            );
            assert!(
                view.shards[s].replicas.contains(id),
                "shard {s} led by {id}, outside its replica set {:?}",
                view.shards[s].replicas
            );
            *per_node.get_mut(id).unwrap() += 1;
        }
        // Converged to the plan every node computes.
        for n in &view.nodes {
            assert_eq!(
                per_node.get(&n.id).copied(),
                Some(n.planned),
                "{} leads {:?}, its plan says {}: {per_node:?}",
                n.id,
                per_node.get(&n.id),
                n.planned
            );
        }
        let feasible = view.nodes.iter().all(|n| n.planned == n.target);
        if feasible {
            let active: Vec<_> = view.nodes.iter().filter(|n| !n.draining).collect();
            let p = leaders.len();
            let (lo, hi) = (p / active.len(), p.div_ceil(active.len()));
            for n in &active {
                let c = per_node[&n.id];
                assert!(
                    lo <= c && c <= hi,
                    "{} leads {c}, not in [{lo}, {hi}]: {per_node:?}",
                    n.id
                );
            }
        }
        self.feasible
            .store(feasible, std::sync::atomic::Ordering::SeqCst);
        per_node
    }
}
