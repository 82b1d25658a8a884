//! The load gauges of the shard manager, read back through a recorder that keeps each
//! gauge's last value: each node's `tenure_shard_load` is its load in its own view,
//! also after its shards were handed away, and the balancer's imbalance gauge is its
//! view's.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use tenure_shard::balance::{zipf, LoadPolicy};
use tenure_shard::metrics::{LOAD, LOAD_IMBALANCE};
use tenure_shard::testing::{started_by_load, Cluster, ShardEnv};

/// Keeps every gauge's last value (a debugging recorder's snapshot resets them, which
/// would hide a gauge that is never set again).
#[derive(Clone)]
struct LastValues(Arc<Registry<Key, AtomicStorage>>);

impl Recorder for LastValues {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

impl LastValues {
    /// The gauge `name` of node `node`, if it was ever set.
    fn gauge(&self, name: &str, node: &str) -> Option<f64> {
        self.0
            .get_gauge_handles()
            .into_iter()
            .find(|(key, _)| {
                key.name() == name && key.labels().any(|l| l.key() == "node" && l.value() == node)
            })
            .map(|(_, g)| f64::from_bits(g.load(Ordering::SeqCst)))
    }

    /// Every node's load gauge equals the load its own view gives it.
    fn check_loads(&self, c: &Cluster, when: &str) {
        for (id, m) in &c.nodes {
            let view = m.view();
            let mine = view
                .nodes
                .iter()
                .find(|n| n.id == *id)
                .map_or(0.0, |n| n.load);
            let recorded = self.gauge(LOAD, id);
            assert!(
                recorded.is_some_and(|g| (g - mine).abs() < 1e-9),
                "{when}: {id} records {recorded:?}, its view says {mine}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn load_gauges_follow_each_node_s_view() {
    let recorder = LastValues(Arc::new(Registry::atomic()));
    metrics::set_global_recorder(recorder.clone()).expect("only this test sets a recorder");
    let mut env = ShardEnv::memory();
    env.shards = 200;
    env.nodes = 4;
    let c = started_by_load(&env, zipf(200, 1.1), LoadPolicy::default(), &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    recorder.check_loads(&c, "balanced");
    let balancer = c.nodes.get("node-0").expect("node-0");
    let imbalance = recorder.gauge(LOAD_IMBALANCE, "node-0");
    let seen = balancer.view().load_imbalance();
    assert!(
        seen > 1.0 && imbalance.is_some_and(|g| (g - seen).abs() < 1e-9),
        "the balancer records {imbalance:?}, its view says {seen}"
    );

    // A drained node hands every shard away: its gauge goes to 0 with its view, not
    // only at its next publication of figures (it has none left to publish).
    let drained = c.nodes.get("node-3").expect("node-3");
    assert!(recorder.gauge(LOAD, "node-3").is_some_and(|g| g > 0.0));
    drained.drain().await.expect("drain");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(recorder.gauge(LOAD, "node-3"), Some(0.0));
    recorder.check_loads(&c, "after the drain");
    c.close_all().await;
}
