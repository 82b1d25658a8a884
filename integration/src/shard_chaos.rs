//! Shard-level chaos: `tenure shards run` nodes under a seeded nemesis, and a check of
//! every shard's history as the nodes' event lines report it.
//!
//! [`run_shard_chaos`] starts a local store (etcd, Redis, ZooKeeper or PostgreSQL; never
//! an external one, since the nemesis pauses and restarts it), a [`GuardedResource`],
//! and N `tenure shards run` nodes (default 5, ids `n1`…) sharing P shards (default 24,
//! replication 3, TTL 2 s). The command of every shard a node leads is the chaos
//! runner's writer ([`write_loop_command`]): every 200 ms it sends
//! `WRITE $TENURE_ELECTION $TENURE_TOKEN $TENURE_ID` to the resource, which stamps each
//! write with `CLOCK_MONOTONIC` and refuses a token below the highest it has accepted
//! for that shard. Once every shard has been acquired, a nemesis drawn from one seed
//! injects one [`ShardFault`] at a time, in rounds that each shuffle every kind, with
//! quiet gaps of 0.25–1 TTL, until the duration is up (never before the first round is
//! complete, so every kind is injected). Then the store and the nodes get 2 TTL of
//! quiet, and the nodes are drained one after the other (SIGTERM; each must print
//! `drained` and exit 0).
//!
//! [`check_shard_histories`] reads the nodes' event lines (`acquired`, `handed_off`,
//! `lost`, and the harness's own `killed` and `exited`) as one tenure log per process
//! and puts every shard (election) through the chaos module's checker:
//! [`check_fencing_at`] (no two tenures of a shard overlap as the events report them,
//! tokens strictly increase in grant order, every grant has a token),
//! [`stale_writes_accepted`] (the resource accepted no write with a token that was
//! stale, another node's, or never granted) and [`max_leaderless_gap`]. On top of that,
//! every `acquired` line must be followed, in that process's output, by exactly one
//! `handed_off` or `lost` line for the same token (with any `handing_off` line between
//! the two, as documented); only a process the harness SIGKILLed may leave grants open
//! (they end at the kill instant). A node that does not drain when told is a violation
//! too.
//!
//! Redis runs without persistence, so a store restart empties it and can hand a shard
//! to a second node before the first one's deadline: the same documented limit as in
//! [`crate::chaos`]. An overlap is allowed for it only when a restart fell between the
//! two grants and the first tenure ended within one TTL of the store answering again;
//! stale writes accepted always count.
//!
//! The bounded runs of the test suite (`integration/tests/shard_chaos.rs`) use
//! [`assert_shard_chaos`]; `TENURE_SHARD_CHAOS_SECS` (a duration: `120`, `90s`, `30m`)
//! and `TENURE_SHARD_CHAOS_SEED` override its duration and seed.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::candidate::{CandidateProcess, Event};
use crate::chaos::{
    max_leaderless_gap, parse_duration, stale_writes_accepted, superseded_writes_before_successor,
    ChaosBackend, Rng,
};
use crate::error::{HarnessError, Result};
use crate::fencing::{
    check_fencing_at, tenures, write_loop_command, FencingViolation, GuardedResource, Tenure,
    WriteRecord,
};
use crate::os::monotonic_now_ns;
use crate::server::{EtcdServer, PostgresServer, RedisServer, StoreServer, ZooKeeperServer};

/// The stores a shard chaos run can use.
pub const SHARD_CHAOS_BACKENDS: [ChaosBackend; 4] = [
    ChaosBackend::Etcd,
    ChaosBackend::Redis,
    ChaosBackend::ZooKeeper,
    ChaosBackend::Postgres,
];

/// The variable that overrides the nemesis duration of [`assert_shard_chaos`] (`120`,
/// `90s`, `30m`; a bare number is seconds).
pub const SECS_VAR: &str = "TENURE_SHARD_CHAOS_SECS";

/// The variable that overrides the seed of [`assert_shard_chaos`].
pub const SEED_VAR: &str = "TENURE_SHARD_CHAOS_SEED";

/// `shards run`'s line for a grant.
pub const ACQUIRED: &str = "acquired";
/// `shards run`'s line when a node decides to hand a shard over (not an end: the seat
/// is held until `handed_off`).
pub const HANDING_OFF: &str = "handing_off";
/// `shards run`'s line once a handed-over shard's seat is resigned.
pub const HANDED_OFF: &str = "handed_off";
/// `shards run`'s last line after a drain.
pub const DRAINED: &str = "drained";

/// How long the nodes get to acquire every shard before the nemesis starts.
const COLD_START: Duration = Duration::from_secs(30);

/// One kind of fault of the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ShardFault {
    /// SIGKILL a node (the kernel kills its commands with it) and start it again, same
    /// id, after 0–1 TTL.
    KillNode,
    /// SIGSTOP a node for 1.25–2.5 TTL, past its TTL (its commands keep writing with
    /// their tokens), then SIGCONT.
    FreezeNode,
    /// SIGSTOP a node for 0.2–0.6 TTL, within its renew deadline, then SIGCONT.
    StallNode,
    /// SIGTERM a node: it hands every shard over, prints `drained` and exits 0; it is
    /// started again after 0–1 TTL.
    DrainNode,
    /// SIGSTOP the store for the renew deadline + 0.25 TTL up to 2 TTL, then SIGCONT.
    PauseStore,
    /// SIGKILL the store and start it again on the same port and data directory after
    /// 0–1.5 TTL (Redis, without persistence, comes back empty).
    RestartStore,
}

impl ShardFault {
    /// Every kind, in the order reports list them.
    pub const ALL: [ShardFault; 6] = [
        ShardFault::KillNode,
        ShardFault::FreezeNode,
        ShardFault::StallNode,
        ShardFault::DrainNode,
        ShardFault::PauseStore,
        ShardFault::RestartStore,
    ];

    /// The name in reports: `kill_node`, `freeze_node`, …
    pub fn name(self) -> &'static str {
        match self {
            ShardFault::KillNode => "kill_node",
            ShardFault::FreezeNode => "freeze_node",
            ShardFault::StallNode => "stall_node",
            ShardFault::DrainNode => "drain_node",
            ShardFault::PauseStore => "pause_store",
            ShardFault::RestartStore => "restart_store",
        }
    }
}

impl fmt::Display for ShardFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a shard chaos run does; [`ShardChaosOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ShardChaosOptions {
    /// The store: one of [`SHARD_CHAOS_BACKENDS`].
    pub backend: ChaosBackend,
    /// How long the nemesis runs (it always completes its first round). Default 25 s.
    pub duration: Duration,
    /// How many `shards run` nodes. Default 5.
    pub nodes: usize,
    /// How many shards. Default 24.
    pub shards: usize,
    /// Replication factor. Default 3.
    pub replication: usize,
    /// The nodes' session TTL. Default 2 s.
    pub ttl: Duration,
    /// The seed of every random choice. Default: from the clock.
    pub seed: u64,
    /// How often each shard's command writes. Default 200 ms.
    pub write_every: Duration,
    /// The `tenure` binary the nodes run.
    pub tenure_bin: PathBuf,
    /// Print each fault to stderr as it is injected. Default true.
    pub verbose: bool,
}

impl ShardChaosOptions {
    /// Defaults for `backend`, running `tenure_bin`, with a seed from the clock.
    pub fn new(backend: ChaosBackend, tenure_bin: impl Into<PathBuf>) -> Self {
        ShardChaosOptions {
            backend,
            duration: Duration::from_secs(25),
            nodes: 5,
            shards: 24,
            replication: 3,
            ttl: Duration::from_secs(2),
            seed: clock_seed(),
            write_every: Duration::from_millis(200),
            tenure_bin: tenure_bin.into(),
            verbose: true,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(HarnessError::Chaos { reason });
        if !SHARD_CHAOS_BACKENDS.contains(&self.backend) {
            return bad(format!(
                "shard chaos runs on etcd, redis, zookeeper and postgres, not {}",
                self.backend
            ));
        }
        if !(2..=9).contains(&self.nodes) {
            return bad(format!("nodes: {} is not between 2 and 9", self.nodes));
        }
        if !(1..=1000).contains(&self.shards) {
            return bad(format!("shards: {} is not between 1 and 1000", self.shards));
        }
        if self.replication < 1 || self.replication > self.nodes {
            return bad(format!(
                "replication: {} is not between 1 and the {} nodes",
                self.replication, self.nodes
            ));
        }
        if self.ttl < Duration::from_millis(500) || self.ttl > Duration::from_secs(60) {
            return bad(format!("ttl: {:?} is not between 0.5 s and 60 s", self.ttl));
        }
        if self.write_every < Duration::from_millis(10) {
            return bad("write_every: below 10 ms".into());
        }
        Ok(())
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id())
}

/// The output of one `shards run` process, as the harness read it.
#[derive(Debug, Clone)]
pub struct NodeLog {
    /// The node id and the process id, e.g. `n2 (pid 4711)`.
    pub name: String,
    /// Its event lines in the order printed, with the harness's `killed` (it SIGKILLed
    /// the process) and `exited` (its stdout closed) events.
    pub events: Vec<Event>,
    /// The end of its stderr.
    pub stderr_tail: String,
}

impl NodeLog {
    /// Whether the harness SIGKILLed the process.
    pub fn killed(&self) -> bool {
        self.events
            .iter()
            .any(|e| e.synthetic && e.is(Event::KILLED))
    }
}

/// A time when the store lost its data (a restart of Redis without persistence): when
/// it was killed and when it answered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataLoss {
    /// `mono_ns` of the kill.
    pub lost_ns: u64,
    /// `mono_ns` once the restarted store answered.
    pub back_ns: u64,
}

/// Something the shard history check found wrong.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardViolation {
    /// From the per-election checker: two tenures of a shard overlap, a token did not
    /// increase in grant order, or a grant had no token.
    Fencing {
        /// What the checker found (its tenures' `log` index the [`NodeLog`]s given).
        violation: FencingViolation,
        /// The names of the nodes of the tenures involved, in order.
        nodes: Vec<String>,
    },
    /// An `acquired` line without a later `handed_off` or `lost` line for its token in
    /// the output of a process the harness did not SIGKILL.
    Unended {
        /// The node.
        node: String,
        /// The `acquired` line.
        acquired: Event,
        /// The node's later lines about the same grant (`handing_off`, the command's).
        after: Vec<Event>,
    },
    /// A `handed_off` or `lost` line that ends no grant: no `acquired` line for its
    /// token before it, or the grant had ended already.
    UnmatchedEnd {
        /// The node.
        node: String,
        /// The line.
        end: Event,
        /// Which of the two.
        why: &'static str,
    },
    /// A `handing_off` line out of causal order: after the grant's `handed_off` or
    /// `lost`, or with no `acquired` line before it.
    OutOfOrder {
        /// The node.
        node: String,
        /// The line.
        line: Event,
        /// Which of the two.
        why: &'static str,
    },
    /// A node that did not drain when told (SIGTERM): it did not exit 0 in time, or its
    /// last line was not `drained`.
    NotDrained {
        /// The node.
        node: String,
        /// What happened instead.
        why: String,
    },
}

impl ShardViolation {
    /// The kind, for the counts in the report: `overlap`, `token_not_increasing`,
    /// `missing_token`, `unended`, `unmatched_end`, `out_of_order`, `not_drained`.
    pub fn kind(&self) -> &'static str {
        match self {
            ShardViolation::Fencing { violation, .. } => match violation {
                FencingViolation::Overlap { .. } => "overlap",
                FencingViolation::TokenNotIncreasing { .. } => "token_not_increasing",
                FencingViolation::MissingToken { .. } => "missing_token",
            },
            ShardViolation::Unended { .. } => "unended",
            ShardViolation::UnmatchedEnd { .. } => "unmatched_end",
            ShardViolation::OutOfOrder { .. } => "out_of_order",
            ShardViolation::NotDrained { .. } => "not_drained",
        }
    }

    /// The shard (election) it is about, if one.
    pub fn election(&self) -> Option<&str> {
        match self {
            ShardViolation::Fencing { violation, .. } => Some(match violation {
                FencingViolation::Overlap { first, .. } => first.election.as_str(),
                FencingViolation::TokenNotIncreasing { earlier, .. } => earlier.election.as_str(),
                FencingViolation::MissingToken { tenure } => tenure.election.as_str(),
            }),
            ShardViolation::Unended { acquired, .. } => Some(acquired.election.as_str()),
            ShardViolation::UnmatchedEnd { end, .. } => Some(end.election.as_str()),
            ShardViolation::OutOfOrder { line, .. } => Some(line.election.as_str()),
            ShardViolation::NotDrained { .. } => None,
        }
    }

    /// One line, with times in seconds after `start_ns`.
    pub fn describe(&self, start_ns: u64) -> String {
        let at = |ns: u64| secs_after(ns, start_ns);
        let tenure = |t: &Tenure, node: &str| {
            let token = t.token.map_or_else(|| "none".into(), |t| t.to_string());
            format!(
                "{node} token {token} from {} to {} ({:?}{})",
                at(t.start_ns),
                at(t.end_ns),
                t.end,
                t.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )
        };
        let node = |nodes: &[String], i: usize| nodes.get(i).cloned().unwrap_or_default();
        match self {
            ShardViolation::Fencing { violation, nodes } => match violation {
                FencingViolation::Overlap { first, second } => format!(
                    "overlap on {}: [{}] and [{}] overlap by {:.1} ms",
                    first.election,
                    tenure(first, &node(nodes, 0)),
                    tenure(second, &node(nodes, 1)),
                    first
                        .end_ns
                        .min(second.end_ns)
                        .saturating_sub(second.start_ns) as f64
                        / 1e6
                ),
                FencingViolation::TokenNotIncreasing { earlier, later } => format!(
                    "token out of order on {}: [{}] then [{}]",
                    earlier.election,
                    tenure(earlier, &node(nodes, 0)),
                    tenure(later, &node(nodes, 1))
                ),
                FencingViolation::MissingToken { tenure: t } => format!(
                    "grant without a token on {}: [{}]",
                    t.election,
                    tenure(t, &node(nodes, 0))
                ),
            },
            ShardViolation::Unended {
                node,
                acquired,
                after,
            } => {
                let then: Vec<String> = after.iter().map(line).collect();
                format!(
                    "acquired with no end on {}: {node} printed {} and, for that token, \
                     only [{}] after it (the node was not SIGKILLed)",
                    acquired.election,
                    line(acquired),
                    then.join(", ")
                )
            }
            ShardViolation::OutOfOrder { node, line: l, why } => {
                format!("{why} on {}: {node} printed {}", l.election, line(l))
            }
            ShardViolation::UnmatchedEnd { node, end, why } => {
                format!("{why} on {}: {node} printed {}", end.election, line(end))
            }
            ShardViolation::NotDrained { node, why } => format!("{node} did not drain: {why}"),
        }
    }
}

/// An event as the JSON line it came from (fields in the harness's order).
fn line(e: &Event) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| e.to_string())
}

fn secs_after(ns: u64, start_ns: u64) -> String {
    format!("{:.3} s", ns.saturating_sub(start_ns) as f64 / 1e9)
}

/// The events of one `shards run` process in the words of the chaos checker
/// ([`tenures`], [`check_fencing_at`]): `acquired` → `elected`, `handed_off` →
/// `resigned`, `lost` as it is, the harness's `killed` and `exited`; every other line
/// (`handing_off`, the command's, `drained`) is left out.
pub fn tenure_events(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter_map(|e| {
            let kind = match e.kind.as_str() {
                _ if e.synthetic => match e.kind.as_str() {
                    Event::KILLED | Event::EXITED => e.kind.as_str(),
                    _ => return None,
                },
                ACQUIRED => Event::ELECTED,
                HANDED_OFF => Event::RESIGNED,
                Event::LOST => Event::LOST,
                _ => return None,
            };
            Some(Event {
                kind: kind.to_owned(),
                ..e.clone()
            })
        })
        .collect()
}

/// Every grant of `log` must end once: each `acquired` line followed by one
/// `handed_off` or `lost` line for its election and token, and no such line without a
/// grant it ends; a `handing_off` line comes between the two. A process the harness
/// SIGKILLed may leave grants open.
pub fn grant_ends(log: &NodeLog) -> Vec<ShardViolation> {
    let mut violations = Vec::new();
    let mut open: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    let mut ended: HashSet<(&str, u64)> = HashSet::new();
    for (i, e) in log.events.iter().enumerate() {
        if e.synthetic {
            continue;
        }
        // A grant without a token is the checker's MissingToken.
        let Some(token) = e.token else { continue };
        let key = (e.election.as_str(), token);
        match e.kind.as_str() {
            ACQUIRED => {
                open.insert(key, i);
            }
            HANDED_OFF | Event::LOST => {
                if open.remove(&key).is_none() {
                    let why = if ended.contains(&key) {
                        "a second end for one grant"
                    } else {
                        "an end with no acquired line before it"
                    };
                    violations.push(ShardViolation::UnmatchedEnd {
                        node: log.name.clone(),
                        end: e.clone(),
                        why,
                    });
                }
                ended.insert(key);
            }
            HANDING_OFF if !open.contains_key(&key) => {
                let why = if ended.contains(&key) {
                    "handing_off after the grant's end"
                } else {
                    "handing_off with no acquired line before it"
                };
                violations.push(ShardViolation::OutOfOrder {
                    node: log.name.clone(),
                    line: e.clone(),
                    why,
                });
            }
            _ => {}
        }
    }
    if log.killed() {
        return violations;
    }
    let mut unended: Vec<usize> = open.into_values().collect();
    unended.sort_unstable();
    for i in unended {
        let acquired = &log.events[i];
        let after = log.events[i + 1..]
            .iter()
            .filter(|e| {
                !e.synthetic && e.election == acquired.election && e.token == acquired.token
            })
            .cloned()
            .collect();
        violations.push(ShardViolation::Unended {
            node: log.name.clone(),
            acquired: acquired.clone(),
            after,
        });
    }
    violations
}

/// Whether the overlap `v` is the documented limit of a store that lost its data: a
/// restart fell between the two grants, and the first tenure ended within `ttl` of the
/// store answering again.
pub fn overlap_after_data_loss(
    v: &FencingViolation,
    data_loss: &[DataLoss],
    ttl: Duration,
) -> bool {
    let FencingViolation::Overlap { first, second } = v else {
        return false;
    };
    let ttl = ttl.as_nanos() as u64;
    data_loss.iter().any(|d| {
        first.start_ns <= d.lost_ns
            && d.lost_ns <= second.start_ns
            && first.end_ns <= d.back_ns.saturating_add(ttl)
    })
}

/// What [`check_shard_histories`] found.
#[derive(Debug, Clone)]
pub struct HistoryCheck {
    /// Every tenure, by shard and start.
    pub tenures: Vec<Tenure>,
    /// Violations (the run fails on any, and on any stale write accepted).
    pub violations: Vec<ShardViolation>,
    /// Overlaps allowed by a restart that emptied the store ([`overlap_after_data_loss`]).
    pub allowed_overlaps: Vec<ShardViolation>,
    /// Accepted writes whose token was stale ([`stale_writes_accepted`]).
    pub stale_writes_accepted: Vec<WriteRecord>,
    /// Accepted writes with a token a later grant had superseded, before the
    /// successor's first write ([`superseded_writes_before_successor`]): what fencing
    /// allows.
    pub late_writes: usize,
    /// The longest time a shard had no tenure, between its first grant and the end.
    pub max_leaderless_gap: Duration,
    /// That shard.
    pub max_gap_election: String,
    /// When that gap began (`mono_ns`).
    pub max_gap_from_ns: u64,
}

impl HistoryCheck {
    /// No violation and no stale write accepted.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.stale_writes_accepted.is_empty()
    }
}

/// Checks the histories of every shard in `logs` (one per `shards run` process) and the
/// resource's `writes`; see the module docs. Open tenures last until `now_ns`; the
/// leaderless gaps are measured over the grants up to `gap_until_ns` (before the final
/// drains, whose last node hands its shards to nobody). `data_loss` lists the restarts
/// that emptied the store.
pub fn check_shard_histories(
    logs: &[NodeLog],
    writes: &[WriteRecord],
    now_ns: u64,
    gap_until_ns: u64,
    data_loss: &[DataLoss],
    ttl: Duration,
) -> HistoryCheck {
    let events: Vec<Vec<Event>> = logs.iter().map(|l| tenure_events(&l.events)).collect();
    let all = tenures(&events, now_ns);
    let name = |i: usize| logs.get(i).map(|l| l.name.clone()).unwrap_or_default();
    let mut violations = Vec::new();
    let mut allowed_overlaps = Vec::new();
    for violation in check_fencing_at(&events, now_ns) {
        let nodes = match &violation {
            FencingViolation::Overlap { first, second } => vec![name(first.log), name(second.log)],
            FencingViolation::TokenNotIncreasing { earlier, later } => {
                vec![name(earlier.log), name(later.log)]
            }
            FencingViolation::MissingToken { tenure } => vec![name(tenure.log)],
        };
        let allowed = overlap_after_data_loss(&violation, data_loss, ttl);
        let v = ShardViolation::Fencing { violation, nodes };
        match allowed {
            true => allowed_overlaps.push(v),
            false => violations.push(v),
        }
    }
    for log in logs {
        violations.extend(grant_ends(log));
    }
    let mut by_election: BTreeMap<&str, Vec<Tenure>> = BTreeMap::new();
    for t in all.iter().filter(|t| t.start_ns <= gap_until_ns) {
        by_election
            .entry(t.election.as_str())
            .or_default()
            .push(t.clone());
    }
    let mut gap = (Duration::ZERO, String::new(), 0);
    for (election, ts) in &by_election {
        let (longest, from) = max_leaderless_gap(ts, gap_until_ns);
        if longest > gap.0 {
            gap = (longest, (*election).to_owned(), from);
        }
    }
    HistoryCheck {
        stale_writes_accepted: stale_writes_accepted(writes, &all),
        late_writes: superseded_writes_before_successor(writes, &all),
        tenures: all,
        violations,
        allowed_overlaps,
        max_leaderless_gap: gap.0,
        max_gap_election: gap.1,
        max_gap_from_ns: gap.2,
    }
}

/// What a shard chaos run found.
#[derive(Debug, Clone)]
pub struct ShardChaosReport {
    /// The store.
    pub backend: ChaosBackend,
    /// The seed (replay the schedule with the same options and this seed).
    pub seed: u64,
    /// How long the nemesis ran.
    pub duration: Duration,
    /// Nodes, shards, replication.
    pub nodes: usize,
    /// How many shards.
    pub shards: usize,
    /// The replication factor.
    pub replication: usize,
    /// The nodes' TTL.
    pub ttl: Duration,
    /// Faults injected, by kind.
    pub faults: BTreeMap<ShardFault, usize>,
    /// How many freezes lasted longer than the TTL.
    pub freezes_past_ttl: usize,
    /// One line per fault: when (seconds after the nodes started), what, on whom.
    pub fault_log: Vec<String>,
    /// Grants (`acquired` lines) in all.
    pub grants: usize,
    /// Shards that were granted at least once.
    pub shards_led: usize,
    /// The check of every shard's history.
    pub check: HistoryCheck,
    /// Writes the resource accepted.
    pub writes_accepted: usize,
    /// Writes the resource refused (stale tokens: fencing at work).
    pub writes_refused: usize,
    /// Nodes that exited without being told to (they were started again), with their
    /// exit status.
    pub exited_by_themselves: Vec<String>,
    /// `mono_ns` when the nodes were started: times in the report count from here.
    pub start_ns: u64,
    /// For every shard with a violation, its lines from every node in time order
    /// (seconds after the start, node, the line as JSON).
    pub timelines: Vec<String>,
    /// Each node process's name and the end of its stderr.
    pub stderr: Vec<(String, String)>,
}

impl ShardChaosReport {
    /// Whether the run found no violation and no stale write accepted.
    pub fn passed(&self) -> bool {
        self.check.passed()
    }

    /// Every violation and stale write accepted, one line each.
    pub fn violation_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .check
            .violations
            .iter()
            .map(|v| v.describe(self.start_ns))
            .collect();
        lines.extend(self.check.stale_writes_accepted.iter().map(|w| {
            format!(
                "stale write accepted on {}: token {} from {} at {} (highest before: {:?})",
                w.election,
                w.token,
                w.writer,
                secs_after(w.mono_ns, self.start_ns),
                w.highest_before
            )
        }));
        lines
    }
}

impl fmt::Display for ShardChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "shard chaos: backend {}, seed {}, {:.1} s of nemesis, {} nodes, {} shards, \
             replication {}, TTL {:?}",
            self.backend,
            self.seed,
            self.duration.as_secs_f64(),
            self.nodes,
            self.shards,
            self.replication,
            self.ttl
        )?;
        let total: usize = self.faults.values().sum();
        let kinds: Vec<String> = ShardFault::ALL
            .iter()
            .map(|k| format!("{k} {}", self.faults.get(k).copied().unwrap_or(0)))
            .collect();
        writeln!(
            f,
            "faults: {total} ({}; {} freezes past the TTL)",
            kinds.join(", "),
            self.freezes_past_ttl
        )?;
        let c = &self.check;
        writeln!(
            f,
            "grants: {} over {} of {} shards; largest leaderless gap: {:.2} s ({}, from {})",
            self.grants,
            self.shards_led,
            self.shards,
            c.max_leaderless_gap.as_secs_f64(),
            if c.max_gap_election.is_empty() {
                "-"
            } else {
                &c.max_gap_election
            },
            secs_after(c.max_gap_from_ns, self.start_ns)
        )?;
        writeln!(
            f,
            "writes: {} accepted, {} refused by fencing; late writes (a superseded token \
             accepted before the successor's first write, as fencing allows): {}",
            self.writes_accepted, self.writes_refused, c.late_writes
        )?;
        if !self.exited_by_themselves.is_empty() {
            writeln!(
                f,
                "nodes that exited by themselves (started again): {}",
                self.exited_by_themselves.join("; ")
            )?;
        }
        if self.backend.restart_loses_data() {
            writeln!(
                f,
                "overlaps allowed by a restart that emptied the store: {}",
                c.allowed_overlaps.len()
            )?;
            for v in &c.allowed_overlaps {
                writeln!(f, "  allowed: {}", v.describe(self.start_ns))?;
            }
        }
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &c.violations {
            *counts.entry(v.kind()).or_default() += 1;
        }
        if !c.stale_writes_accepted.is_empty() {
            counts.insert("stale_write_accepted", c.stale_writes_accepted.len());
        }
        let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let lines = self.violation_lines();
        write!(f, "violations: {} ({})", lines.len(), counts.join(", "))?;
        for line in lines {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// Runs the nodes, the nemesis and the check as `opts` says; see the module docs.
///
/// Errors are about the harness (a store that does not start, a node that cannot be
/// spawned, shards not all acquired within 30 s of the start); what the run found is
/// in the report.
pub async fn run_shard_chaos(opts: ShardChaosOptions) -> Result<ShardChaosReport> {
    opts.validate()?;
    if opts.verbose {
        eprintln!(
            "shard chaos: backend {}, seed {}, {:?} of nemesis, {} nodes, {} shards, \
             replication {}, TTL {:?}",
            opts.backend,
            opts.seed,
            opts.duration,
            opts.nodes,
            opts.shards,
            opts.replication,
            opts.ttl
        );
    }
    let resource = GuardedResource::start().await?;
    let server = start_store(opts.backend).await?;
    // Random names: a key prefix (a schema on PostgreSQL) and a namespace of the run's.
    let prefix = tenure_core::testing::random_prefix().replace('-', "_");
    let url = store_url(opts.backend, server.addr(), &prefix);
    let namespace = format!("shards-{}", prefix.trim_start_matches("t_"));
    let command = write_loop_command(resource.addr(), opts.write_every);
    let mut run = Run {
        rng: Rng(opts.seed),
        started: Instant::now(),
        start_ns: monotonic_now_ns(),
        resource,
        server,
        url,
        namespace,
        command,
        slots: Vec::new(),
        retired: Vec::new(),
        faults: BTreeMap::new(),
        fault_log: Vec::new(),
        freezes_past_ttl: 0,
        data_loss: Vec::new(),
        exited: Vec::new(),
        not_drained: Vec::new(),
        nemesis_time: Duration::ZERO,
        opts,
    };
    let mut outcome = Ok(());
    for slot in 0..run.opts.nodes {
        match run.spawn(slot) {
            Ok(node) => run.slots.push(node),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    if outcome.is_ok() {
        outcome = run.cold_start().await;
    }
    if outcome.is_ok() {
        outcome = run.nemesis().await;
    }
    // Whatever happened: everything resumed, a quiet time, every node drained.
    let gap_until_ns = run.quiet().await;
    run.drain_all().await;
    let logs = run.logs();
    outcome?;
    Ok(run.report(&logs, gap_until_ns))
}

/// A local store of `backend`; an external one is refused (the nemesis pauses and
/// restarts it).
async fn start_store(backend: ChaosBackend) -> Result<StoreServer> {
    let server: StoreServer = match backend {
        ChaosBackend::Etcd => EtcdServer::start().await?.into(),
        ChaosBackend::Redis => RedisServer::start().await?.into(),
        ChaosBackend::ZooKeeper => ZooKeeperServer::start().await?.into(),
        ChaosBackend::Postgres => PostgresServer::start().await?.into(),
        other => {
            return Err(HarnessError::Chaos {
                reason: format!("shard chaos has no store for {other}"),
            })
        }
    };
    if server.is_external() {
        return Err(HarnessError::Chaos {
            reason: format!(
                "shard chaos pauses and restarts the store, so it needs a local server: \
                 unset {}",
                server.env_var()
            ),
        });
    }
    Ok(server)
}

/// The nodes' URL of the store at `addr`, with keys under `prefix` (PostgreSQL: the
/// schema `prefix`) and 1 s connect and request timeouts.
fn store_url(backend: ChaosBackend, addr: std::net::SocketAddr, prefix: &str) -> String {
    let timeouts = "connect_timeout=1s&request_timeout=1s";
    match backend {
        ChaosBackend::Etcd => format!("etcd://{addr}?prefix={prefix}&{timeouts}"),
        ChaosBackend::Redis => format!("redis://{addr}?prefix={prefix}&{timeouts}"),
        ChaosBackend::ZooKeeper => format!("zk://{addr}/{prefix}?{timeouts}"),
        _ => format!(
            "postgres://{}@{addr}/{}?schema={prefix}&{timeouts}",
            PostgresServer::USER,
            PostgresServer::DATABASE
        ),
    }
}

/// One running shard chaos campaign.
struct Run {
    opts: ShardChaosOptions,
    rng: Rng,
    started: Instant,
    start_ns: u64,
    resource: GuardedResource,
    server: StoreServer,
    url: String,
    namespace: String,
    /// Each shard's command (for `bash -c`).
    command: String,
    /// The node in each slot now (slot i is node `n{i+1}`).
    slots: Vec<CandidateProcess>,
    /// Nodes that were killed, drained or exited, kept to read their output at the end.
    retired: Vec<CandidateProcess>,
    faults: BTreeMap<ShardFault, usize>,
    fault_log: Vec<String>,
    freezes_past_ttl: usize,
    data_loss: Vec<DataLoss>,
    exited: Vec<String>,
    not_drained: Vec<ShardViolation>,
    nemesis_time: Duration,
}

impl Run {
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn note(&mut self, kind: ShardFault, what: String) {
        *self.faults.entry(kind).or_default() += 1;
        let line = format!("[{:7.2} s] {kind}: {what}", self.at());
        if self.opts.verbose {
            eprintln!("shard chaos: {line}");
        }
        self.fault_log.push(line);
    }

    fn id(slot: usize) -> String {
        format!("n{}", slot + 1)
    }

    /// Starts node `n{slot+1}`.
    fn spawn(&self, slot: usize) -> Result<CandidateProcess> {
        let secs = |d: Duration| d.as_secs_f64().to_string();
        let args: Vec<String> = [
            "shards",
            "run",
            "--backend",
            &self.url,
            "--namespace",
            &self.namespace,
            "--shards",
            &self.opts.shards.to_string(),
            "--replication",
            &self.opts.replication.to_string(),
            "--id",
            &Self::id(slot),
            "--ttl",
            &secs(self.opts.ttl),
            "--connect-timeout",
            "1",
            "--grace",
            "1",
            "--",
            "bash",
            "-c",
            &self.command,
        ]
        .into_iter()
        .map(String::from)
        .collect();
        CandidateProcess::spawn(&self.opts.tenure_bin, &args, [("RUST_LOG", "warn")])
    }

    /// Starts a new node in `slot` (same id), keeping the old process to read.
    fn respawn(&mut self, slot: usize) -> Result<()> {
        let fresh = self.spawn(slot)?;
        let old = std::mem::replace(&mut self.slots[slot], fresh);
        self.retired.push(old);
        Ok(())
    }

    /// Nodes that exited without being told to are started again.
    fn reap_exited(&mut self) -> Result<()> {
        for slot in 0..self.slots.len() {
            if let Some(status) = self.slots[slot].try_exit_status() {
                let what = format!(
                    "{} exited by itself at {:.2} s ({status})",
                    self.slots[slot].label(),
                    self.at()
                );
                if self.opts.verbose {
                    eprintln!(
                        "shard chaos: {what}; stderr:\n{}",
                        self.slots[slot].stderr_tail()
                    );
                }
                self.exited.push(what);
                self.respawn(slot)?;
            }
        }
        Ok(())
    }

    /// Waits until every shard has been acquired by some node.
    async fn cold_start(&mut self) -> Result<()> {
        let deadline = Instant::now() + COLD_START;
        loop {
            let led: BTreeSet<String> = self
                .slots
                .iter()
                .flat_map(|n| n.events())
                .filter(|e| e.is(ACQUIRED))
                .map(|e| e.election)
                .collect();
            if led.len() >= self.opts.shards {
                if self.opts.verbose {
                    eprintln!("shard chaos: [{:7.2} s] every shard acquired", self.at());
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                let tails: Vec<String> = self
                    .slots
                    .iter()
                    .map(|n| format!("{}: {}", n.label(), n.stderr_tail()))
                    .collect();
                return Err(HarnessError::Chaos {
                    reason: format!(
                        "cold start: {} of {} shards acquired within {COLD_START:?}; \
                         stderr:\n{}",
                        led.len(),
                        self.opts.shards,
                        tails.join("\n")
                    ),
                });
            }
            self.reap_exited()?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn nemesis(&mut self) -> Result<()> {
        let ttl = self.opts.ttl;
        let began = Instant::now();
        let deadline = began + self.opts.duration;
        let mut round: Vec<ShardFault> = Vec::new();
        let mut rounds = 0;
        loop {
            let quiet = self.rng.between(ttl / 4, ttl);
            tokio::time::sleep(quiet).await;
            let first_round_done = rounds > 1 || (rounds == 1 && round.is_empty());
            if Instant::now() >= deadline && first_round_done {
                break;
            }
            if round.is_empty() {
                rounds += 1;
                round = ShardFault::ALL.to_vec();
                self.rng.shuffle(&mut round);
            }
            self.reap_exited()?;
            if let Some(kind) = round.pop() {
                self.inject(kind).await?;
            }
        }
        self.nemesis_time = began.elapsed();
        Ok(())
    }

    async fn inject(&mut self, kind: ShardFault) -> Result<()> {
        let ttl = self.opts.ttl;
        let slot = self.rng.below(self.slots.len());
        let label = self.slots[slot].label().to_owned();
        match kind {
            ShardFault::KillNode => {
                let down = self.rng.between(Duration::ZERO, ttl);
                self.slots[slot].kill().await?;
                self.note(
                    kind,
                    format!("SIGKILL {label}, started again after {down:?}"),
                );
                tokio::time::sleep(down).await;
                self.respawn(slot)?;
            }
            ShardFault::FreezeNode | ShardFault::StallNode => {
                let pause = match kind {
                    ShardFault::FreezeNode => self.rng.between(ttl * 5 / 4, ttl * 5 / 2),
                    _ => self.rng.between(ttl / 5, ttl * 3 / 5),
                };
                self.slots[slot].pause()?;
                if pause > ttl {
                    self.freezes_past_ttl += 1;
                }
                self.note(kind, format!("SIGSTOP {label} for {pause:?}"));
                tokio::time::sleep(pause).await;
                self.slots[slot].resume()?;
            }
            ShardFault::DrainNode => {
                let down = self.rng.between(Duration::ZERO, ttl);
                self.note(
                    kind,
                    format!("SIGTERM {label}, started again after {down:?}"),
                );
                let took = Instant::now();
                self.drain(slot).await;
                if self.opts.verbose {
                    eprintln!(
                        "shard chaos: [{:7.2} s]   {label} exited after {:.2?}",
                        self.at(),
                        took.elapsed()
                    );
                }
                tokio::time::sleep(down).await;
                self.respawn(slot)?;
            }
            ShardFault::PauseStore => {
                let pause = self.rng.between(ttl * 2 / 3 + ttl / 4, ttl * 2);
                self.server.pause()?;
                self.note(kind, format!("SIGSTOP the store for {pause:?}"));
                tokio::time::sleep(pause).await;
                self.server.resume()?;
            }
            ShardFault::RestartStore => {
                let down = self.rng.between(Duration::ZERO, ttl * 3 / 2);
                self.server.kill().await?;
                let lost_ns = monotonic_now_ns();
                self.note(kind, format!("SIGKILL the store, restart after {down:?}"));
                tokio::time::sleep(down).await;
                self.server.restart().await?;
                if self.opts.backend.restart_loses_data() {
                    let back_ns = monotonic_now_ns();
                    self.data_loss.push(DataLoss { lost_ns, back_ns });
                }
            }
        }
        Ok(())
    }

    /// SIGTERM the node in `slot` and check that it drained: exit 0 within
    /// [`TERMINATE_TIMEOUT`](crate::TERMINATE_TIMEOUT) (else it is killed), `drained`
    /// its last line.
    async fn drain(&mut self, slot: usize) {
        let node = &mut self.slots[slot];
        let why = match node.terminate().await {
            Err(e) => Some(e.to_string()),
            Ok(status) => {
                // The reader sees the end of the output shortly after the exit.
                let _ = node
                    .wait_for_kind(Event::EXITED, Duration::from_secs(2))
                    .await;
                drain_failure(status, &node.events())
            }
        };
        if let Some(why) = why {
            let node = self.slots[slot].label().to_owned();
            if self.opts.verbose {
                eprintln!("shard chaos: {node} did not drain: {why}");
            }
            self.not_drained
                .push(ShardViolation::NotDrained { node, why });
        }
    }

    /// Resumes everything, lets the nodes settle for 2 TTL; returns the end of that
    /// quiet time (`mono_ns`).
    async fn quiet(&mut self) -> u64 {
        let _ = self.server.resume();
        for node in &self.slots {
            let _ = node.resume();
        }
        tokio::time::sleep(self.opts.ttl * 2).await;
        if let Err(e) = self.reap_exited() {
            eprintln!("shard chaos: restarting a node that exited: {e}");
        }
        monotonic_now_ns()
    }

    /// Drains every node, one after the other (the last hands its shards to nobody).
    async fn drain_all(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].try_exit_status().is_some() {
                continue;
            }
            self.drain(slot).await;
        }
    }

    /// Every process's output, the retired ones first.
    fn logs(&self) -> Vec<NodeLog> {
        self.retired
            .iter()
            .chain(&self.slots)
            .map(|n| NodeLog {
                name: short_name(n.label()),
                events: n.events(),
                stderr_tail: n.stderr_tail(),
            })
            .collect()
    }

    fn report(&self, logs: &[NodeLog], gap_until_ns: u64) -> ShardChaosReport {
        let writes = self.resource.writes();
        let now_ns = monotonic_now_ns();
        let mut check = check_shard_histories(
            logs,
            &writes,
            now_ns,
            gap_until_ns,
            &self.data_loss,
            self.opts.ttl,
        );
        check.violations.extend(self.not_drained.iter().cloned());
        let grants = check.tenures.len();
        let shards_led = check
            .tenures
            .iter()
            .map(|t| t.election.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        let timelines = timelines(logs, &check.violations, self.start_ns);
        ShardChaosReport {
            backend: self.opts.backend,
            seed: self.opts.seed,
            duration: self.nemesis_time,
            nodes: self.opts.nodes,
            shards: self.opts.shards,
            replication: self.opts.replication,
            ttl: self.opts.ttl,
            faults: self.faults.clone(),
            freezes_past_ttl: self.freezes_past_ttl,
            fault_log: self.fault_log.clone(),
            grants,
            shards_led,
            writes_accepted: writes.iter().filter(|w| w.accepted).count(),
            writes_refused: writes.iter().filter(|w| !w.accepted).count(),
            check,
            exited_by_themselves: self.exited.clone(),
            start_ns: self.start_ns,
            timelines,
            stderr: logs
                .iter()
                .map(|l| (l.name.clone(), l.stderr_tail.clone()))
                .collect(),
        }
    }
}

/// Why a node that exited with `status` after SIGTERM, having printed `events`, did not
/// drain; `None` if it did.
fn drain_failure(status: ExitStatus, events: &[Event]) -> Option<String> {
    if !status.success() {
        return Some(format!("it exited with {status}"));
    }
    let last = events.iter().rev().find(|e| !e.synthetic);
    match last {
        Some(e) if e.is(DRAINED) => None,
        Some(e) => Some(format!("it exited 0, but its last line was {}", line(e))),
        None => Some("it exited 0 without a line".into()),
    }
}

/// `n2 (pid 4711)` from the label `tenure --id n2 (pid 4711)`.
fn short_name(label: &str) -> String {
    match label.split_once("--id ") {
        Some((_, rest)) => rest.to_owned(),
        None => label.to_owned(),
    }
}

/// For every shard with a violation, its lines from every node in time order, and the
/// harness's kill of a node that printed some of them.
fn timelines(logs: &[NodeLog], violations: &[ShardViolation], start_ns: u64) -> Vec<String> {
    let elections: BTreeSet<&str> = violations.iter().filter_map(|v| v.election()).collect();
    let mut out = Vec::new();
    for election in elections {
        let mut lines: Vec<(u64, String)> = Vec::new();
        for log in logs {
            let mine: Vec<&Event> = log
                .events
                .iter()
                .filter(|e| !e.synthetic && e.election == election)
                .filter(|e| {
                    [ACQUIRED, HANDING_OFF, HANDED_OFF, Event::LOST].contains(&e.kind.as_str())
                })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let kills = log
                .events
                .iter()
                .filter(|e| e.synthetic && e.is(Event::KILLED));
            for e in mine.into_iter().chain(kills) {
                let what = if e.synthetic {
                    "SIGKILLed by the harness".to_owned()
                } else {
                    line(e)
                };
                lines.push((
                    e.mono_ns,
                    format!(
                        "[{:>9}] {}: {what}",
                        secs_after(e.mono_ns, start_ns),
                        log.name
                    ),
                ));
            }
        }
        lines.sort();
        out.push(format!("{election}:"));
        out.extend(lines.into_iter().map(|(_, l)| format!("  {l}")));
    }
    out
}

/// A bounded run as the test suite makes one, and its checks: `duration` of nemesis
/// (completing its first round) with `seed`, or a seed from the clock when `None`;
/// [`SECS_VAR`] and [`SEED_VAR`] override them (a soak, a replay). Runs one at a time
/// in a process. Panics with the report, the fault log and the lines of every shard
/// with a violation when the run found any; when the store or a node could not be
/// started (a missing program fails, never skips); on fewer grants than shards; and
/// when a fault kind was never injected.
pub async fn assert_shard_chaos(
    backend: ChaosBackend,
    tenure_bin: impl Into<PathBuf>,
    duration: Duration,
    seed: Option<u64>,
) {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    let mut opts = ShardChaosOptions::new(backend, tenure_bin);
    opts.duration = duration;
    if let Some(seed) = seed {
        opts.seed = seed;
    }
    if let Err(e) = overrides(&mut opts) {
        panic!("{e}");
    }
    let report = match run_shard_chaos(opts).await {
        Ok(report) => report,
        Err(e) => panic!("shard chaos run on {backend}: {e}"),
    };
    eprintln!("{report}");
    eprintln!("faults:\n{}", report.fault_log.join("\n"));
    if !report.passed() {
        eprintln!(
            "lines of the shards with a violation:\n{}",
            report.timelines.join("\n")
        );
        for (node, tail) in &report.stderr {
            if !tail.is_empty() {
                eprintln!("--- stderr of {node}:\n{tail}");
            }
        }
        let lines = report.violation_lines();
        panic!(
            "shard chaos on {backend} (seed {}): {} violations (the report, the fault log \
             and the lines of each shard concerned are above); the first:\n  {}",
            report.seed,
            lines.len(),
            lines
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    assert!(
        report.grants >= report.shards,
        "fewer grants than shards:\n{report}"
    );
    for kind in ShardFault::ALL {
        assert!(
            report.faults.get(&kind).copied().unwrap_or(0) > 0,
            "{kind} was never injected:\n{report}"
        );
    }
}

/// Applies [`SECS_VAR`] and [`SEED_VAR`] to `opts`.
fn overrides(opts: &mut ShardChaosOptions) -> Result<()> {
    let var = |name: &'static str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let bad =
        |variable: &'static str, value: String, reason: String| HarnessError::BadEnvironment {
            variable,
            value,
            reason,
        };
    if let Some(d) = var(SECS_VAR) {
        opts.duration = parse_duration(&d).map_err(|e| bad(SECS_VAR, d.clone(), e.to_string()))?;
    }
    if let Some(s) = var(SEED_VAR) {
        opts.seed = s
            .trim()
            .parse()
            .map_err(|e| bad(SEED_VAR, s.clone(), format!("not a number: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::TenureEnd;

    const E0: &str = "ns/0000";
    const E1: &str = "ns/0001";
    const E2: &str = "ns/0002";

    fn ev(kind: &str, election: &str, id: &str, token: u64, at: u64) -> Event {
        Event::new(kind, election, id, Some(token), at)
    }

    fn harness(kind: &str, at: u64) -> Event {
        Event {
            synthetic: true,
            ..Event::new(kind, "", "", None, at)
        }
    }

    fn log(name: &str, events: Vec<Event>) -> NodeLog {
        NodeLog {
            name: name.into(),
            events,
            stderr_tail: String::new(),
        }
    }

    fn write(election: &str, token: u64, writer: &str, accepted: bool, at: u64) -> WriteRecord {
        WriteRecord {
            election: election.into(),
            token,
            writer: writer.into(),
            accepted,
            highest_before: None,
            mono_ns: at,
        }
    }

    fn kinds(check: &HistoryCheck) -> Vec<(&'static str, Option<String>)> {
        check
            .violations
            .iter()
            .map(|v| (v.kind(), v.election().map(String::from)))
            .collect()
    }

    /// A healthy run: handoffs and a loss, each grant ended once, tokens increasing.
    fn clean() -> Vec<NodeLog> {
        vec![
            log(
                "n1 (pid 1)",
                vec![
                    ev(ACQUIRED, E0, "n1", 5, 10),
                    ev("command_started", E0, "n1", 5, 11),
                    ev(HANDING_OFF, E0, "n1", 5, 40),
                    ev("command_exited", E0, "n1", 5, 45),
                    ev(HANDED_OFF, E0, "n1", 5, 48),
                    ev(ACQUIRED, E1, "n1", 6, 12),
                    ev(Event::LOST, E1, "n1", 6, 70),
                    Event::new(DRAINED, "", "n1", None, 200),
                    harness(Event::EXITED, 201),
                ],
            ),
            log(
                "n2 (pid 2)",
                vec![
                    ev(ACQUIRED, E0, "n2", 9, 50),
                    ev(ACQUIRED, E1, "n2", 11, 80),
                    ev(HANDED_OFF, E0, "n2", 9, 150),
                    ev(HANDED_OFF, E1, "n2", 11, 150),
                    Event::new(DRAINED, "", "n2", None, 160),
                    harness(Event::EXITED, 161),
                ],
            ),
        ]
    }

    #[test]
    fn a_clean_history_passes_and_is_measured() {
        let writes = [
            write(E0, 5, "n1", true, 20),
            write(E0, 9, "n2", true, 60),
            write(E0, 5, "n1", false, 61),
        ];
        let check = check_shard_histories(&clean(), &writes, 300, 140, &[], Duration::ZERO);
        assert!(check.passed(), "{:?}", kinds(&check));
        assert_eq!(check.tenures.len(), 4);
        // E1: n1 lost at 70, n2 acquired at 80: the longest gap, 10 ns from 70.
        assert_eq!(check.max_leaderless_gap, Duration::from_nanos(10));
        assert_eq!(
            (check.max_gap_election.as_str(), check.max_gap_from_ns),
            (E1, 70)
        );
        assert_eq!(check.late_writes, 0);
    }

    #[test]
    fn the_mapping_keeps_only_what_starts_or_ends_a_tenure() {
        let mapped = tenure_events(&clean()[0].events);
        let kinds: Vec<&str> = mapped.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["elected", "resigned", "elected", "lost", "exited"]);
    }

    /// A hand-made broken history: every fault the check exists for is reported.
    #[test]
    fn a_broken_history_is_caught() {
        let logs = vec![
            log(
                "n1 (pid 1)",
                vec![
                    // Overlap: n1 reports E0 until 60 (a lost line stamped late), n2
                    // acquired it at 30.
                    ev(ACQUIRED, E0, "n1", 5, 10),
                    ev(Event::LOST, E0, "n1", 5, 60),
                    // Out of order: n1 acquired E1 with token 8 after n2's 9 ended.
                    ev(ACQUIRED, E1, "n1", 8, 40),
                    ev(HANDED_OFF, E1, "n1", 8, 45),
                    // Acquired, handing off, and nothing more, although the node
                    // drained and exited (it was not killed).
                    ev(ACQUIRED, E2, "n1", 3, 70),
                    ev(HANDING_OFF, E2, "n1", 3, 75),
                    // An end for a token this node was never granted, a second end
                    // for one grant, and a handing_off line after the end.
                    ev(Event::LOST, E0, "n1", 4, 80),
                    ev(HANDED_OFF, E1, "n1", 8, 85),
                    ev(HANDING_OFF, E1, "n1", 8, 86),
                    Event::new(DRAINED, "", "n1", None, 100),
                    harness(Event::EXITED, 101),
                ],
            ),
            log(
                "n2 (pid 2)",
                vec![
                    ev(ACQUIRED, E0, "n2", 7, 30),
                    ev(HANDED_OFF, E0, "n2", 7, 90),
                    ev(ACQUIRED, E1, "n2", 9, 20),
                    ev(Event::LOST, E1, "n2", 9, 35),
                    harness(Event::EXITED, 120),
                ],
            ),
        ];
        // A write with n2's token by n1: no resource could fence that.
        let writes = [write(E0, 7, "n1", true, 50)];
        let check = check_shard_histories(&logs, &writes, 200, 200, &[], Duration::ZERO);
        assert!(!check.passed());
        let found = kinds(&check);
        for want in [
            ("overlap", Some(E0.to_owned())),
            ("token_not_increasing", Some(E1.to_owned())),
            ("unended", Some(E2.to_owned())),
            ("unmatched_end", Some(E0.to_owned())),
            ("unmatched_end", Some(E1.to_owned())),
            ("out_of_order", Some(E1.to_owned())),
        ] {
            assert!(found.contains(&want), "{want:?} not in {found:?}");
        }
        assert_eq!(found.len(), 6, "{found:?}");
        assert_eq!(check.stale_writes_accepted.len(), 1);
        let lines: Vec<String> = check.violations.iter().map(|v| v.describe(0)).collect();
        let unended = lines.iter().find(|l| l.starts_with("acquired with no end"));
        let unended = unended.expect("an unended line");
        assert!(unended.contains("\"event\":\"acquired\""), "{unended}");
        assert!(unended.contains("handing_off"), "{unended}");
        let overlap = lines
            .iter()
            .find(|l| l.starts_with("overlap"))
            .expect("overlap");
        assert!(overlap.contains("n1 (pid 1) token 5") && overlap.contains("n2 (pid 2) token 7"));
        // The report shows the shards' lines around the violations.
        let shown = timelines(&logs, &check.violations, 0);
        assert!(shown.iter().any(|l| l == "ns/0002:"), "{shown:?}");
    }

    #[test]
    fn a_killed_node_s_open_grants_end_at_the_kill() {
        let logs = vec![
            log(
                "n1 (pid 1)",
                vec![
                    ev(ACQUIRED, E0, "n1", 5, 10),
                    harness(Event::KILLED, 50),
                    harness(Event::EXITED, 51),
                ],
            ),
            log("n1 (pid 3)", vec![ev(ACQUIRED, E0, "n1", 7, 60)]),
        ];
        let check = check_shard_histories(&logs, &[], 100, 100, &[], Duration::ZERO);
        // The second process is still running: its open grant lasts until now, and
        // it never ended, so it is reported; the killed one is not.
        assert_eq!(kinds(&check), [("unended", Some(E0.to_owned()))]);
        let first = &check.tenures[0];
        assert_eq!((first.end, first.end_ns), (TenureEnd::Killed, 50));
        // Had the kill come after the successor's grant, the tenures would overlap.
        let mut late = logs.clone();
        late[0].events[1].mono_ns = 65;
        late[0].events[2].mono_ns = 66;
        let check = check_shard_histories(&late, &[], 100, 100, &[], Duration::ZERO);
        assert!(kinds(&check).contains(&("overlap", Some(E0.to_owned()))));
    }

    #[test]
    fn only_an_overlap_across_a_restart_that_emptied_the_store_is_allowed() {
        let logs = |first_end: u64| {
            vec![
                log(
                    "n1 (pid 1)",
                    vec![
                        ev(ACQUIRED, E0, "n1", 5, 10),
                        ev(Event::LOST, E0, "n1", 5, first_end),
                    ],
                ),
                log(
                    "n2 (pid 2)",
                    vec![
                        ev(ACQUIRED, E0, "n2", 7, 60),
                        ev(HANDED_OFF, E0, "n2", 7, 200),
                    ],
                ),
            ]
        };
        let loss = [DataLoss {
            lost_ns: 40,
            back_ns: 50,
        }];
        let ttl = Duration::from_nanos(30);
        // Ended within a TTL of the store's return: allowed.
        let check = check_shard_histories(&logs(70), &[], 300, 300, &loss, ttl);
        assert!(check.passed(), "{:?}", kinds(&check));
        assert_eq!(check.allowed_overlaps.len(), 1);
        // Ended later than that, or no restart in between: a violation.
        let check = check_shard_histories(&logs(90), &[], 300, 300, &loss, ttl);
        assert_eq!(kinds(&check), [("overlap", Some(E0.to_owned()))]);
        let check = check_shard_histories(&logs(70), &[], 300, 300, &[], ttl);
        assert_eq!(kinds(&check), [("overlap", Some(E0.to_owned()))]);
    }

    #[test]
    fn a_drain_needs_exit_0_and_drained_last() {
        use std::os::unix::process::ExitStatusExt;
        let ok = ExitStatus::from_raw(0);
        let drained = [
            ev(HANDED_OFF, E0, "n1", 5, 10),
            Event::new(DRAINED, "", "n1", None, 11),
            harness(Event::EXITED, 12),
        ];
        assert_eq!(drain_failure(ok, &drained), None);
        assert!(drain_failure(ExitStatus::from_raw(256), &drained).is_some());
        let cut = &drained[..1];
        let why = drain_failure(ok, cut).expect("not drained");
        assert!(why.contains("handed_off"), "{why}");
    }

    #[test]
    fn options_are_checked() {
        let mut o = ShardChaosOptions::new(ChaosBackend::Redis, "tenure");
        assert!(o.validate().is_ok());
        o.replication = 6;
        assert!(o.validate().is_err());
        let p = ShardChaosOptions::new(ChaosBackend::Peer, "tenure");
        assert!(p.validate().is_err());
        assert_eq!(short_name("tenure --id n3 (pid 7)"), "n3 (pid 7)");
        let url = store_url(
            ChaosBackend::Postgres,
            "127.0.0.1:5".parse().unwrap(),
            "t_ab",
        );
        assert!(url.contains("schema=t_ab"), "{url}");
    }

    #[test]
    fn the_schedule_follows_from_the_seed() {
        let draw = |seed| {
            let mut rng = Rng(seed);
            let mut kinds = ShardFault::ALL.to_vec();
            rng.shuffle(&mut kinds);
            kinds
        };
        assert_eq!(draw(7), draw(7));
        let mut sorted = draw(7);
        sorted.sort();
        assert_eq!(sorted, ShardFault::ALL);
    }
}
