//! The shard manager's configuration and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tenure_core::{DynBackend, ElectionName, Error, FencingToken, Member, Result, Timing};

use crate::hash::key_hash;

/// The most shards one namespace may have (2^20): the most whose node state still
/// fits in one member value
/// ([`MAX_MEMBER_VALUE_LEN`](tenure_core::MAX_MEMBER_VALUE_LEN), 512 KiB) in the worst
/// case, two sets as bitmaps at density one half and change lists a quarter of their
/// size (see the state format in the crate README).
pub const MAX_SHARDS: usize = 1 << 20;
/// The largest replication factor accepted.
pub const MAX_REPLICATION: usize = 16;
/// The largest node weight accepted.
pub const MAX_WEIGHT: u32 = 1000;
/// The longest [`member_grace`](ShardManagerBuilder::member_grace) accepted (one
/// hour): a grace is for a node coming back from a session the store took away, not
/// for keeping a dead node's shards.
pub const MAX_MEMBER_GRACE: Duration = Duration::from_secs(3600);

/// A shard of the namespace: its index (0-based, in the configured order) and name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: usize,
    name: Arc<str>,
}

impl Shard {
    /// The shard's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The shard's name (the election is `<namespace>/<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Shard({}, {:?})", self.index, &*self.name)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Which shards a namespace has.
#[derive(Clone, Debug)]
enum ShardNames {
    Count(usize),
    Names(Vec<String>),
}

/// The layout every node and router of a namespace must agree on: the namespace, the
/// shards and the replication factor. Clones share the shard list (a clone per manager
/// costs no memory per shard).
#[derive(Clone, Debug)]
pub struct Layout {
    pub(crate) namespace: ElectionName,
    // Shared by every clone: the managers and maps of one process need one copy.
    pub(crate) shards: Arc<[Shard]>,
    pub(crate) elections: Arc<[ElectionName]>,
    pub(crate) hashes: Arc<[u64]>,
    /// Shard indices in the order of their election names, to find a shard by name.
    order: Arc<[u32]>,
    pub(crate) replication: usize,
}

impl Layout {
    /// `count` shards named `0000`, `0001`, … (at least four digits) in `namespace`,
    /// each replicated on `replication` nodes.
    pub fn new(namespace: &str, count: usize, replication: usize) -> Result<Layout> {
        Layout::build(namespace, ShardNames::Count(count), replication)
    }

    /// Shards with the given names (each a valid election name suffix, no duplicates).
    pub fn with_names(namespace: &str, names: Vec<String>, replication: usize) -> Result<Layout> {
        Layout::build(namespace, ShardNames::Names(names), replication)
    }

    fn build(namespace: &str, names: ShardNames, replication: usize) -> Result<Layout> {
        let ns = ElectionName::new(namespace)
            .map_err(|e| Error::invalid(format!("namespace: {}", e.message())))?;
        let names: Vec<String> = match names {
            ShardNames::Count(n) => {
                if n == 0 || n > MAX_SHARDS {
                    return Err(Error::invalid(format!(
                        "shards: {n}; a namespace has 1 to {MAX_SHARDS} shards"
                    )));
                }
                let width = (n - 1).to_string().len().max(4);
                (0..n).map(|i| format!("{i:0width$}")).collect()
            }
            ShardNames::Names(v) => {
                if v.is_empty() || v.len() > MAX_SHARDS {
                    return Err(Error::invalid(format!(
                        "shard names: {} given; a namespace has 1 to {MAX_SHARDS} shards",
                        v.len()
                    )));
                }
                let mut seen = std::collections::HashSet::new();
                if let Some(d) = v.iter().find(|n| !seen.insert(n.as_str())) {
                    return Err(Error::invalid(format!("shard name {d:?} appears twice")));
                }
                v
            }
        };
        if replication == 0 || replication > MAX_REPLICATION {
            return Err(Error::invalid(format!(
                "replication: {replication}; use 1 to {MAX_REPLICATION}"
            )));
        }
        let mut shards = Vec::with_capacity(names.len());
        let mut elections = Vec::with_capacity(names.len());
        let mut hashes = Vec::with_capacity(names.len());
        for (index, name) in names.into_iter().enumerate() {
            let election = ElectionName::new(format!("{ns}/{name}"))
                .map_err(|e| Error::invalid(format!("shard name {name:?}: {}", e.message())))?;
            hashes.push(key_hash(election.as_str()));
            elections.push(election);
            shards.push(Shard {
                index,
                name: Arc::from(name),
            });
        }
        // At most MAX_SHARDS, so every index fits.
        let mut order: Vec<u32> = (0..elections.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| elections[a as usize].cmp(&elections[b as usize]));
        Ok(Layout {
            namespace: ns,
            shards: shards.into(),
            elections: elections.into(),
            hashes: hashes.into(),
            order: order.into(),
            replication,
        })
    }

    /// The index of the shard whose election is `election`, if it is one of this
    /// layout's.
    pub(crate) fn shard_of(&self, election: &ElectionName) -> Option<usize> {
        self.order
            .binary_search_by(|&i| self.elections[i as usize].cmp(election))
            .ok()
            .map(|k| self.order[k] as usize)
    }

    /// The namespace (also the membership namespace).
    pub fn namespace(&self) -> &ElectionName {
        &self.namespace
    }

    /// The shards in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The election of `shard`.
    pub fn election(&self, shard: &Shard) -> &ElectionName {
        &self.elections[shard.index]
    }

    /// The replication factor.
    pub fn replication(&self) -> usize {
        self.replication
    }
}

/// Builds a [`ShardManager`](crate::ShardManager).
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `layout` | required | namespace, shards, replication ([`Layout`]) |
/// | `node_id` | required | this node's member id (letters, digits, `-_.`) |
/// | `weight` | 1 | relative share of leaderships (1 to 1000); under `balance_by_load`, the node's capacity: its share of the load |
/// | `zone` | none | this node's failure domain (1 to 64 of letters, digits, `-_.:/`): every shard's replicas span as many zones as there are, up to the replication factor |
/// | `timing` | [`Timing::default`] | session TTL, renewal, deadlines |
/// | `handoff_rate` | 5,000 per second | graceful handoffs this node starts per second (those due together are resigned as one batch) |
/// | `handoff_burst` | 500 | handoffs it may start at once |
/// | `publish_interval` | 10 ms | least time between two updates of this node's member value |
/// | `campaign_limit` | 1024 | campaigns this node has in flight at once, a batch of tries for free shards counting one per seat (the rest wait for a permit; only those in flight are published as campaigning, so this also bounds the handoffs towards this node per round) |
/// | `startup_quiet` | 100 ms | at start, campaign only once the member list has not changed for this long |
/// | `member_grace` | TTL / 4 | how long a member that left the list without draining (its session ended, expired or was revoked) is kept in the plan before its shards are given to others; one that comes back within it moves nothing |
/// | `balance_by_load` | off (by count) | choose leaders by the loads reported with [`report_load`](crate::ShardManager::report_load): within a tolerance of each node's share by weight (its capacity), at most so many moves per window ([`LoadPolicy`](crate::balance::LoadPolicy)) |
/// | `load_interval` | 1 s | least time between two publications of changed load figures |
/// | `before_handoff` | none | a hook whose future this node awaits, besides the `Acquired` event's work guard, before it releases a shard it was asked to give up |
#[derive(Clone)]
pub struct ShardManagerBuilder {
    pub(crate) backend: DynBackend,
    pub(crate) layout: Option<Layout>,
    pub(crate) node_id: Option<String>,
    pub(crate) weight: u32,
    pub(crate) zone: Option<String>,
    pub(crate) timing: Timing,
    pub(crate) handoff_rate: f64,
    pub(crate) handoff_burst: u32,
    pub(crate) publish_interval: Duration,
    pub(crate) startup_quiet: Duration,
    /// `None`: a quarter of the TTL.
    pub(crate) member_grace: Option<Duration>,
    pub(crate) campaign_limit: usize,
    pub(crate) balance: Option<crate::balance::LoadPolicy>,
    pub(crate) load_interval: Duration,
    pub(crate) before_handoff: Option<HandoffHook>,
}

/// What [`ShardManagerBuilder::before_handoff`] keeps.
pub(crate) type HandoffHook =
    Arc<dyn Fn(&Shard, FencingToken) -> BoxFuture<'static, ()> + Send + Sync>;

impl fmt::Debug for ShardManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardManagerBuilder")
            .field("backend", &self.backend.scheme())
            .field(
                "layout",
                &self.layout.as_ref().map(|l| l.namespace.as_str()),
            )
            .field("node_id", &self.node_id)
            .field("weight", &self.weight)
            .field("zone", &self.zone)
            .finish()
    }
}

impl ShardManagerBuilder {
    pub(crate) fn new(backend: DynBackend) -> Self {
        ShardManagerBuilder {
            backend,
            layout: None,
            node_id: None,
            weight: 1,
            zone: None,
            timing: Timing::default(),
            handoff_rate: 5_000.0,
            handoff_burst: 500,
            publish_interval: Duration::from_millis(10),
            startup_quiet: Duration::from_millis(100),
            member_grace: None,
            campaign_limit: 1024,
            balance: None,
            load_interval: Duration::from_secs(1),
            before_handoff: None,
        }
    }

    /// The namespace, shards and replication factor.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    /// This node's id.
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = Some(id.into());
        self
    }

    /// This node's weight: its share of the leaderships relative to other nodes, or,
    /// balancing by load, its capacity (a node of weight 2 carries twice the load).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// This node's failure domain (a zone, or zone and rack as one name such as
    /// `eu-west-1a/r7`): a shard's replicas are spread over as many zones as there
    /// are, so losing a whole zone leaves every shard a replica elsewhere (with at
    /// least as many zones as the replication factor).
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Session timing.
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Graceful handoffs per second and burst.
    pub fn handoff_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.handoff_rate = per_second;
        self.handoff_burst = burst;
        self
    }

    /// Least time between two publications of this node's state.
    pub fn publish_interval(mut self, interval: Duration) -> Self {
        self.publish_interval = interval;
        self
    }

    /// At start, wait until the member list has held still this long before
    /// campaigning.
    pub fn startup_quiet(mut self, quiet: Duration) -> Self {
        self.startup_quiet = quiet;
        self
    }

    /// How long a member that left the list without draining stays in this node's plan
    /// before its shards are given to others (default: a quarter of the TTL; zero:
    /// at once). A member leaves the list when its session ends: crashed, closed, or
    /// taken away by the store while the node itself was fine (an etcd lease the
    /// store's resuming raft leader revoked, a session the store expired); such a node
    /// opens a new session, registers again and campaigns for its shards at once, and
    /// if it is back within the grace nothing moves. The grace delays failover only for
    /// the shards whose leader left too: a crashed node's shards are led again after
    /// its TTL plus the grace. Safety never depends on it (every shard is an election).
    pub fn member_grace(mut self, grace: Duration) -> Self {
        self.member_grace = Some(grace);
        self
    }

    /// The member grace in effect: the one set, or a quarter of the TTL.
    pub(crate) fn grace(&self) -> Duration {
        self.member_grace.unwrap_or(self.timing.ttl / 4)
    }

    /// Campaigns in flight at once.
    pub fn campaign_limit(mut self, limit: usize) -> Self {
        self.campaign_limit = limit;
        self
    }

    /// Balance leaderships by reported load rather than by count, once loads are
    /// reported (until then, and for shards nobody reported, by count). The node that
    /// balances is the first active member by id: give every node of a namespace the
    /// same policy, since the balancer's is the one that counts.
    pub fn balance_by_load(mut self, policy: crate::balance::LoadPolicy) -> Self {
        self.balance = Some(policy);
        self
    }

    /// Least time between two publications of changed load figures (reports in
    /// between are folded into the last).
    pub fn load_interval(mut self, interval: Duration) -> Self {
        self.load_interval = interval;
        self
    }

    /// One more way to stop a shard's work before a planned transition, besides the
    /// `Acquired` event's work guard (which every handoff already waits for): when a
    /// grant of `shard` (with `token`) is asked to step down (a handoff, a drain, a
    /// preemption, close), this node calls `hook(shard, token)` and keeps the seat,
    /// renewed, until the returned future completes and the event's work guard is
    /// gone, or the session's step-down grace runs out. A grant that is lost (not
    /// asked) does not call it.
    pub fn before_handoff<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Shard, FencingToken) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        self.before_handoff = Some(Arc::new(hook));
        self
    }

    pub(crate) fn validate(&self) -> Result<(Layout, String)> {
        let layout = self
            .layout
            .clone()
            .ok_or_else(|| Error::invalid("layout: not set (namespace, shards, replication)"))?;
        let id = self
            .node_id
            .clone()
            .ok_or_else(|| Error::invalid("node_id: not set"))?;
        Member::check_id(&id).map_err(|e| Error::invalid(format!("node_id: {}", e.message())))?;
        if let Some(zone) = &self.zone {
            check_zone(zone)?;
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(Error::invalid(format!(
                "weight: {}; use 1 to {MAX_WEIGHT} (drain a node to give it nothing)",
                self.weight
            )));
        }
        if !(self.handoff_rate.is_finite() && self.handoff_rate > 0.0) || self.handoff_burst == 0 {
            return Err(Error::invalid(format!(
                "handoff_rate: {} per second, burst {}; both must be positive",
                self.handoff_rate, self.handoff_burst
            )));
        }
        if self.campaign_limit == 0 || self.campaign_limit > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(Error::invalid(format!(
                "campaign_limit: {}; at least 1",
                self.campaign_limit
            )));
        }
        if self.publish_interval > self.timing.ttl {
            return Err(Error::invalid(format!(
                "publish_interval: {:?} is longer than the TTL {:?}",
                self.publish_interval, self.timing.ttl
            )));
        }
        if let Some(p) = &self.balance {
            if !(p.tolerance.is_finite() && p.tolerance > 0.0 && p.tolerance < 1.0) {
                return Err(Error::invalid(format!(
                    "balance_by_load: tolerance {}; use a fraction above 0 and below 1 (0.1 for ±10%)",
                    p.tolerance
                )));
            }
            if p.max_moves == 0 || p.window.is_zero() {
                return Err(Error::invalid(format!(
                    "balance_by_load: {} moves per {:?}; both must be positive",
                    p.max_moves, p.window
                )));
            }
        }
        if self.load_interval.is_zero() {
            return Err(Error::invalid("load_interval: must be positive"));
        }
        if self.grace() > MAX_MEMBER_GRACE {
            return Err(Error::invalid(format!(
                "member_grace: {:?}; at most {MAX_MEMBER_GRACE:?}",
                self.grace()
            )));
        }
        self.timing.validate()?;
        Ok((layout, id))
    }
}

/// The longest zone name accepted.
pub const MAX_ZONE_LEN: usize = 64;

/// A zone name is 1 to [`MAX_ZONE_LEN`] of ASCII letters, digits and `-_.:/` (it is
/// published in the member value, whose fields are separated by spaces).
fn check_zone(zone: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    if zone.is_empty() || zone.len() > MAX_ZONE_LEN || !zone.chars().all(ok) {
        return Err(Error::invalid(format!(
            "zone: {zone:?}; use 1 to {MAX_ZONE_LEN} of letters, digits and -_.:/"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::{ErrorKind, MemoryBackend};

    #[test]
    fn a_shard_is_found_by_its_election_whatever_the_order_of_names() {
        let names = ["zeta", "alpha", "mid", "b-2", "b-10"]
            .map(String::from)
            .to_vec();
        let layout = Layout::with_names("svc", names, 1).unwrap();
        for (i, election) in layout.elections.iter().enumerate() {
            assert_eq!(layout.shard_of(election), Some(i), "{election}");
        }
        let other = ElectionName::new("svc/nope").unwrap();
        assert_eq!(layout.shard_of(&other), None);
        let counted = Layout::new("svc", 12_345, 3).unwrap();
        let e = counted.elections[9_876].clone();
        assert_eq!(counted.shard_of(&e), Some(9_876));
        // Clones share the lists.
        assert!(Arc::ptr_eq(&counted.elections, &counted.clone().elections));
    }

    #[test]
    fn layouts() {
        let l = Layout::new("orders", 256, 3).unwrap();
        assert_eq!(l.shards().len(), 256);
        assert_eq!(l.shards()[7].name(), "0007");
        assert_eq!(l.election(&l.shards()[255]).as_str(), "orders/0255");
        assert_eq!(
            Layout::new("x", 100_000, 1).unwrap().shards()[5].name(),
            "00005"
        );
        let named = Layout::with_names("eu", vec!["de".into(), "fr".into()], 2).unwrap();
        assert_eq!(named.election(&named.shards()[1]).as_str(), "eu/fr");
    }

    #[test]
    fn bad_layouts_and_builders_name_the_field() {
        let cases: Vec<(Result<Layout>, &str)> = vec![
            (Layout::new("", 4, 1), "namespace"),
            (Layout::new("a b", 4, 1), "namespace"),
            (Layout::new("ns", 0, 1), "shards"),
            (Layout::new("ns", MAX_SHARDS + 1, 1), "shards"),
            (Layout::new("ns", 4, 0), "replication"),
            (Layout::new("ns", 4, 17), "replication"),
            (Layout::with_names("ns", vec![], 1), "shard names"),
            (
                Layout::with_names("ns", vec!["a".into(), "a".into()], 1),
                "twice",
            ),
            (
                Layout::with_names("ns", vec!["a//b".into()], 1),
                "shard name",
            ),
        ];
        for (r, field) in cases {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains(field), "{e} should name {field}");
        }
        let b = ShardManagerBuilder::new(std::sync::Arc::new(MemoryBackend::new()));
        let l = Layout::new("ns", 4, 1).unwrap();
        for (builder, field) in [
            (b.clone(), "layout"),
            (b.clone().layout(l.clone()), "node_id"),
            (b.clone().layout(l.clone()).node_id("a/b"), "node_id"),
            (b.clone().layout(l.clone()).node_id("a").weight(0), "weight"),
            (b.clone().layout(l.clone()).node_id("a").zone(""), "zone"),
            (
                b.clone().layout(l.clone()).node_id("a").balance_by_load(
                    crate::balance::LoadPolicy {
                        tolerance: 0.0,
                        ..Default::default()
                    },
                ),
                "balance_by_load",
            ),
            (
                b.clone().layout(l.clone()).node_id("a").balance_by_load(
                    crate::balance::LoadPolicy {
                        max_moves: 0,
                        ..Default::default()
                    },
                ),
                "balance_by_load",
            ),
            (
                b.clone()
                    .layout(l.clone())
                    .node_id("a")
                    .load_interval(Duration::ZERO),
                "load_interval",
            ),
            (
                b.clone().layout(l.clone()).node_id("a").zone("eu west"),
                "zone",
            ),
            (
                b.clone()
                    .layout(l.clone())
                    .node_id("a")
                    .zone("z".repeat(65)),
                "zone",
            ),
            (
                b.clone()
                    .layout(l.clone())
                    .node_id("a")
                    .handoff_rate(0.0, 1),
                "handoff_rate",
            ),
            (
                b.clone()
                    .layout(l.clone())
                    .node_id("a")
                    .publish_interval(Duration::from_secs(60)),
                "publish_interval",
            ),
        ] {
            let e = builder.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains(field), "{e} should name {field}");
        }
        let zoned = b.layout(l).node_id("a").zone("eu-west-1a/r7");
        assert!(zoned.validate().is_ok());
    }
}
