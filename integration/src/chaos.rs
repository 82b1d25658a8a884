//! Chaos: a seeded, randomized fault campaign against real candidate processes, and the
//! safety checker that reads everything they and a fenced resource saw.
//!
//! [`run_chaos`] starts a store (or, for `peer://`, a cluster of nodes whose every link
//! goes through its own [`TcpProxy`]) and K `tenure campaign` processes whose command
//! writes its `TENURE_TOKEN` to a [`GuardedResource`], then injects one fault at a time
//! with quiet gaps until the duration is up. Every round is a shuffle of every
//! [`FaultKind`] of the backend; every random choice comes from one seed, printed first,
//! so a seed replays the schedule (not the processes' timing).
//!
//! [`ChaosReport`] gives the faults, the grants, the longest leaderless gap and the
//! **violations**: overlapping tenures, tokens that do not increase, grants without a
//! token, and stale writes the resource accepted. Three documented store limits allow
//! overlaps (never stale writes): a Redis restart without persistence; an Azurite
//! restart, which forgets active leases (it is restarted the orderly way, SIGTERM, as it
//! saves its state only every 5 s); and an etcd raft leader that, paused past the TTL,
//! revokes leases as it resumes (an overlap whose first tenure ended as revoked within a
//! TTL after the resume, the successor granted after it). Azure runs with 15 s leases,
//! so a bounded run there is one round ([`ChaosOptions::rounds`]).

use crate::StoreServer;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::candidate::{CandidateProcess, Event};
use crate::cli_faults::campaign_args;
use crate::error::{HarnessError, Result};
use crate::fencing::{check_fencing_at, tenures, FencingViolation, GuardedResource, Tenure};
use crate::fencing::{write_loop_command, TenureEnd, WriteRecord};
use crate::os::{free_port, loopback, monotonic_now_ns};
use crate::proxy::TcpProxy;
use crate::server::{
    AzuriteServer, EtcdCluster, EtcdServer, Members, PostgresServer, RedisSentinels, RedisServer,
    ZooKeeperEnsemble, ZooKeeperServer,
};

/// The election every candidate of a chaos run campaigns in.
pub const CHAOS_ELECTION: &str = "chaos/seat";

/// How long a leader's command runs before it exits by itself (and its candidate
/// resigns and campaigns again). This also bounds how long the write loop of a
/// SIGKILLed candidate, which keeps writing with its stale token, outlives it.
const COMMAND_LIFETIME: Duration = Duration::from_secs(20);

/// The peer cluster's quorum lease; the candidates' TTL must not exceed it.
const PEER_LEASE: Duration = Duration::from_millis(1500);

/// Azure grants blob leases of 15 to 60 s.
const AZURE_MIN_LEASE: Duration = Duration::from_secs(15);
const AZURE_MAX_LEASE: Duration = Duration::from_secs(60);

/// The backends a chaos run can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosBackend {
    /// A local etcd (`etcd://`), each candidate through its own proxy.
    Etcd,
    /// A local Redis without persistence (`redis://`), each candidate through its own
    /// proxy.
    Redis,
    /// A local ZooKeeper (`zk://`), each candidate through its own proxy.
    ZooKeeper,
    /// A `peer://` cluster of the candidates themselves (bully with the quorum guard),
    /// every link through its own proxy.
    Peer,
    /// A local Azurite (`azblob://`, Azure Blob leases), each candidate through its own
    /// proxy.
    Azure,
    /// A local PostgreSQL (`postgres://`), each candidate through its own proxy.
    Postgres,
    /// A 3-member etcd cluster; the candidates name every member. Member faults.
    EtcdCluster,
    /// A 3-server ZooKeeper ensemble; the candidates name every server. Member faults.
    ZooKeeperEnsemble,
    /// Redis with two replicas under three sentinels (`redis+sentinel://`, replication
    /// guard of one replica). Data node faults.
    RedisSentinel,
}

impl ChaosBackend {
    /// Every backend, in the order the docs list them.
    pub const ALL: [ChaosBackend; 6] = [
        ChaosBackend::Etcd,
        ChaosBackend::Redis,
        ChaosBackend::ZooKeeper,
        ChaosBackend::Peer,
        ChaosBackend::Azure,
        ChaosBackend::Postgres,
    ];

    /// The clustered stores, whose runs inject faults into single members.
    pub const CLUSTERS: [ChaosBackend; 3] = [
        ChaosBackend::EtcdCluster,
        ChaosBackend::ZooKeeperEnsemble,
        ChaosBackend::RedisSentinel,
    ];

    /// The name used on the command line: `etcd`, `redis`, `zookeeper`, `peer`,
    /// `azure`, `postgres`, `etcd-cluster`, `zookeeper-ensemble`, `redis-sentinel`.
    pub fn name(self) -> &'static str {
        match self {
            ChaosBackend::Etcd => "etcd",
            ChaosBackend::Redis => "redis",
            ChaosBackend::ZooKeeper => "zookeeper",
            ChaosBackend::Peer => "peer",
            ChaosBackend::Azure => "azure",
            ChaosBackend::Postgres => "postgres",
            ChaosBackend::EtcdCluster => "etcd-cluster",
            ChaosBackend::ZooKeeperEnsemble => "zookeeper-ensemble",
            ChaosBackend::RedisSentinel => "redis-sentinel",
        }
    }

    /// Whether the store is a cluster whose members the run stops and restarts one
    /// at a time (the candidates then reach the members directly, not through proxies).
    pub fn is_cluster(self) -> bool {
        Self::CLUSTERS.contains(&self)
    }

    /// The fault kinds that apply to this backend.
    pub fn faults(self) -> &'static [FaultKind] {
        use FaultKind::*;
        match self {
            ChaosBackend::Peer => &[KillHolder, StopHolder, Partition, CutLink, Blackhole],
            ChaosBackend::EtcdCluster | ChaosBackend::ZooKeeperEnsemble => {
                &[KillHolder, StopHolder, StopMember, RestartMember]
            }
            // A killed Redis without persistence comes back empty: that is the restart
            // limit of the single-server runs, not a member fault Sentinel can mend.
            ChaosBackend::RedisSentinel => &[KillHolder, StopHolder, StopMember],
            _ => &[
                KillHolder,
                StopHolder,
                StopServer,
                RestartServer,
                Cut,
                Blackhole,
            ],
        }
    }

    /// Why a restart of this backend's server loses the seats, if it does (a documented
    /// limit that allows overlaps across the restart; see the module docs).
    pub fn restart_data_loss(self) -> Option<&'static str> {
        match self {
            ChaosBackend::Redis => Some("Redis without persistence starts empty"),
            ChaosBackend::Azure => Some("Azurite forgets its active leases when it restarts"),
            _ => None,
        }
    }

    /// Why this store's leader member, resumed from a pause past the TTL, can delete a
    /// seat a healthy member kept alive (etcd issue 15247; see the module docs).
    pub fn leader_resume_revokes(self) -> Option<&'static str> {
        match self {
            ChaosBackend::EtcdCluster => {
                Some("etcd's raft leader, paused past the TTL, can revoke leases when it resumes")
            }
            _ => None,
        }
    }

    /// Whether a server restart loses the seats ([`restart_data_loss`](Self::restart_data_loss)).
    pub fn restart_loses_data(self) -> bool {
        self.restart_data_loss().is_some()
    }

    /// The session TTL the candidates use unless told otherwise: 2 s for the stores
    /// (the shortest ZooKeeper session at tickTime 1000 ms), 1 s for the peer cluster
    /// (within its 1.5 s quorum lease), 15 s for Azure (the shortest blob lease).
    pub fn default_ttl(self) -> Duration {
        match self {
            ChaosBackend::Peer => Duration::from_secs(1),
            ChaosBackend::Azure => AZURE_MIN_LEASE,
            // A member's failure must fit in the renew deadline with a margin, as in the
            // cluster tests: 5 s.
            ChaosBackend::EtcdCluster
            | ChaosBackend::ZooKeeperEnsemble
            | ChaosBackend::RedisSentinel => Duration::from_secs(5),
            _ => Duration::from_secs(2),
        }
    }

    /// How long a candidate may take to connect (`--connect-timeout`).
    fn connect_timeout(self) -> Duration {
        match self {
            ChaosBackend::Azure => Duration::from_secs(2),
            _ => Duration::from_secs(1),
        }
    }
}

impl fmt::Display for ChaosBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChaosBackend {
    type Err = HarnessError;

    fn from_str(s: &str) -> Result<Self> {
        let given = s.trim().to_ascii_lowercase();
        let name = match given.as_str() {
            "zk" => "zookeeper",
            "azblob" => "azure",
            "zk-ensemble" => "zookeeper-ensemble",
            other => other,
        };
        let every = || Self::ALL.into_iter().chain(Self::CLUSTERS);
        every().find(|b| b.name() == name).ok_or_else(|| {
            let known: Vec<&str> = every().map(Self::name).collect();
            HarnessError::Chaos {
                reason: format!("unknown backend {given:?} (known: {})", known.join(", ")),
            }
        })
    }
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL the holder (its command keeps writing with its stale token); a new
    /// candidate takes its place.
    KillHolder,
    /// SIGSTOP the holder for longer than its TTL, then SIGCONT.
    StopHolder,
    /// SIGSTOP the store for longer than the renew deadline, then SIGCONT.
    StopServer,
    /// Kill the store and start it again on the same port and data directory (Redis:
    /// without persistence, so empty) after up to a TTL and a half.
    RestartServer,
    /// Close one candidate's connections to the store and refuse new ones for a while.
    Cut,
    /// Silently drop one candidate's traffic (store) or all of one node's links (peer)
    /// for a while.
    Blackhole,
    /// Peer: cut every link of one node (it is alone against the majority).
    Partition,
    /// Peer: cut the link between two nodes, both ways (each still reaches the third).
    CutLink,
    /// Cluster: SIGSTOP one member (the store's leader or primary half of the time)
    /// for longer than the renew deadline, then SIGCONT.
    StopMember,
    /// Cluster: SIGKILL one member (the leader half of the time) and start it again
    /// after up to a TTL and a half.
    RestartMember,
}

impl FaultKind {
    /// The name in reports: `kill_holder`, `stop_holder`, …
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillHolder => "kill_holder",
            FaultKind::StopHolder => "stop_holder",
            FaultKind::StopServer => "stop_server",
            FaultKind::RestartServer => "restart_server",
            FaultKind::Cut => "cut",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Partition => "partition",
            FaultKind::CutLink => "cut_link",
            FaultKind::StopMember => "stop_member",
            FaultKind::RestartMember => "restart_member",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a chaos run does; [`ChaosOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The backend.
    pub backend: ChaosBackend,
    /// How long faults are injected (the run takes a few seconds more to start and to
    /// stop). Default 60 s.
    pub duration: Duration,
    /// End the run after this many complete rounds (each round injects every fault
    /// kind of the backend once, in random order), or at `duration`, whichever comes
    /// first. Default `None`: only `duration` ends the run.
    pub rounds: Option<usize>,
    /// How many candidate processes campaign at a time (peer: the cluster size).
    /// Default 3.
    pub candidates: usize,
    /// The seed of every random choice. Default: from the clock.
    pub seed: u64,
    /// The candidates' session TTL. Default [`ChaosBackend::default_ttl`].
    pub ttl: Duration,
    /// How often a leader's command writes its token. Default 100 ms.
    pub write_every: Duration,
    /// The `tenure` binary the candidates run.
    pub tenure_bin: PathBuf,
    /// Print each fault to stderr as it is injected. Default true.
    pub verbose: bool,
}

impl ChaosOptions {
    /// Defaults for `backend`, running `tenure_bin`, with a seed from the clock.
    pub fn new(backend: ChaosBackend, tenure_bin: impl Into<PathBuf>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id());
        ChaosOptions {
            backend,
            duration: Duration::from_secs(60),
            rounds: None,
            candidates: 3,
            seed,
            ttl: backend.default_ttl(),
            write_every: Duration::from_millis(100),
            tenure_bin: tenure_bin.into(),
            verbose: true,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(HarnessError::Chaos { reason });
        if self.candidates < 2 || self.candidates > 9 {
            return bad(format!(
                "candidates: {} is not between 2 and 9",
                self.candidates
            ));
        }
        if self.backend == ChaosBackend::Peer && self.candidates < 3 {
            return bad("candidates: a peer cluster needs at least 3 nodes".into());
        }
        if self.ttl < Duration::from_millis(500) || self.ttl > Duration::from_secs(60) {
            return bad(format!("ttl: {:?} is not between 0.5 s and 60 s", self.ttl));
        }
        if self.backend == ChaosBackend::Peer && self.ttl > PEER_LEASE {
            return bad(format!(
                "ttl: {:?} exceeds the peer cluster's lease {PEER_LEASE:?}",
                self.ttl
            ));
        }
        if self.backend == ChaosBackend::Azure
            && !(AZURE_MIN_LEASE..=AZURE_MAX_LEASE).contains(&self.ttl)
        {
            return bad(format!(
                "ttl: {:?} is not an Azure lease duration (15 s to 60 s)",
                self.ttl
            ));
        }
        if self.rounds == Some(0) {
            return bad("rounds: 0 would inject no fault".into());
        }
        if self.write_every < Duration::from_millis(10) {
            return bad("write_every: below 10 ms".into());
        }
        Ok(())
    }
}

/// What a chaos run found.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    /// The backend.
    pub backend: ChaosBackend,
    /// The seed (replay with the same options and this seed).
    pub seed: u64,
    /// How long faults were injected.
    pub duration: Duration,
    /// How many candidates campaigned at a time.
    pub candidates: usize,
    /// The candidates' TTL.
    pub ttl: Duration,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    /// One line per fault: when (seconds into the run), what, on whom.
    pub fault_log: Vec<String>,
    /// Every candidate's leadership events in time order (seconds into the run, id,
    /// event, token, reason), to read a violation against the fault log.
    pub timeline: Vec<String>,
    /// Each candidate's label and the last lines of its stderr (its warnings), to
    /// explain a violation.
    pub stderr: Vec<(String, String)>,
    /// Leaderships granted (tenures in the candidates' logs).
    pub grants: usize,
    /// The longest time without a leader between the first grant and the end.
    pub max_leaderless_gap: Duration,
    /// When that gap began, counted from the start of the run.
    pub max_gap_at: Duration,
    /// Fencing violations in the event logs (overlaps, tokens not increasing, grants
    /// without a token), except those in [`allowed_overlaps`](Self::allowed_overlaps).
    pub violations: Vec<FencingViolation>,
    /// Overlaps a documented store limit allows, each with the limit
    /// ([`ChaosBackend::restart_data_loss`], [`ChaosBackend::leader_resume_revokes`]).
    pub allowed_overlaps: Vec<(FencingViolation, &'static str)>,
    /// Writes the resource accepted although their token was stale: lower than a
    /// token it had accepted before, or granted to another candidate, or never
    /// granted at all.
    pub stale_writes_accepted: Vec<WriteRecord>,
    /// Writes accepted, in total.
    pub writes_accepted: usize,
    /// Writes refused as stale, in total.
    pub writes_refused: usize,
    /// Writes with a token a later grant had already superseded, accepted because the
    /// successor had not written yet: what fencing tokens allow, shown for insight.
    pub superseded_writes_before_successor: usize,
}

impl ChaosReport {
    /// Whether the run found no violation (allowed overlaps do not count; stale
    /// writes always do).
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.stale_writes_accepted.is_empty()
    }

    /// Violations of every kind, as lines.
    pub fn violation_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.violations.iter().map(|v| v.to_string()).collect();
        lines.extend(
            self.stale_writes_accepted
                .iter()
                .map(|w| format!("stale write accepted: {w:?}")),
        );
        lines
    }
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos: backend {}, seed {}, {:.1} s of faults, {} candidates, TTL {:?}",
            self.backend,
            self.seed,
            self.duration.as_secs_f64(),
            self.candidates,
            self.ttl
        )?;
        let total: usize = self.faults.values().sum();
        let kinds: Vec<String> = self
            .backend
            .faults()
            .iter()
            .map(|k| format!("{k} {}", self.faults.get(k).copied().unwrap_or(0)))
            .collect();
        writeln!(f, "faults: {total} ({})", kinds.join(", "))?;
        writeln!(
            f,
            "leaderships granted: {}; max leaderless gap: {:.2} s (from {:.1} s)",
            self.grants,
            self.max_leaderless_gap.as_secs_f64(),
            self.max_gap_at.as_secs_f64()
        )?;
        writeln!(
            f,
            "writes: {} accepted, {} refused as stale; {} with a superseded token accepted \
             before the successor's first write (allowed by fencing)",
            self.writes_accepted, self.writes_refused, self.superseded_writes_before_successor
        )?;
        let limits = [
            self.backend.restart_data_loss(),
            self.backend.leader_resume_revokes(),
        ];
        if limits.iter().any(Option::is_some) {
            writeln!(
                f,
                "overlapping tenures a documented store limit allows: {}; the check that \
                 must hold then is zero stale writes accepted: {}",
                self.allowed_overlaps.len(),
                self.stale_writes_accepted.len()
            )?;
            for (o, why) in &self.allowed_overlaps {
                writeln!(f, "  allowed ({why}): {o}")?;
            }
        }
        let lines = self.violation_lines();
        write!(f, "violations: {}", lines.len())?;
        for line in lines {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// A small deterministic generator (SplitMix64): the whole schedule follows from the
/// seed. (Also the shard-level chaos run's, [`crate::shard_chaos`].)
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// A duration uniformly in `[lo, hi]`.
    pub(crate) fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
        let span = hi.saturating_sub(lo);
        Duration::from_millis(lo + self.next_u64() % (span + 1))
    }

    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The store of a run: one server (each candidate reaches it through its own proxy)
/// or a cluster (the candidates name every member).
enum Store {
    Single(ChaosBackend, StoreServer),
    EtcdCluster(EtcdCluster),
    ZooKeeperEnsemble(ZooKeeperEnsemble),
    RedisSentinel(RedisSentinels),
}

impl Store {
    async fn start(backend: ChaosBackend) -> Result<Option<Store>> {
        let single = |s: StoreServer| Store::Single(backend, s);
        let store = match backend {
            ChaosBackend::Etcd => single(EtcdServer::start().await?.0),
            ChaosBackend::Redis => single(RedisServer::start().await?.0),
            ChaosBackend::ZooKeeper => single(ZooKeeperServer::start().await?.0),
            ChaosBackend::Azure => single(AzuriteServer::start().await?.0),
            ChaosBackend::Postgres => single(PostgresServer::start().await?.0),
            ChaosBackend::EtcdCluster => Store::EtcdCluster(EtcdCluster::start(3).await?),
            ChaosBackend::ZooKeeperEnsemble => {
                Store::ZooKeeperEnsemble(ZooKeeperEnsemble::start(3).await?)
            }
            ChaosBackend::RedisSentinel => Store::RedisSentinel(RedisSentinels::start().await?),
            ChaosBackend::Peer => return Ok(None),
        };
        if let Store::Single(_, s) = &store {
            if s.is_external() {
                return Err(HarnessError::Chaos {
                    reason: format!(
                        "chaos pauses and restarts the store, so it needs a local server: \
                         unset {}",
                        s.env_var()
                    ),
                });
            }
        }
        Ok(Some(store))
    }

    /// The one server's address, which each candidate reaches through its own proxy;
    /// `None` for a cluster.
    fn proxied(&self) -> Option<std::net::SocketAddr> {
        match self {
            Store::Single(_, s) => Some(s.addr()),
            _ => None,
        }
    }

    /// The store's processes: a cluster's members (for a Redis group, its data nodes),
    /// or the one server as member 0.
    fn members(&mut self) -> &mut Members {
        match self {
            Store::EtcdCluster(c) => c,
            Store::ZooKeeperEnsemble(e) => e,
            Store::RedisSentinel(g) => g.data(),
            Store::Single(_, s) => s.members(),
        }
    }

    /// The member that leads the store now (raft leader, ensemble leader, primary; the
    /// one server).
    async fn leader_member(&self) -> Result<usize> {
        match self {
            Store::EtcdCluster(c) => c.leader(),
            Store::ZooKeeperEnsemble(e) => e.leader().await,
            Store::RedisSentinel(g) => g.primary().await,
            Store::Single(..) => Ok(0),
        }
    }

    /// Stops member `i` for a restart: SIGKILL, but the orderly way for Azurite, which
    /// saves its state every 5 s (a SIGKILL would lose acknowledged writes, which Azure
    /// Storage does not; see the module docs).
    async fn stop(&mut self, i: usize) -> Result<()> {
        match self {
            Store::Single(ChaosBackend::Azure, s) => s.members().terminate(i).await,
            _ => self.members().kill(i).await,
        }
    }

    /// The URL a candidate uses to reach the store: through `via` (its proxy) for one
    /// server, every member for a cluster.
    fn url(&self, via: Option<std::net::SocketAddr>, seed: u64) -> String {
        let via = via.map(|v| v.to_string()).unwrap_or_default();
        let timeouts = "connect_timeout=1s&request_timeout=1s";
        match self {
            Store::EtcdCluster(c) => format!(
                "etcd://{}?prefix=chaos-{seed}&connect_timeout_ms=1000",
                c.hosts()
            ),
            Store::ZooKeeperEnsemble(e) => {
                format!("zk://{}/chaos-{seed}?connect_timeout=2s", e.hosts())
            }
            Store::RedisSentinel(g) => g.url(&format!(
                "?prefix=chaos-{seed}&connect_timeout_ms=500&request_timeout_ms=800\
                 &wait_replicas=1&wait_timeout_ms=300"
            )),
            Store::Single(ChaosBackend::Etcd, _) => {
                format!("etcd://{via}?prefix=chaos-{seed}&{timeouts}")
            }
            Store::Single(ChaosBackend::Redis, _) => {
                format!("redis://{via}?prefix=chaos-{seed}&{timeouts}")
            }
            Store::Single(ChaosBackend::ZooKeeper, _) => {
                format!("zk://{via}/chaos-{seed}?{timeouts}")
            }
            Store::Single(ChaosBackend::Postgres, _) => format!(
                "postgres://{}@{via}/{}?schema=chaos_{seed}&{timeouts}",
                PostgresServer::USER,
                PostgresServer::DATABASE
            ),
            Store::Single(..) => format!(
                "azblob:///chaos-{seed}?poll_interval_ms=100&request_timeout_ms=1000&connect_timeout_ms=2000"
            ),
        }
    }

    /// The environment a candidate needs besides its URL: Azure's account and key, with
    /// the blob endpoint at `via` (its proxy), as a connection string.
    fn env(&self, via: Option<std::net::SocketAddr>) -> Vec<(&'static str, String)> {
        match (self, via) {
            (Store::Single(ChaosBackend::Azure, _), Some(via)) => vec![(
                "AZURE_STORAGE_CONNECTION_STRING",
                AzuriteServer::connection_string(
                    &format!("http://{via}/{}", AzuriteServer::ACCOUNT),
                    AzuriteServer::ACCOUNT_KEY,
                ),
            )],
            _ => Vec::new(),
        }
    }
}

/// The links of a peer cluster: `links[i][j]` carries what node `i` sends to node `j`
/// (`None` on the diagonal).
struct PeerLinks {
    ports: Vec<u16>,
    links: Vec<Vec<Option<TcpProxy>>>,
}

impl PeerLinks {
    async fn start(nodes: usize) -> Result<Self> {
        let ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect::<Result<_>>()?;
        let mut links = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let mut row = Vec::with_capacity(nodes);
            for (j, port) in ports.iter().enumerate() {
                let link = (i != j).then(|| TcpProxy::start(loopback(*port)));
                row.push(match link {
                    Some(starting) => Some(starting.await?),
                    None => None,
                });
            }
            links.push(row);
        }
        Ok(PeerLinks { ports, links })
    }

    /// Node `i`'s URL: it listens on its own port and reaches node `j` through
    /// `links[i][j]`.
    fn url(&self, i: usize) -> String {
        let peers: Vec<_> = (0..self.ports.len())
            .map(|j| match &self.links[i][j] {
                Some(proxy) => proxy.addr(),
                None => loopback(self.ports[j]),
            })
            .collect();
        peer_url(self.ports[i], i + 1, &peers)
    }

    /// The proxies of the links between `a` and `b`, both ways.
    fn between(&self, a: usize, b: usize) -> impl Iterator<Item = &TcpProxy> {
        [&self.links[a][b], &self.links[b][a]]
            .into_iter()
            .filter_map(|l| l.as_ref())
    }

    /// The proxies of every link of node `n`, both ways.
    fn of(&self, n: usize) -> Vec<&TcpProxy> {
        (0..self.ports.len())
            .flat_map(|m| self.between(n, m))
            .collect()
    }
}

/// Node `id` (from 1) of a bully `peer://` cluster with the chaos runs' timing (a
/// 1.5 s quorum lease, quick failure detection), listening on loopback `port` and
/// reaching node `j + 1` at `peers[j]`.
pub fn peer_url(port: u16, id: usize, peers: &[std::net::SocketAddr]) -> String {
    let peers: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(j, a)| format!("{}@{a}", j + 1))
        .collect();
    let (peers, lease) = (peers.join(","), PEER_LEASE.as_millis());
    format!(
        "peer://127.0.0.1:{port}?id={id}&peers={peers}&algorithm=bully&lease={lease}ms\
         &heartbeat=50ms&leader_timeout=300ms"
    )
}

/// The links a network fault acts on.
#[derive(Debug, Clone, Copy)]
enum Links {
    /// A candidate slot's link to the store.
    ToStore(usize),
    /// Every link of a peer node, both ways.
    OfNode(usize),
    /// The link between two peer nodes, both ways.
    Between(usize, usize),
}

/// One running chaos campaign.
struct Run {
    opts: ChaosOptions,
    rng: Rng,
    started: Instant,
    resource: GuardedResource,
    store: Option<Store>,
    /// One proxy per candidate slot between it and the store.
    proxies: Vec<TcpProxy>,
    peer: Option<PeerLinks>,
    /// The candidate in each slot now.
    slots: Vec<CandidateProcess>,
    /// How many candidates each slot has had.
    generations: Vec<u32>,
    /// Logs of candidates that were replaced.
    finished: Vec<Vec<Event>>,
    /// Every candidate's label and the end of its stderr, taken when it was replaced
    /// or stopped.
    stderr: Vec<(String, String)>,
    faults: BTreeMap<FaultKind, usize>,
    fault_log: Vec<String>,
    /// `mono_ns` of every moment the store lost its data (kill before a restart of a
    /// store without persistence).
    data_lost_at: Vec<u64>,
    /// `mono_ns` of every resume of a paused store leader member.
    leader_resumed_at: Vec<u64>,
}

/// Runs a chaos campaign as `opts` says and checks its safety; see the module docs.
///
/// Errors are about the harness (a server that does not start, a candidate that cannot
/// be spawned); what the run found is in the report, whose
/// [`passed`](ChaosReport::passed) says whether there were violations.
pub async fn run_chaos(opts: ChaosOptions) -> Result<ChaosReport> {
    opts.validate()?;
    if opts.verbose {
        eprintln!(
            "chaos: backend {}, seed {} (replay with --seed {}), {:?}, {} candidates, TTL {:?}",
            opts.backend, opts.seed, opts.seed, opts.duration, opts.candidates, opts.ttl
        );
    }
    let resource = GuardedResource::start().await?;
    let store = Store::start(opts.backend).await?;
    let mut proxies = Vec::new();
    if let Some(addr) = store.as_ref().and_then(Store::proxied) {
        for _ in 0..opts.candidates {
            proxies.push(TcpProxy::start(addr).await?);
        }
    }
    let peer = match opts.backend {
        ChaosBackend::Peer => Some(PeerLinks::start(opts.candidates).await?),
        _ => None,
    };
    let mut run = Run {
        rng: Rng(opts.seed),
        started: Instant::now(),
        resource,
        store,
        proxies,
        peer,
        slots: Vec::new(),
        generations: vec![0; opts.candidates],
        finished: Vec::new(),
        stderr: Vec::new(),
        faults: BTreeMap::new(),
        fault_log: Vec::new(),
        data_lost_at: Vec::new(),
        leader_resumed_at: Vec::new(),
        opts,
    };
    for slot in 0..run.opts.candidates {
        let c = run.spawn(slot)?;
        run.slots.push(c);
    }
    let outcome = run.campaign().await;
    // Whatever happened, stop the candidates (SIGTERM resigns) and read their logs.
    let end_ns = monotonic_now_ns();
    let logs = run.stop().await;
    outcome?;
    Ok(run.report(&logs, end_ns))
}

impl Run {
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn note(&mut self, kind: FaultKind, what: String) {
        *self.faults.entry(kind).or_default() += 1;
        let line = format!("[{:7.2} s] {kind}: {what}", self.at());
        if self.opts.verbose {
            eprintln!("chaos: {line}");
        }
        self.fault_log.push(line);
    }

    fn url(&self, slot: usize) -> String {
        match (&self.store, &self.peer) {
            (Some(store), _) => store.url(self.proxy_addr(slot), self.opts.seed),
            (None, Some(peer)) => peer.url(slot),
            (None, None) => String::new(),
        }
    }

    /// The proxy of `slot` (none for a cluster).
    fn proxy_addr(&self, slot: usize) -> Option<std::net::SocketAddr> {
        self.proxies.get(slot).map(TcpProxy::addr)
    }

    /// Starts a new candidate in `slot`.
    fn spawn(&mut self, slot: usize) -> Result<CandidateProcess> {
        let generation = self.generations[slot];
        self.generations[slot] += 1;
        let id = format!("c{}-{generation}", slot + 1);
        let writes = write_loop_command(self.resource.addr(), self.opts.write_every);
        let url = self.url(slot);
        let mut env = vec![("RUST_LOG", "warn".to_owned())];
        if let Some(store) = &self.store {
            env.extend(store.env(self.proxy_addr(slot)));
        }
        let args = campaign_args(
            &url,
            CHAOS_ELECTION,
            &id,
            self.opts.ttl,
            self.opts.backend.connect_timeout(),
            COMMAND_LIFETIME,
            &writes,
        );
        CandidateProcess::spawn(&self.opts.tenure_bin, &args, env)
    }

    /// The slot whose candidate holds the seat now, if any.
    fn holder(&self) -> Option<usize> {
        self.slots.iter().position(CandidateProcess::leads)
    }

    /// The holder, or a random slot when nobody holds the seat.
    fn target(&mut self) -> (usize, &'static str) {
        match self.holder() {
            Some(h) => (h, "holder"),
            None => (
                self.rng.below(self.slots.len()),
                "no holder; random candidate",
            ),
        }
    }

    fn label(&self, slot: usize) -> String {
        self.slots[slot].label().to_owned()
    }

    /// Starts a new candidate in `slot`, keeping the log and the stderr of the old one.
    fn replace(&mut self, slot: usize) -> Result<()> {
        let fresh = self.spawn(slot)?;
        let old = std::mem::replace(&mut self.slots[slot], fresh);
        self.finished.push(old.events());
        self.stderr
            .push((old.label().to_owned(), old.stderr_tail()));
        Ok(())
    }

    async fn campaign(&mut self) -> Result<()> {
        let ttl = self.opts.ttl;
        let deadline = self.started + self.opts.duration;
        let kinds = self.opts.backend.faults();
        let mut round: Vec<FaultKind> = Vec::new();
        let mut rounds_done = 0;
        // Let the first leader settle before the first fault.
        tokio::time::sleep(ttl).await;
        loop {
            let quiet = self.rng.between(ttl / 2, ttl * 3 / 2);
            tokio::time::sleep(quiet).await;
            if Instant::now() >= deadline {
                return Ok(());
            }
            if round.is_empty() {
                if self.opts.rounds.is_some_and(|r| rounds_done >= r) {
                    return Ok(());
                }
                rounds_done += 1;
                round = kinds.to_vec();
                self.rng.shuffle(&mut round);
            }
            if let Some(kind) = round.pop() {
                self.inject(kind).await?;
            }
            self.reap_exited()?;
        }
    }

    /// Candidates that exited by themselves (they should not) are replaced, so the run
    /// keeps its K campaigns.
    fn reap_exited(&mut self) -> Result<()> {
        for slot in 0..self.slots.len() {
            if self.slots[slot].try_exit_status().is_some() {
                if self.opts.verbose {
                    eprintln!(
                        "chaos: [{:7.2} s] {} exited by itself; stderr:\n{}",
                        self.at(),
                        self.label(slot),
                        self.slots[slot].stderr_tail()
                    );
                }
                self.replace(slot)?;
            }
        }
        Ok(())
    }

    async fn inject(&mut self, kind: FaultKind) -> Result<()> {
        let ttl = self.opts.ttl;
        let renew_deadline = ttl * 2 / 3;
        match kind {
            FaultKind::KillHolder => {
                let (slot, why) = self.target();
                let label = self.label(slot);
                self.slots[slot].kill().await?;
                self.note(kind, format!("SIGKILL {label} ({why})"));
                self.replace(slot)?;
            }
            FaultKind::StopHolder => {
                let (slot, why) = self.target();
                let pause = self.rng.between(ttl + ttl / 4, ttl * 2);
                let label = self.label(slot);
                self.slots[slot].pause()?;
                self.note(kind, format!("SIGSTOP {label} for {pause:?} ({why})"));
                tokio::time::sleep(pause).await;
                self.slots[slot].resume()?;
            }
            FaultKind::StopServer | FaultKind::StopMember => {
                let (member, which, leader) = self.member_target().await;
                let pause = self.rng.between(renew_deadline + ttl / 4, ttl * 2);
                let Some(store) = self.store.as_mut() else {
                    return Ok(());
                };
                store.members().pause(member)?;
                self.note(kind, format!("SIGSTOP {which} for {pause:?}"));
                tokio::time::sleep(pause).await;
                if let Some(store) = self.store.as_mut() {
                    store.members().resume(member)?;
                    if leader {
                        self.leader_resumed_at.push(monotonic_now_ns());
                    }
                }
            }
            FaultKind::RestartServer | FaultKind::RestartMember => {
                let (member, which, _) = self.member_target().await;
                let down = self.rng.between(Duration::ZERO, ttl * 3 / 2);
                let Some(store) = self.store.as_mut() else {
                    return Ok(());
                };
                store.stop(member).await?;
                if self.opts.backend.restart_loses_data() {
                    self.data_lost_at.push(monotonic_now_ns());
                }
                self.note(kind, format!("kill {which}, restart after {down:?}"));
                tokio::time::sleep(down).await;
                if let Some(store) = self.store.as_mut() {
                    store.members().restart(member).await?;
                }
            }
            FaultKind::Cut | FaultKind::Blackhole | FaultKind::Partition | FaultKind::CutLink => {
                let (slot, why) = self.target();
                let label = self.label(slot);
                let (links, what, length) = if self.store.is_some() {
                    let length = self.rng.between(ttl / 10, ttl * 2);
                    (
                        Links::ToStore(slot),
                        format!("{label}'s link to the store"),
                        length,
                    )
                } else if kind == FaultKind::CutLink {
                    let n = self.slots.len();
                    let other = (slot + 1 + self.rng.below(n - 1)) % n;
                    let length = self.rng.between(PEER_LEASE / 2, PEER_LEASE * 3);
                    let what = format!("the link between {label} and {}", self.label(other));
                    (Links::Between(slot, other), what, length)
                } else {
                    let length = self.rng.between(PEER_LEASE / 2, PEER_LEASE * 3);
                    (
                        Links::OfNode(slot),
                        format!("every link of {label}"),
                        length,
                    )
                };
                for proxy in self.links(links) {
                    if kind == FaultKind::Blackhole {
                        proxy.blackhole().await?;
                    } else {
                        proxy.cut().await?;
                    }
                }
                self.note(kind, format!("{what} for {length:?} ({why})"));
                tokio::time::sleep(length).await;
                for proxy in self.links(links) {
                    proxy.heal().await?;
                }
            }
        }
        Ok(())
    }

    /// The member to fault (the store's leader half of the time, else a random one; the
    /// one server of a single store), how to name it, and whether it leads the store.
    async fn member_target(&mut self) -> (usize, String, bool) {
        let n = match &mut self.store {
            Some(Store::Single(..)) | None => return (0, "the store".into(), true),
            Some(store) => store.members().len().max(1),
        };
        let random = self.rng.below(n);
        let pick_leader = self.rng.below(2) == 0;
        let leader = match &self.store {
            Some(store) => store.leader_member().await.ok(),
            None => None,
        };
        match leader {
            Some(leader) if pick_leader || leader == random => {
                (leader, format!("member {leader} (the leader)"), true)
            }
            _ => (random, format!("member {random}"), false),
        }
    }

    /// The proxies of `links`.
    fn links(&self, links: Links) -> Vec<&TcpProxy> {
        match (links, &self.peer) {
            (Links::ToStore(slot), _) => self.proxies.get(slot).into_iter().collect(),
            (Links::OfNode(n), Some(peer)) => peer.of(n),
            (Links::Between(a, b), Some(peer)) => peer.between(a, b).collect(),
            (_, None) => Vec::new(),
        }
    }

    /// Resumes anything paused, terminates every candidate and returns every log.
    async fn stop(&mut self) -> Vec<Vec<Event>> {
        if let Some(store) = &mut self.store {
            let members = store.members();
            for i in 0..members.len() {
                let _ = members.resume(i);
            }
        }
        for proxy in &self.proxies {
            let _ = proxy.heal().await;
        }
        if let Some(peer) = &self.peer {
            for proxy in peer.links.iter().flatten().flatten() {
                let _ = proxy.heal().await;
            }
        }
        let mut logs = std::mem::take(&mut self.finished);
        for c in &mut self.slots {
            if c.try_exit_status().is_none() {
                let _ = c.terminate().await;
            }
        }
        // The readers see end of output shortly after the exit.
        tokio::time::sleep(Duration::from_millis(200)).await;
        logs.extend(self.slots.iter().map(|c| c.events()));
        let tails: Vec<(String, String)> = self
            .slots
            .iter()
            .map(|c| (c.label().to_owned(), c.stderr_tail()))
            .collect();
        self.stderr.extend(tails);
        logs
    }

    /// The documented store limit that allows `v`, if one does.
    fn allowed_by(&self, v: &FencingViolation) -> Option<&'static str> {
        let FencingViolation::Overlap { first, second } = v else {
            return None;
        };
        let backend = self.opts.backend;
        if let Some(why) = backend.restart_data_loss() {
            if self
                .data_lost_at
                .iter()
                .any(|&lost| first.start_ns <= lost && lost <= second.start_ns)
            {
                return Some(why);
            }
        }
        let why = backend.leader_resume_revokes()?;
        revoked_after_resume(first, second, &self.leader_resumed_at, self.opts.ttl).then_some(why)
    }

    fn report(&self, logs: &[Vec<Event>], end_ns: u64) -> ChaosReport {
        let all = tenures(logs, end_ns);
        let mut violations = Vec::new();
        let mut allowed_overlaps = Vec::new();
        for v in check_fencing_at(logs, end_ns) {
            match self.allowed_by(&v) {
                Some(why) => allowed_overlaps.push((v, why)),
                None => violations.push(v),
            }
        }
        let writes = self.resource.writes();
        let stale = stale_writes_accepted(&writes, &all);
        let superseded = superseded_writes_before_successor(&writes, &all);
        let run_start_ns = end_ns.saturating_sub(self.started.elapsed().as_nanos() as u64);
        let (gap, gap_at_ns) = max_leaderless_gap(&all, end_ns);
        let timeline = timeline(logs, run_start_ns);
        ChaosReport {
            backend: self.opts.backend,
            seed: self.opts.seed,
            duration: self.opts.duration,
            candidates: self.opts.candidates,
            ttl: self.opts.ttl,
            faults: self.faults.clone(),
            fault_log: self.fault_log.clone(),
            timeline,
            stderr: self.stderr.clone(),
            grants: all.len(),
            max_leaderless_gap: gap,
            max_gap_at: Duration::from_nanos(gap_at_ns.saturating_sub(run_start_ns)),
            violations,
            allowed_overlaps,
            stale_writes_accepted: stale,
            writes_accepted: writes.iter().filter(|w| w.accepted).count(),
            writes_refused: writes.iter().filter(|w| !w.accepted).count(),
            superseded_writes_before_successor: superseded,
        }
    }
}

/// Whether `first` ended because the store deleted its seat (a `lost` event whose
/// reason is a revocation) within `window` after one of `resumes`, and `second` was
/// granted after that resume: the overlap a store that revokes leases as its leader
/// resumes produces ([`ChaosBackend::leader_resume_revokes`]). A loss the client
/// decided (its renew deadline) or an overlap that began before the resume is not it.
fn revoked_after_resume(
    first: &Tenure,
    second: &Tenure,
    resumes: &[u64],
    window: Duration,
) -> bool {
    let revoked = first.end == TenureEnd::Lost
        && first
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("revoked"));
    let window = window.as_nanos() as u64;
    revoked
        && resumes.iter().any(|&resumed| {
            resumed <= second.start_ns
                && resumed <= first.end_ns
                && first.end_ns - resumed <= window
        })
}

/// Stamps one test per `name => backend` (a [`ChaosBackend`] variant), each calling
/// `$run(backend)`, an `async fn` of the test file (usually an [`assert_bounded_run`]).
#[macro_export]
macro_rules! chaos_tests {
    ($run:path: $($name:ident => $backend:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $run($crate::ChaosBackend::$backend).await;
        }
    )*};
}

/// A bounded run as the test suites make one, and its checks: `duration` of faults,
/// or with `rounds` that many rounds of every fault kind (bounded by `duration`);
/// `TENURE_CHAOS_DURATION` (a soak) and `TENURE_CHAOS_SEED` (a replay) override them.
/// Panics with the report, the fault log and the leadership events on any violation,
/// on fewer than two grants, and, unless the duration was overridden, when a fault
/// kind of the backend was never injected.
pub async fn assert_bounded_run(
    backend: ChaosBackend,
    tenure_bin: impl Into<PathBuf>,
    duration: Duration,
    rounds: Option<usize>,
) {
    let mut options = ChaosOptions::new(backend, tenure_bin);
    let given = std::env::var("TENURE_CHAOS_DURATION").ok();
    options.duration = duration;
    options.rounds = rounds;
    if let Some(d) = &given {
        options.duration = parse_duration(d).expect("TENURE_CHAOS_DURATION");
        options.rounds = None;
    }
    if let Ok(seed) = std::env::var("TENURE_CHAOS_SEED") {
        options.seed = seed.trim().parse().expect("TENURE_CHAOS_SEED is a number");
    }
    let report = run_chaos(options).await.expect("chaos run");
    eprintln!("{report}");
    eprintln!("faults:\n{}", report.fault_log.join("\n"));
    if !report.passed() {
        for (label, tail) in &report.stderr {
            eprintln!("--- stderr of {label}:\n{tail}");
        }
    }
    assert!(
        report.passed(),
        "{report}\nfaults:\n{}\nleadership events:\n{}",
        report.fault_log.join("\n"),
        report.timeline.join("\n")
    );
    assert!(report.grants >= 2, "fewer than two grants:\n{report}");
    if given.is_none() {
        for kind in backend.faults() {
            assert!(
                report.faults.get(kind).copied().unwrap_or(0) > 0,
                "{kind} was never injected:\n{report}"
            );
        }
    }
}

/// The leadership events of `logs` in time order, one line each, with times in seconds
/// after `start_ns`.
fn timeline(logs: &[Vec<Event>], start_ns: u64) -> Vec<String> {
    let mut events: Vec<&Event> = logs.iter().flatten().filter(|e| e.marks_tenure()).collect();
    events.sort_by_key(|e| e.mono_ns);
    events
        .iter()
        .map(|e| {
            let at = e.mono_ns.saturating_sub(start_ns) as f64 / 1e9;
            let mut line = format!("[{at:9.3} s] {} {}", e.id, e.kind);
            if let Some(token) = e.token {
                line.push_str(&format!(" token {token}"));
            }
            if let Some(reason) = &e.reason {
                line.push_str(&format!(" ({reason})"));
            }
            line
        })
        .collect()
}

/// Accepted writes whose token was stale: lower than the highest the resource had
/// accepted before (the resource failed to fence), granted to a candidate other than
/// the writer (two holders shared a token, so no resource could fence them), or never
/// granted to anyone.
pub fn stale_writes_accepted(writes: &[WriteRecord], tenures: &[Tenure]) -> Vec<WriteRecord> {
    let mut granted: BTreeMap<(&str, u64), Vec<&str>> = BTreeMap::new();
    for t in tenures {
        if let Some(token) = t.token {
            granted
                .entry((t.election.as_str(), token))
                .or_default()
                .push(t.id.as_str());
        }
    }
    writes
        .iter()
        .filter(|w| w.accepted)
        .filter(|w| {
            let below_highest = w.highest_before.is_some_and(|h| w.token < h);
            let holders = granted.get(&(w.election.as_str(), w.token));
            let not_its_own = match holders {
                None => true,
                Some(ids) => ids.iter().any(|id| *id != w.writer),
            };
            below_highest || not_its_own
        })
        .cloned()
        .collect()
}

/// Accepted writes with a token that a later grant of the same election had already
/// superseded when the write was decided (the successor had not written yet, so the
/// resource could not know).
pub fn superseded_writes_before_successor(writes: &[WriteRecord], tenures: &[Tenure]) -> usize {
    writes
        .iter()
        .filter(|w| w.accepted)
        .filter(|w| {
            tenures.iter().any(|t| {
                t.election == w.election
                    && t.token.is_some_and(|token| token > w.token)
                    && t.start_ns < w.mono_ns
            })
        })
        .count()
}

/// The longest stretch between the first grant and `end_ns` in which no tenure was
/// open, and when it began (both in `mono_ns`).
pub fn max_leaderless_gap(tenures: &[Tenure], end_ns: u64) -> (Duration, u64) {
    let mut spans: Vec<(u64, u64)> = tenures.iter().map(|t| (t.start_ns, t.end_ns)).collect();
    spans.sort_unstable();
    let Some(&(first_start, first_end)) = spans.first() else {
        return (Duration::ZERO, 0);
    };
    let mut covered_to = first_end.max(first_start);
    let mut best = (0u64, covered_to);
    for &(start, end) in &spans[1..] {
        if start > covered_to && start - covered_to > best.0 {
            best = (start - covered_to, covered_to);
        }
        covered_to = covered_to.max(end);
    }
    if end_ns > covered_to && end_ns - covered_to > best.0 {
        best = (end_ns - covered_to, covered_to);
    }
    (Duration::from_nanos(best.0), best.1)
}

/// Parses a duration such as `90`, `90s`, `1500ms`, `30m` or `2h` (a bare number is
/// seconds).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let bad = || HarnessError::Chaos {
        reason: format!("{text:?} is not a duration (e.g. 90s, 1500ms, 30m, 2h)"),
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let secs = number * scale;
    if !secs.is_finite() || !(0.0..=1e7).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenure(id: &str, token: u64, start: u64, end: u64) -> Tenure {
        Tenure {
            log: 0,
            election: "e".into(),
            id: id.into(),
            token: Some(token),
            start_ns: start,
            end_ns: end,
            end: TenureEnd::Lost,
            reason: None,
        }
    }

    fn write(
        token: u64,
        writer: &str,
        accepted: bool,
        highest: Option<u64>,
        at: u64,
    ) -> WriteRecord {
        WriteRecord {
            election: "e".into(),
            token,
            writer: writer.into(),
            accepted,
            highest_before: highest,
            mono_ns: at,
        }
    }

    #[test]
    fn the_schedule_follows_from_the_seed() {
        let draw = |seed| {
            let mut rng = Rng(seed);
            (0..20).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut rng = Rng(3);
        for _ in 0..1000 {
            let d = rng.between(Duration::from_millis(10), Duration::from_millis(20));
            assert!((Duration::from_millis(10)..=Duration::from_millis(20)).contains(&d));
        }
        let mut kinds = ChaosBackend::Etcd.faults().to_vec();
        rng.shuffle(&mut kinds);
        kinds.sort();
        assert_eq!(kinds, ChaosBackend::Etcd.faults());
    }

    #[test]
    fn stale_writes_are_found() {
        let tenures = [tenure("a", 5, 0, 100), tenure("b", 7, 100, 200)];
        let ok = [
            write(5, "a", true, None, 10),
            write(7, "b", true, Some(5), 110),
            write(5, "a", false, Some(7), 120),
        ];
        assert!(stale_writes_accepted(&ok, &tenures).is_empty());
        // Below the highest, someone else's token, a token nobody was granted.
        let bad = [
            write(5, "a", true, Some(7), 130),
            write(7, "a", true, Some(7), 140),
            write(9, "c", true, Some(7), 150),
        ];
        assert_eq!(stale_writes_accepted(&bad, &tenures).len(), 3);
        // a's write after b was elected but before b wrote: allowed, counted.
        let late = [write(5, "a", true, Some(5), 105)];
        assert_eq!(superseded_writes_before_successor(&late, &tenures), 1);
        assert!(stale_writes_accepted(&late, &tenures).is_empty());
    }

    #[test]
    fn the_longest_gap_is_measured_between_tenures_and_to_the_end() {
        let t = [
            tenure("a", 1, 10, 20),
            tenure("b", 2, 15, 30),
            tenure("c", 3, 80, 90),
        ];
        assert_eq!(max_leaderless_gap(&t, 100), (Duration::from_nanos(50), 30));
        assert_eq!(max_leaderless_gap(&t, 200), (Duration::from_nanos(110), 90));
        assert_eq!(max_leaderless_gap(&[], 200), (Duration::ZERO, 0));
    }

    #[test]
    fn only_a_revocation_right_after_a_leader_resume_is_allowed_to_overlap() {
        let a = |reason: &str, end| Tenure {
            reason: Some(reason.into()),
            end,
            ..tenure("a", 2, 100, 1_001)
        };
        let revoked = || a("revoked: deleted in etcd", TenureEnd::Lost);
        let successor = tenure("b", 4, 1_000, 2_000);
        // Seat deleted at 1_000, successor granted at 1_000; resumes as given.
        for (first, resumes, allowed, case) in [
            (revoked(), &[990][..], true, "after a resume at 990"),
            (revoked(), &[], false, "no resume: a real overlap"),
            (revoked(), &[500], false, "a resume long before"),
            (revoked(), &[1_001], false, "successor granted first"),
            (
                a("renew deadline passed", TenureEnd::Lost),
                &[990],
                false,
                "deadline",
            ),
            (
                a("revoked", TenureEnd::Killed),
                &[990],
                false,
                "a killed holder",
            ),
        ] {
            let window = Duration::from_nanos(50);
            let found = revoked_after_resume(&first, &successor, resumes, window);
            assert_eq!(found, allowed, "{case}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        for bad in ["", "x", "5d", "-1s", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backends_parse_and_name_their_faults() {
        for b in ChaosBackend::ALL.into_iter().chain(ChaosBackend::CLUSTERS) {
            assert_eq!(b.name().parse::<ChaosBackend>().unwrap(), b);
            assert!(!b.faults().is_empty());
        }
        for b in ChaosBackend::CLUSTERS {
            assert!(b.is_cluster());
            assert!(b.faults().contains(&FaultKind::StopMember));
            assert!(!b.faults().contains(&FaultKind::Cut));
        }
        assert!("cassandra".parse::<ChaosBackend>().is_err());
        assert_eq!(
            "azblob".parse::<ChaosBackend>().unwrap(),
            ChaosBackend::Azure
        );
        assert_eq!(ChaosBackend::Azure.default_ttl(), Duration::from_secs(15));
        assert!(ChaosBackend::Peer.faults().contains(&FaultKind::Partition));
        assert!(ChaosBackend::Etcd
            .faults()
            .contains(&FaultKind::RestartServer));
    }

    #[test]
    fn options_outside_a_backend_s_bounds_are_refused() {
        let mut o = ChaosOptions::new(ChaosBackend::Azure, "tenure");
        assert!(o.validate().is_ok());
        o.ttl = Duration::from_secs(2);
        assert!(o.validate().is_err(), "Azure leases start at 15 s");
        o.ttl = Duration::from_secs(61);
        assert!(o.validate().is_err(), "Azure leases end at 60 s");
        o.ttl = Duration::from_secs(20);
        o.rounds = Some(0);
        assert!(o.validate().is_err(), "zero rounds inject nothing");
        o.rounds = Some(1);
        assert!(o.validate().is_ok());
        let mut p = ChaosOptions::new(ChaosBackend::Peer, "tenure");
        p.ttl = Duration::from_secs(2);
        assert!(p.validate().is_err(), "peer TTL above its lease");
    }
}
