//! The assignment's types: a member as it sees it ([`NodeSpec`]) and the computed
//! assignment ([`Plan`]).

use std::sync::Arc;

/// Marks "no node".
pub(super) const NONE: u32 = u32::MAX;

/// What the replica sets depend on of a node: its id, whether it is active, its zone.
pub(super) type NodeKey = (String, bool, Option<String>);

/// A member as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// The member id.
    pub id: String,
    /// Relative share of leaderships (1 = normal); 0 counts as draining.
    pub weight: u32,
    /// A draining node replicates and leads nothing.
    pub draining: bool,
    /// The node's failure domain (a zone, or zone and rack): replica sets span as many
    /// as there are. Nodes without one count as one domain together.
    pub zone: Option<String>,
}

impl NodeSpec {
    /// A node of weight 1, not draining, in no zone.
    pub fn new(id: impl Into<String>) -> Self {
        NodeSpec {
            id: id.into(),
            weight: 1,
            draining: false,
            zone: None,
        }
    }

    /// The same node in failure domain `zone`.
    pub fn in_zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    pub(crate) fn active(&self) -> bool {
        !self.draining && self.weight > 0
    }
}

/// The computed assignment. Node numbers index the `nodes` slice given to [`plan`](super::plan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub(super) r: usize,
    /// The node list (id, active, zone) the replica sets were computed for.
    pub(super) key: Arc<Vec<NodeKey>>,
    pub(super) replicas: Arc<Vec<u32>>,
    pub(super) preferred: Vec<u32>,
    pub(super) targets: Vec<u32>,
    pub(super) loads: Vec<u32>,
}

impl Plan {
    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.preferred.len()
    }

    /// The replicas of `shard`, best rank first (empty if no node is active).
    pub fn replicas(&self, shard: usize) -> &[u32] {
        if self.r == 0 {
            return &[];
        }
        &self.replicas[shard * self.r..(shard + 1) * self.r]
    }

    /// The node that should lead `shard`, if any node is active.
    pub fn preferred(&self, shard: usize) -> Option<u32> {
        self.preferred.get(shard).copied().filter(|n| *n != NONE)
    }

    /// How many leaderships `node` should have.
    pub fn target(&self, node: u32) -> u32 {
        self.targets.get(node as usize).copied().unwrap_or(0)
    }

    /// How many leaderships the plan gives `node`.
    pub fn load(&self, node: u32) -> u32 {
        self.loads.get(node as usize).copied().unwrap_or(0)
    }

    /// Planned leaderships per node (indexed like the `nodes` slice).
    pub fn loads(&self) -> &[u32] {
        &self.loads
    }

    /// The same replica sets and fair shares with other leaders (`NONE`-free where a
    /// shard has one), the counts per node following them: what a balance other than
    /// by count chose.
    pub(crate) fn with_leaders(&self, preferred: Vec<u32>) -> Plan {
        let mut loads = vec![0u32; self.loads.len()];
        for n in &preferred {
            if let Some(l) = loads.get_mut(*n as usize) {
                *l += 1;
            }
        }
        Plan {
            r: self.r,
            key: self.key.clone(),
            replicas: self.replicas.clone(),
            preferred,
            targets: self.targets.clone(),
            loads,
        }
    }

    /// This plan with the leaders of some shards changed, `(shard, node)`: O(P) to
    /// copy, O(changes) to apply, instead of planning again.
    pub(crate) fn with_leaders_changed(&self, changes: &[(usize, u32)]) -> Plan {
        let mut plan = self.clone();
        for &(s, n) in changes {
            let Some(slot) = plan.preferred.get_mut(s) else {
                continue;
            };
            if let Some(l) = plan.loads.get_mut(*slot as usize) {
                *l = l.saturating_sub(1);
            }
            *slot = n;
            if let Some(l) = plan.loads.get_mut(n as usize) {
                *l += 1;
            }
        }
        plan
    }

    /// Shards whose planned leader differs from their current holder (shards without
    /// a holder are not counted).
    pub fn moves_from(&self, holders: &[Option<u32>]) -> usize {
        holders
            .iter()
            .enumerate()
            .filter(|(s, h)| h.is_some_and(|h| self.preferred(*s) != Some(h)))
            .count()
    }
}
