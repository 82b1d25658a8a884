//! Command-line arguments.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tenure::{Error, Result, Timing};

/// Leader election over interchangeable coordination stores.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, about, long_about = None, allow_negative_numbers = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Campaign for an election; print one JSON line per event; optionally run a command
    /// while leader (killed the moment leadership is lost).
    Campaign(CampaignArgs),
    /// Print one JSON line per leader change of an election.
    Observe(ObserveArgs),
    /// Ask the leader of an election to step down to the best waiter, or to the one
    /// given with --to, without stopping it (it campaigns again); print one JSON line.
    Handover(HandoverArgs),
    /// Run N shard managers in this process through a script (converge, crash a node,
    /// add a node, drain a node) with a live view, then print a summary; with
    /// `--load zipf`, balance by load first, beside the count-only baseline.
    Demo(DemoArgs),
    /// Read a sharded namespace: who leads each shard, replica sets, members.
    Shards(ShardsArgs),
    /// Measure handover and failover latency of the given backends (and the in-memory
    /// one) and the shard manager; print one Markdown table and write an SVG chart.
    Bench(BenchArgs),
}

/// Which store to use.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Backend URL: mem://[NAME] (in this process), or a store enabled at build time.
    #[arg(long, env = "TENURE_BACKEND", default_value = "mem://")]
    pub backend: String,
}

/// The Prometheus exporter.
#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9464).
    #[arg(long, env = "TENURE_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// The health endpoint for load balancers and readiness probes.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Serve http://ADDR/leader (200 while leading, else 503) and /shards (what is
    /// led, JSON); given the same ADDR as --metrics-addr, /metrics on that listener too.
    #[arg(long, env = "TENURE_HEALTH_ADDR", value_name = "ADDR")]
    pub health_addr: Option<std::net::SocketAddr>,
}

/// Session timing, in seconds (fractions allowed).
#[derive(Debug, Clone, Args)]
pub struct TimingArgs {
    /// Session TTL in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub ttl: f64,
    /// Renew interval in seconds [default: TTL/16].
    #[arg(long)]
    pub renew_interval: Option<f64>,
    /// Renew deadline in seconds [default: TTL×7/8].
    #[arg(long)]
    pub renew_deadline: Option<f64>,
    /// Connect and request timeout in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub connect_timeout: f64,
}

/// Convert a number of seconds given for `field` into a duration.
pub fn seconds(field: &str, secs: f64) -> Result<Duration> {
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(Error::invalid(format!(
            "{field}: {secs} is not a number of seconds between 0 and 1e9"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// [`seconds`], and more than zero (a timeout or an interval).
pub fn positive_seconds(field: &str, secs: f64) -> Result<Duration> {
    let d = seconds(field, secs)?;
    if d.is_zero() {
        return Err(Error::invalid(format!(
            "{field}: must be greater than zero"
        )));
    }
    Ok(d)
}

impl TimingArgs {
    /// The validated timing.
    pub fn timing(&self) -> Result<Timing> {
        let mut t = Timing::from_ttl(seconds("ttl", self.ttl)?);
        if let Some(s) = self.renew_interval {
            t.renew_interval = seconds("renew_interval", s)?;
        }
        if let Some(s) = self.renew_deadline {
            t.renew_deadline = seconds("renew_deadline", s)?;
        }
        t.connect_timeout = seconds("connect_timeout", self.connect_timeout)?;
        t.validate()?;
        Ok(t)
    }
}

/// What the commands that run a program share (`campaign`, `shards run`).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Session timing.
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Seconds a command gets to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// Metrics.
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Health endpoint.
    #[command(flatten)]
    pub health: HealthArgs,
}

/// `tenure campaign`.
#[derive(Debug, Clone, Args)]
#[command(allow_negative_numbers = true)]
pub struct CampaignArgs {
    /// The store.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Election name, e.g. billing/shard-0042.
    #[arg(long)]
    pub election: String,
    /// Candidate id, unique per process.
    #[arg(long)]
    pub id: String,
    /// A small value observers see with the id (e.g. an address).
    #[arg(long, default_value = "")]
    pub value: String,
    /// This candidate's priority, from -1000 to 1000 (higher is preferred): waiters
    /// are granted highest first, and joining with a higher priority than the
    /// leader's preempts it (its "lost" line says "preempted"). Every backend keeps
    /// priorities but the interop layouts (etcd layout=go, ZooKeeper layout=curator),
    /// which refuse any but 0.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub priority: i32,
    /// While leader, do not step down for a candidate with a higher priority (it is
    /// granted first once this one resigns).
    #[arg(long)]
    pub no_preempt: bool,
    /// Session timing, the command's grace, metrics and health endpoints.
    #[command(flatten)]
    pub run: RunArgs,
    /// The command to run while leader (after `--`). It gets TENURE_TOKEN,
    /// TENURE_ELECTION and TENURE_ID in its environment, runs in its own process
    /// group (SIGTERM, then SIGKILL, on loss), and is SIGKILLed by the kernel if this
    /// process dies (only the command itself: a wrapper such as `timeout` must pass
    /// that on to its own children).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `tenure observe`.
#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// The store.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Election name.
    #[arg(long)]
    pub election: String,
    /// Connect timeout in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub connect_timeout: f64,
    /// Metrics.
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// `tenure handover`.
#[derive(Debug, Clone, Args)]
pub struct HandoverArgs {
    /// The store.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Election name.
    #[arg(long)]
    pub election: String,
    /// The candidate id of the waiter to hand over to [default: the best waiter:
    /// highest priority, then queue order].
    #[arg(long, value_name = "ID")]
    pub to: Option<String>,
    /// Connect timeout in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub connect_timeout: f64,
}

/// `tenure demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// The store (any backend with membership: mem, etcd, redis, zk, postgres, azblob).
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Nodes at the start (2 to 64).
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// Shards.
    #[arg(long, default_value_t = 256)]
    pub shards: usize,
    /// Replication factor (nodes campaigning for each shard).
    #[arg(long, default_value_t = 3)]
    pub replication: usize,
    /// Session TTL in seconds (short, so a crash fails over quickly).
    #[arg(long, default_value_t = 2.0)]
    pub ttl: f64,
    /// Deal the nodes into this many zones (failure domains; 0: none): every shard's
    /// replicas span as many zones as there are, up to the replication factor.
    #[arg(long, default_value_t = 0)]
    pub zones: usize,
    /// Namespace [default: demo-<pid>].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Seconds to pause between the script's steps [default: 1 on a terminal, else 0].
    #[arg(long)]
    pub pause: Option<f64>,
    /// Load figures the nodes report for the shards they lead. zipf: Zipf figures
    /// (exponent 1.1, the hottest shard 1,000), the nodes balance by load, and the
    /// demo shows each node's load by count (after the cold start) beside its load
    /// after balancing by load.
    #[arg(long, value_enum, default_value_t = DemoLoad::None)]
    pub load: DemoLoad,
    /// Print the summary as JSON on stdout (progress lines go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Metrics.
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// `tenure demo --load`: the load figures the demo's nodes report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DemoLoad {
    /// No figures: the nodes balance by count.
    #[default]
    None,
    /// Zipf figures (exponent 1.1, the hottest shard 1,000) shuffled over the shards;
    /// the nodes balance by load.
    Zipf,
}

/// `tenure shards`.
#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ShardsCommand,
}

/// The `shards` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum ShardsCommand {
    /// Print the shard map (leader, token, replicas), leaders per node and the members.
    Status(ShardsStatusArgs),
    /// Be a node of the namespace: run the command once for every shard this node
    /// leads; print one JSON line per event; on SIGTERM or SIGINT hand every shard
    /// over (each command stopped first) and exit 0.
    Run(ShardsRunArgs),
}

/// A namespace of shards, as every node of it is configured.
#[derive(Debug, Clone, Args)]
pub struct LayoutArgs {
    /// The namespace the shard managers use, the same on every node.
    #[arg(long)]
    pub namespace: String,
    /// Its number of shards, the same on every node.
    #[arg(long)]
    pub shards: usize,
    /// Its replication factor (nodes campaigning for each shard), the same on every
    /// node.
    #[arg(long, default_value_t = 3)]
    pub replication: usize,
}

impl LayoutArgs {
    /// The validated layout.
    pub fn layout(&self) -> tenure::Result<tenure::Layout> {
        tenure::Layout::new(&self.namespace, self.shards, self.replication)
    }
}

/// `tenure shards run`.
#[derive(Debug, Clone, Args)]
#[command(allow_negative_numbers = true)]
pub struct ShardsRunArgs {
    /// The store.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// The namespace and its shards.
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// This node's id, unique in the namespace (letters, digits, `-_.`).
    #[arg(long)]
    pub id: String,
    /// This node's failure domain: every shard's replicas span as many zones as there
    /// are, up to the replication factor.
    #[arg(long)]
    pub zone: Option<String>,
    /// Seconds a member that left the list without draining (its session ended:
    /// crashed, or expired or revoked by the store while the node was fine) keeps its
    /// shards before the other nodes take them [default: a quarter of --ttl]. A node
    /// whose session the store took away opens a new one and campaigns for its shards
    /// at once; back within this, it moves nothing. A crashed node's shards are led
    /// again after its TTL plus this; 0 gives them away as soon as its member goes.
    #[arg(long, value_name = "SECONDS")]
    pub member_grace: Option<f64>,
    /// Session timing, each command's grace, metrics and health endpoints.
    #[command(flatten)]
    pub run: RunArgs,
    /// The command to run for each shard this node leads (after `--`). It gets
    /// TENURE_SHARD (the shard's name), TENURE_SHARD_INDEX, TENURE_TOKEN (the fencing
    /// token of the grant), TENURE_ELECTION and TENURE_ID in its environment, runs in
    /// its own process group, and is stopped (SIGTERM, then SIGKILL after --grace) when
    /// the shard is lost, or before it is handed over.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `tenure shards status`.
#[derive(Debug, Clone, Args)]
pub struct ShardsStatusArgs {
    /// The store.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// The namespace and its shards.
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Print the map again on every change until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Connect and request timeout in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub connect_timeout: f64,
}

/// `tenure bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// An etcd to measure (etcd://host:port or host:port).
    #[arg(long, env = "TENURE_BENCH_ETCD")]
    pub etcd: Option<String>,
    /// A Redis to measure (redis://host:port).
    #[arg(long, env = "TENURE_BENCH_REDIS")]
    pub redis: Option<String>,
    /// A ZooKeeper to measure (zk://host:port[/chroot] or host:port).
    #[arg(long, env = "TENURE_BENCH_ZK")]
    pub zk: Option<String>,
    /// A PostgreSQL database to measure (postgres://user@host:port/db).
    #[arg(long, env = "TENURE_BENCH_POSTGRES")]
    pub postgres: Option<String>,
    /// An Azure Blob container or Azurite to measure (azblob://…).
    #[arg(long, env = "TENURE_BENCH_AZURE")]
    pub azure: Option<String>,
    /// Graceful handovers per backend.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Crash failovers per backend.
    #[arg(long, default_value_t = 5)]
    pub failovers: usize,
    /// Session TTL in seconds (every backend but Azure).
    #[arg(long, default_value_t = 2.0)]
    pub ttl: f64,
    /// Session TTL in seconds on Azure (its leases last 15 to 60 s).
    #[arg(long, default_value_t = 15.0)]
    pub azure_ttl: f64,
    /// Shards for the shard manager's benchmark.
    #[arg(long, default_value_t = 256)]
    pub shards: usize,
    /// Nodes for the shard manager's benchmark.
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// Seconds of the quiet stretch in which the shard manager's store requests are counted.
    #[arg(long, default_value_t = 2.0)]
    pub quiet: f64,
    /// Skip the shard manager's benchmark.
    #[arg(long)]
    pub no_shards: bool,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "bench.svg")]
    pub svg: std::path::PathBuf,
}
