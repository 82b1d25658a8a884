//! What the shard manager's in-memory tests share: the timing, a node started on a
//! backend, and waiting for a condition under the paused clock.

use std::time::Duration;

use tenure_core::{DynBackend, Timing};
use tenure_shard::{Layout, ShardEvents, ShardManager};

/// A 2 s TTL.
pub fn timing() -> Timing {
    Timing::from_ttl(Duration::from_secs(2))
}

/// Node `id` of `layout` on `backend`, started, with [`timing`].
pub async fn node(backend: &DynBackend, layout: &Layout, id: &str) -> (ShardManager, ShardEvents) {
    ShardManager::builder(backend.clone())
        .layout(layout.clone())
        .node_id(id)
        .timing(timing())
        .start()
        .await
        .unwrap()
}

/// Wait until `done`, looking every 50 ms; fails the test after 20 s.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not reached");
}
