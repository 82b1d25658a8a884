//! What a scenario runs on ([`ShardEnv`]): the store to connect to, the timing, the
//! size of the cluster and the time allowed.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::Timing;

use super::cluster::{same_backend, timing, Cluster, Connect};
use crate::Layout;

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

    pub(super) fn namespace(&self) -> String {
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
