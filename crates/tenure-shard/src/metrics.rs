//! Metrics of the shard manager, through the `metrics` facade.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `tenure_shard_leaders` | gauge | `namespace`, `node` | shards this node leads |
//! | `tenure_shard_imbalance_ratio` | gauge | `namespace`, `node` | in this node's view: most leaderships of an active node / mean over active nodes |
//! | `tenure_shard_pending_handoffs` | gauge | `namespace`, `node` | shards this node leads but should hand off |
//! | `tenure_shard_drain_remaining` | gauge | `namespace`, `node` | while draining: shards still held or campaigned for, else 0 |
//! | `tenure_shard_members` | gauge | `namespace`, `node` | members in this node's view |
//! | `tenure_shard_load` | gauge | `namespace`, `node` | the load this node leads in its view: the sum of the published figures of the shards it holds (once any figure is published) |
//! | `tenure_shard_load_imbalance_ratio` | gauge | `namespace`, `node` | on the balancer by load: most load per weight of an active node / the mean (1.0 is perfect) |

use crate::config::Layout;
use crate::state::View;
use crate::status::ShardStatus;

/// Gauge: shards this node leads.
pub const LEADERS: &str = "tenure_shard_leaders";
/// Gauge: max/mean leaderships over active nodes.
pub const IMBALANCE: &str = "tenure_shard_imbalance_ratio";
/// Gauge: handoffs this node still has to make.
pub const PENDING_HANDOFFS: &str = "tenure_shard_pending_handoffs";
/// Gauge: shards left to drain.
pub const DRAIN_REMAINING: &str = "tenure_shard_drain_remaining";
/// Gauge: members in view.
pub const MEMBERS: &str = "tenure_shard_members";

/// Gauge: the load this node leads.
pub const LOAD: &str = "tenure_shard_load";
/// Gauge: max/mean load per weight over active nodes (on the balancer).
pub const LOAD_IMBALANCE: &str = "tenure_shard_load_imbalance_ratio";

pub(crate) fn record_load_imbalance(layout: &Layout, node: &str, ratio: f64) {
    metrics::gauge!(LOAD_IMBALANCE, "namespace" => layout.namespace.as_str().to_string(), "node" => node.to_string())
        .set(ratio);
}

/// Max over mean of leaderships of the active nodes in `view` (0 if none lead).
pub(crate) fn imbalance(view: &View) -> f64 {
    crate::view::max_over_mean(
        view.nodes
            .iter()
            .zip(&view.leads)
            .filter(|(n, _)| !n.draining)
            .map(|(_, l)| *l),
    )
}

pub(crate) fn record(layout: &Layout, node: &str, status: &ShardStatus, view: &View) {
    let ns = layout.namespace.as_str().to_string();
    let node = node.to_string();
    metrics::gauge!(LEADERS, "namespace" => ns.clone(), "node" => node.clone())
        .set(status.held as f64);
    metrics::gauge!(IMBALANCE, "namespace" => ns.clone(), "node" => node.clone())
        .set(imbalance(view));
    metrics::gauge!(PENDING_HANDOFFS, "namespace" => ns.clone(), "node" => node.clone())
        .set(status.pending_handoffs as f64);
    let remaining = if status.draining {
        status.held + status.campaigning
    } else {
        0
    };
    metrics::gauge!(DRAIN_REMAINING, "namespace" => ns.clone(), "node" => node.clone())
        .set(remaining as f64);
    if view.loads.reported > 0 {
        let load = view
            .index_of(&node)
            .and_then(|me| view.node_load.get(me as usize))
            .copied()
            .unwrap_or(0);
        metrics::gauge!(LOAD, "namespace" => ns.clone(), "node" => node.clone())
            .set(load as f64 / 1000.0);
    }
    metrics::gauge!(MEMBERS, "namespace" => ns, "node" => node).set(status.members as f64);
}
