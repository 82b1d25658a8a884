//! What a node's manager reports of itself ([`ShardStatus`]), read by the manager's
//! callers and by its metrics.

/// Counters of one node's manager, updated as it works.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardStatus {
    /// Members in this node's view.
    pub members: usize,
    /// Shards this node holds.
    pub held: usize,
    /// Shards this node campaigns for without holding them yet.
    pub campaigning: usize,
    /// Shards the assignment gives this node (by load, that need not be its fair
    /// share by count, which [`NodeInfo::target`](crate::NodeInfo) gives).
    pub target: usize,
    /// Shards this node holds but should hand off.
    pub pending_handoffs: usize,
    /// Whether this node is draining.
    pub draining: bool,
    /// Whether, in this node's view, every shard is led by its preferred node.
    pub settled: bool,
    /// On the balancer by load: the moves it has worked out and not yet seen made
    /// (asked for, or held back by the move budget), plus one while the latest
    /// figures and members have no rebalance yet; 0 on every other node.
    pub balancing: usize,
    /// Incremented on every recomputation.
    pub version: u64,
}

impl ShardStatus {
    /// Whether this node is done with the member list it sees, and that list has
    /// `members` members: every shard with its preferred node in its view, nothing
    /// campaigned for, nothing left to hand off, no balancing moves left to ask for.
    pub fn is_quiet(&self, members: usize) -> bool {
        self.members == members
            && self.settled
            && self.campaigning == 0
            && self.pending_handoffs == 0
            && self.balancing == 0
    }
}
