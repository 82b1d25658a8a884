//! Balance by load: where shards are not equal, choose leaders so that no node carries
//! much more than its share of the reported load, moving as few shards as it can.
//!
//! Loads are reported per shard in a unit the application picks and kept as one byte
//! each ([`quantize`]: a log scale of 8% steps from 0.01 to about 3·10^6, and 0), so a
//! figure costs the same to publish whatever it is, and every node computes with the
//! same integers ([`level`], in thousandths of the unit).
//!
//! [`plan_by_load`] takes the replica sets of the count plan and chooses leaders:
//! a holder that is an active replica keeps its shard, the moves asked for (by the
//! balancer, see the shard manager) take theirs, and the other shards, heaviest
//! first, go to the replica with the lowest load per capacity after taking them.
//!
//! [`rebalance`] chooses the moves, at most a budget of them. A node whose largest
//! shard alone is above its share is pinned to that shard (it aims at carrying it
//! alone; the others share the rest; if another replica of that shard leads fewer
//! and lighter shards, the big shard moves there instead of the rest moving away).
//! A node above `(1 + tolerance)` of its share (a pinned node: a tenth of the
//! tolerance above its shard), worst first, gives up the shard whose move takes the
//! most load out of the band, counting both nodes' excess (so one move fixes as much
//! as it can, and small shards move only when nothing bigger fits); then a node below
//! `(1 − tolerance)` takes the shard that does the same for it; each until it is back
//! inside the band or no move helps (the band is 0.9 of the tolerance, as figures are
//! quantized to within 4%). No shard goes back to a node it left in one rebalance,
//! so the search ends. Nodes inside the band are left alone, and together with the
//! reporters' deadband ([`republish`]) that keeps figures that drift from causing
//! churn.
//!
//! Reports that jitter are kept out before they reach the plan: [`republish`] lets a
//! new figure through only when it differs from the published one by more than a
//! factor (1.5 by default, [`DEADBAND`]), so noise of ±20% around a steady load
//! publishes nothing while a shard turning hot or cold is published at once.
//!
//! A node that leads shard `s` carries at least `load(s)`, so no placement does better
//! than max(1, largest shard ÷ mean node load) as max/mean ([`lower_bound`]); with
//! replication R a shard can only go to its R replicas, which can make the best
//! reachable figure higher still.
//!
//! Cost: O(P log P) for the placement order and O(P · R log P) for an index of the
//! shards by (leader, replica) ordered by load, then O(N log P) per move: the gain of
//! a move is concave in the load moved, so each pair of nodes needs two lookups
//! (see `best_of_pair`); `max_moves` bounds the moves asked for per window.

mod balancer;
mod figures;
mod rebalance;

pub use self::figures::{level, lower_bound, quantize, republish, zipf, DEADBAND};
#[cfg(feature = "testing")]
pub use self::rebalance::rebalance_by_scan;
pub use self::rebalance::{plan_by_load, rebalance, LoadPolicy};
