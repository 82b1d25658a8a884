//! Shard-manager scenarios for tests, shared by the in-memory tests and the tests
//! against real stores (behind the `testing` feature): a [`Cluster`] of managers in
//! one process, each with its own connection, checked against the store; the
//! scenario functions panic on failure (they are test code).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tenure_core::{DynBackend, FencingToken, Result, Timing};

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

use tokio::time::Instant;

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
        for (i, l) in events.iter().enumerate() {
            let ShardEvent::HandedOff { shard, .. } = &l.event else {
                continue;
            };
            let next = events[i..]
                .iter()
                .find(|n| matches!(&n.event, ShardEvent::Acquired { shard: s, .. } if s == shard));
            let gap = next.map_or(Duration::MAX, |n| n.at - l.at);
            worst = worst.max(gap);
        }
        worst
    }
}

pub use crate::balance::zipf;

/// A cluster of `env.nodes` nodes balancing `figures` by load with `policy`
/// (weights from `weights`, 1 where missing), settled and, within `env.settle`,
/// balanced by load.
pub async fn started_by_load(
    env: &ShardEnv,
    figures: Vec<f64>,
    policy: crate::balance::LoadPolicy,
    weights: &[u32],
) -> Cluster {
    let layout = Layout::new(&env.namespace(), env.shards, 3).expect("layout");
    let mut c = Cluster::new(env.connect.clone(), layout, env.timing.clone()).await;
    c.figures = Some(Arc::new(Mutex::new(figures)));
    c.policy = policy;
    for i in 0..env.nodes {
        let w = weights.get(i).copied().unwrap_or(1);
        c.add_weighted(&format!("node-{i}"), w).await;
    }
    c.settle(env.settle).await;
    // The reports go out within a load interval (1 s), the balancer waits for them to
    // hold still as long, then moves: on a loaded machine and a real store that can
    // take seconds more, so wait for the result rather than a fixed time (the
    // scenarios then check it).
    c.until_balanced(env.settle).await;
    c
}

/// Zipf (s = 1.1) loads, R = 3: once the reports are in, max/mean node load is at
/// most 1.10, or 1.02 × the lower bound where that is higher; one leader per shard in
/// its replica set; a handed-off shard is taken within `max_gap`. Returns (max/mean
/// by count before, max/mean by load after, bound, moves).
pub async fn check_load_zipf(env: &ShardEnv, max_gap: Duration) -> (f64, f64, f64, usize) {
    let start = Instant::now();
    let figures = zipf(env.shards, 1.1);
    // Count-only baseline: the same loads under the count plan.
    let layout = Layout::new(&format!("{}-count", env.namespace()), env.shards, 3).expect("layout");
    let mut base = Cluster::new(env.connect.clone(), layout, env.timing.clone()).await;
    for i in 0..env.nodes {
        base.add(&format!("node-{i}")).await;
    }
    base.settle(env.settle).await;
    base.figures = Some(Arc::new(Mutex::new(figures.clone())));
    let (by_count, _, _) = base.load_spread().await;
    base.figures = None;
    base.close_all().await;

    let c = started_by_load(env, figures, crate::balance::LoadPolicy::default(), &[]).await;
    c.check().await;
    let (after, bound, per) = c.load_spread().await;
    assert!(
        after <= (1.02 * bound).max(1.10),
        "max/mean {after:.3} (count {by_count:.3}), bound {bound:.3}: {per:?}"
    );
    let gap = c.longest_handoff_gap(start);
    assert!(gap <= max_gap, "a handed-off shard waited {gap:?}");
    let moves = c.handoffs_since(start).len();
    c.close_all().await;
    (by_count, after, bound, moves)
}

/// Ten hot shards (ranked 2 to 11; the hottest, which sets the bound, keeps its
/// figure) turn cold and the ten coldest turn hot: back within the tolerance (or the
/// bound) within 5 s, with at most 3 moves per changed shard. (Over 100 layouts the
/// balancer stays within that in 95: `balance::tests::a_load_shift_is_undone_with_few_moves`;
/// on a store shared by tests the namespace, and so the layout, is random.) Returns
/// (time, moves).
pub async fn check_load_shift(env: &ShardEnv) -> (Duration, usize) {
    let figures = zipf(env.shards, 1.1);
    let c = started_by_load(env, figures.clone(), Default::default(), &[]).await;
    let mut by_heat: Vec<usize> = (0..env.shards).collect();
    by_heat.sort_by(|a, b| figures[*b].total_cmp(&figures[*a]).then(a.cmp(b)));
    let shifted = Instant::now();
    {
        let mut f = c.figures.as_ref().unwrap().lock().unwrap();
        for k in 0..10 {
            f.swap(by_heat[1 + k], by_heat[env.shards - 1 - k]);
        }
    }
    let took = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (now, bound, _) = c.load_spread().await;
        let quiet = c
            .nodes
            .values()
            .all(|m| m.status().borrow().is_quiet(c.nodes.len()));
        // Within the band once the balancer has acted (some move made, all done).
        if quiet && !c.handoffs_since(shifted).is_empty() && now <= (1.02 * bound).max(1.10) {
            break shifted.elapsed();
        }
        assert!(
            shifted.elapsed() < Duration::from_secs(5),
            "not back within the tolerance 5 s after the shift: max/mean {now:.3}, bound {bound:.3}"
        );
    };
    c.settle(env.settle).await;
    let moves = c.handoffs_since(shifted).len();
    assert!(moves <= 3 * 20, "{moves} moves for 20 changed shards");
    c.check().await;
    c.close_all().await;
    (took, moves)
}

/// Every figure jitters ±20% at random every second for `stretch`: at most 1% of the
/// shards move. Returns the moves.
pub async fn check_load_noise(env: &ShardEnv, stretch: Duration) -> usize {
    let figures = zipf(env.shards, 1.1);
    let c = started_by_load(env, figures.clone(), Default::default(), &[]).await;
    let since = Instant::now();
    let mut next = crate::hash::test_rng(0x5eed_0010);
    while since.elapsed() < stretch {
        {
            let mut f = c.figures.as_ref().unwrap().lock().unwrap();
            for (s, base) in figures.iter().enumerate() {
                f[s] = base * (0.8 + 0.4 * next(1_000_001) as f64 / 1_000_000.0);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let moves = c.handoffs_since(since).len();
    assert!(
        moves * 100 <= env.shards,
        "{moves} moves of {} shards under noise",
        env.shards
    );
    c.check().await;
    c.close_all().await;
    moves
}

/// A budget of `max_moves` per second: the balancer asks for no more moves within any
/// second, more than that many are made in all, and the loads still end balanced.
/// Returns the most handoffs that ended within one second (a figure: handoffs asked
/// for in two windows may end in one).
pub async fn check_move_budget(env: &ShardEnv, max_moves: usize) -> usize {
    let policy = crate::balance::LoadPolicy {
        max_moves,
        window: Duration::from_secs(1),
        ..Default::default()
    };
    let window = policy.window;
    let start = Instant::now();
    let c = started_by_load(env, zipf(env.shards, 1.1), policy, &[]).await;
    // Quiet includes the balancer: every move it worked out is made by then.
    c.settle(env.settle).await;
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late = c.handoffs_since(quiet).len();
    assert_eq!(late, 0, "{late} handoffs after every node was quiet");
    // The budget limits the moves the balancer asks for; a handoff ends later, after
    // the store's round trips, so handoffs of two windows can end within one (on
    // etcd, one window's slowest handoff ended after the next window's fastest). The
    // asks are checked; the handoffs are reported.
    let mut asks = 0;
    for node in c.nodes.values() {
        let asked: Vec<Instant> = node
            .moves_asked()
            .into_iter()
            .filter(|t| *t >= start)
            .collect();
        asks += asked.len();
        let most_asked = most_within(&asked, window);
        assert!(
            most_asked <= max_moves,
            "{most_asked} moves asked for within {window:?} by {}, budget {max_moves}",
            node.node_id()
        );
    }
    let times: Vec<Instant> = c.handoffs_since(start).iter().map(|l| l.at).collect();
    assert!(
        asks > max_moves && times.len() > max_moves,
        "only {asks} moves asked for, {} made: the budget was never tested",
        times.len()
    );
    let most = most_within(&times, window);
    let (after, bound, per) = c.load_spread().await;
    assert!(
        after <= (1.02 * bound).max(1.10),
        "max/mean {after:.3}, bound {bound:.3}: {per:?}"
    );
    c.close_all().await;
    most
}

/// The most of `times` (in order) within any span shorter than `window`.
fn most_within(times: &[Instant], window: Duration) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t - times[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Capacities 1:2:4 on three nodes: each node's load is its share by capacity
/// within the tolerance.
pub async fn check_load_capacities(env: &ShardEnv) -> BTreeMap<String, f64> {
    let mut env = env.clone();
    env.nodes = 3;
    let c = started_by_load(&env, zipf(env.shards, 0.8), Default::default(), &[1, 2, 4]).await;
    let (after, bound, per) = c.load_spread().await;
    assert!(
        after <= (1.02 * bound).max(1.10),
        "max/mean per capacity {after:.3}, bound {bound:.3}: {per:?}"
    );
    c.check().await;
    c.close_all().await;
    per
}

/// What a scenario runs on.
#[derive(Clone)]
pub struct ShardEnv {
    /// Opens one connection per node.
    pub connect: Connect,
    /// Session timing of every node.
    pub timing: Timing,
    /// Shards and nodes of the scenarios.
    pub shards: usize,
    /// Nodes at the start.
    pub nodes: usize,
    /// Extra time allowed on time bounds (server latency, expiry granularity).
    pub slack: Duration,
    /// How long the scenarios wait for convergence before failing.
    pub settle: Duration,
    /// The namespace of every scenario; `None`: a random one each (for a shared
    /// store). The in-memory store is new for each test, so it takes a fixed one and
    /// every run sees the same layout.
    pub namespace: Option<String>,
}

impl ShardEnv {
    /// The in-memory store: 256 shards on 5 nodes, the short test timing.
    pub fn memory() -> Self {
        ShardEnv {
            connect: same_backend(Arc::new(tenure_core::MemoryBackend::new())),
            timing: timing(),
            shards: 256,
            nodes: 5,
            slack: Duration::ZERO,
            settle: Duration::from_secs(10),
            namespace: Some("shard-memory".to_string()),
        }
    }

    fn namespace(&self) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| format!("shard-{}", tenure_core::testing::random_prefix()))
    }

    /// A cluster of `self.nodes` nodes, settled and checked.
    pub async fn started(&self) -> Cluster {
        let layout = Layout::new(&self.namespace(), self.shards, 3).expect("layout");
        let mut c = Cluster::new(self.connect.clone(), layout, self.timing.clone()).await;
        for i in 0..self.nodes {
            c.add(&format!("node-{i}")).await;
        }
        c.settle(self.settle).await;
        c
    }
}

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
