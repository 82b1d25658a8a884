//! The [`Cluster`] of managers the scenarios run: one process, a connection per
//! node, every event logged, the leaders checked against the store; and how it
//! connects ([`Connect`]) and times its sessions ([`timing`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tenure_core::{DynBackend, FencingToken, Result, Timing};
use tokio::time::Instant;

use crate::{Layout, ShardEvent, ShardManager};

/// Opens a new connection to the store under test (one per node).
pub type Connect = Arc<dyn Fn() -> BoxFuture<'static, Result<DynBackend>> + Send + Sync>;

/// A [`Connect`] that hands out clones of one backend (the in-memory store).
pub fn same_backend(backend: DynBackend) -> Connect {
    Arc::new(move || {
        let b = backend.clone();
        Box::pin(async move { Ok(b) })
    })
}

/// What happened, when (the instant the event reports), on which node.
#[derive(Clone, Debug)]
pub struct Logged {
    pub at: Instant,
    pub node: String,
    pub event: ShardEvent,
}

pub struct Cluster {
    pub connect: Connect,
    /// A connection for reading leaders from the store.
    pub backend: DynBackend,
    pub layout: Layout,
    pub timing: Timing,
    pub nodes: BTreeMap<String, ShardManager>,
    pub log: Arc<Mutex<Vec<Logged>>>,
    /// Whether the last [`check`](Self::check) found the replica sets allow perfect
    /// balance (it then checked it).
    pub feasible: Arc<std::sync::atomic::AtomicBool>,
    /// With figures here (one per shard), nodes added from then on balance by load
    /// with `policy`, and each node reports the figures of the shards it leads as an
    /// application would: each once at its `Acquired` event, then all of them together
    /// every `report_every` ([`LoadReporter::report_many`](crate::LoadReporter::report_many))
    /// until the leadership ends.
    pub figures: Option<Arc<Mutex<Vec<f64>>>>,
    pub policy: crate::balance::LoadPolicy,
    pub report_every: Duration,
}

pub fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(1));
    t.renew_interval = Duration::from_millis(100);
    t.renew_deadline = Duration::from_millis(600);
    t.connect_timeout = Duration::from_secs(1);
    t
}

impl Cluster {
    pub async fn new(connect: Connect, layout: Layout, timing: Timing) -> Self {
        let backend = connect().await.expect("connect");
        Cluster {
            connect,
            backend,
            layout,
            timing,
            nodes: BTreeMap::new(),
            log: Arc::new(Mutex::new(Vec::new())),
            feasible: Arc::default(),
            figures: None,
            policy: crate::balance::LoadPolicy::default(),
            report_every: Duration::from_millis(500),
        }
    }

    pub async fn add(&mut self, id: &str) {
        self.add_weighted(id, 1).await;
    }

    pub async fn add_weighted(&mut self, id: &str, weight: u32) {
        self.add_with(id, |b| b.weight(weight)).await;
    }

    /// Add a node in failure domain `zone`.
    pub async fn add_in_zone(&mut self, id: &str, zone: &str) {
        self.add_with(id, |b| b.zone(zone)).await;
    }

    /// Add a node, `configure` setting what differs from the cluster's defaults.
    pub async fn add_with(
        &mut self,
        id: &str,
        configure: impl FnOnce(crate::ShardManagerBuilder) -> crate::ShardManagerBuilder,
    ) {
        let backend = (self.connect)().await.expect("connect");
        let mut builder = ShardManager::builder(backend)
            .layout(self.layout.clone())
            .node_id(id)
            .timing(self.timing.clone())
            .handoff_rate(10_000.0, 1_000);
        if self.figures.is_some() {
            builder = builder.balance_by_load(self.policy.clone());
        }
        let (m, mut events) = configure(builder)
            .start()
            .await
            .expect("start shard manager");
        let log = self.log.clone();
        let node = id.to_string();
        let reporter = m.load_reporter();
        let figures = self.figures.clone();
        let every = self.report_every;
        // The shards this node leads, each with its lost signal: reported at once when
        // acquired, then all together every `report_every` by one task per node (a
        // task and a timer per shard was most of the work at 10^6 shards).
        let led: Arc<Mutex<BTreeMap<usize, (crate::Shard, tenure_core::CancellationToken)>>> =
            Arc::default();
        let done = tenure_core::CancellationToken::new();
        if let Some(figures) = &figures {
            let (figures, reporter, led, done) =
                (figures.clone(), reporter.clone(), led.clone(), done.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = done.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let batch: Vec<(crate::Shard, f64)> = {
                        let figures = figures.lock().unwrap();
                        let mut led = led.lock().unwrap();
                        led.retain(|_, (_, lost)| !lost.is_cancelled());
                        led.iter()
                            .map(|(s, (shard, _))| (shard.clone(), figures[*s]))
                            .collect()
                    };
                    if reporter
                        .report_many(batch.iter().map(|(shard, f)| (shard, *f)))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                // These nodes run no work of their own: a planned transition need not
                // wait for the logged event's work guard.
                if let ShardEvent::Acquired { work, .. } = &event {
                    work.done();
                }
                if let (Some(figures), ShardEvent::Acquired { shard, lost, .. }) =
                    (&figures, &event)
                {
                    let figure = figures.lock().unwrap()[shard.index()];
                    let _ = reporter.report(shard, figure);
                    led.lock()
                        .unwrap()
                        .insert(shard.index(), (shard.clone(), lost.clone()));
                }
                // Each event is logged at the instant it reports (the grant, the loss,
                // the release: for a handoff whose work was done at once, the ask),
                // not when it was read.
                let at = match &event {
                    ShardEvent::Acquired { at, .. }
                    | ShardEvent::Lost { at, .. }
                    | ShardEvent::HandedOff { at, .. } => *at,
                };
                log.lock().unwrap().push(Logged {
                    at,
                    node: node.clone(),
                    event,
                });
            }
            done.cancel();
        });
        self.nodes.insert(id.to_string(), m);
    }

    /// Crash a node: no resigns, the store frees its seats after the TTL.
    pub fn crash(&mut self, id: &str) {
        let m = self.nodes.remove(id).expect("node");
        m.abandon();
    }

    /// Close every node.
    pub async fn close_all(mut self) {
        let ids: Vec<String> = self.nodes.keys().cloned().collect();
        for id in ids {
            self.close(&id).await;
        }
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

    /// Wait until every node sees all live nodes, nothing pending, and every shard led
    /// by its preferred node, for 100 ms on end; returns how long it took until that
    /// began. Panics after `bound`.
    pub async fn settle(&self, bound: Duration) -> Duration {
        let nodes: Vec<&ShardManager> = self.nodes.values().collect();
        match crate::bench::settle(&nodes, Instant::now(), Duration::from_millis(100), bound).await
        {
            Some(took) => took,
            None => panic!(
                "not settled within {bound:?}: {:?}",
                self.nodes
                    .iter()
                    .map(|(k, m)| (k.clone(), m.status().borrow().clone()))
                    .collect::<Vec<_>>()
            ),
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
        // Every node's plan is the plan computed afresh from the store's member list:
        // a node left with a plan of an older list would wait on the others for ever.
        let fresh = match any.snapshot().await {
            Ok(v) => v,
            Err(e) => panic!("snapshot: {e}"),
        };
        for (id, m) in &self.nodes {
            let mine = m.view();
            for (s, (a, b)) in mine.shards.iter().zip(&fresh.shards).enumerate() {
                assert_eq!(
                    a.preferred, b.preferred,
                    "{id}'s plan gives shard {s} to {:?}, a fresh plan to {:?}",
                    a.preferred, b.preferred
                );
            }
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
        // By load, leaders follow loads rather than counts.
        let feasible = self.figures.is_none() && view.nodes.iter().all(|n| n.planned == n.target);
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

/// Load per node by the store's leaders and the true figures, and the lower bound
/// of max/mean: (max/mean load per weight over the nodes, bound, per node).
impl Cluster {
    pub async fn load_spread(&self) -> (f64, f64, BTreeMap<String, f64>) {
        self.try_load_spread()
            .await
            .unwrap_or_else(|s| panic!("shard {s} has no leader"))
    }

    /// [`load_spread`](Self::load_spread), or the first shard without a leader.
    pub async fn try_load_spread(
        &self,
    ) -> std::result::Result<(f64, f64, BTreeMap<String, f64>), usize> {
        let figures = self
            .figures
            .as_ref()
            .expect("figures")
            .lock()
            .unwrap()
            .clone();
        let leaders = self.leaders().await;
        let mut per: BTreeMap<String, f64> = self.nodes.keys().map(|k| (k.clone(), 0.0)).collect();
        for (s, l) in leaders.iter().enumerate() {
            let Some((id, _)) = l.as_ref() else {
                return Err(s);
            };
            *per.get_mut(id).expect("a live leader") += figures[s];
        }
        let view = self.nodes.values().next().expect("a node").view();
        let weight = |id: &str| {
            view.nodes
                .iter()
                .find(|n| n.id == id)
                .map_or(1.0, |n| f64::from(n.weight))
        };
        let total: f64 = per.values().sum();
        let total_w: f64 = per.keys().map(|k| weight(k)).sum();
        let worst = per
            .iter()
            .map(|(k, l)| l / weight(k))
            .fold(0.0f64, f64::max);
        let largest = figures.iter().copied().fold(0.0f64, f64::max);
        let min_w = per.keys().map(|k| weight(k)).fold(f64::INFINITY, f64::min);
        let mean = total / total_w;
        Ok(((worst / mean), (largest / min_w / mean).max(1.0), per))
    }

    /// Wait until every node is quiet and max/mean node load is within 1.10 (or
    /// 1.02 × the lower bound), at most `bound`; whether it got there.
    pub async fn until_balanced(&self, bound: Duration) -> bool {
        let since = Instant::now();
        loop {
            let quiet = self
                .nodes
                .values()
                .all(|m| m.status().borrow().is_quiet(self.nodes.len()));
            if quiet {
                // A shard may be between leaders at this moment: look again.
                if let Ok((ratio, lower, _)) = self.try_load_spread().await {
                    if ratio <= (1.02 * lower).max(1.10) {
                        return true;
                    }
                }
            }
            if since.elapsed() > bound {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Handoffs logged since `t`, in order of time.
    pub fn handoffs_since(&self, t: Instant) -> Vec<Logged> {
        self.events_since(t)
            .into_iter()
            .filter(|l| matches!(l.event, ShardEvent::HandedOff { .. }))
            .collect()
    }

    /// The longest time a handed-off shard waited for its next `Acquired` since `t`.
    pub fn longest_handoff_gap(&self, t: Instant) -> Duration {
        let events = self.events_since(t);
        let mut worst = Duration::ZERO;
        // Each node's events are logged by a task of its own, so across nodes the
        // log's order is not the events' order: the successor's grant can be logged
        // before the handoff. Pair them by the instants the events carry instead.
        for l in &events {
            let ShardEvent::HandedOff { shard, .. } = &l.event else {
                continue;
            };
            let next = events
                .iter()
                .filter(|n| n.at >= l.at)
                .filter(|n| matches!(&n.event, ShardEvent::Acquired { shard: s, .. } if s == shard))
                .map(|n| n.at)
                .min();
            let gap = next.map_or(Duration::MAX, |at| at - l.at);
            worst = worst.max(gap);
        }
        worst
    }
}
