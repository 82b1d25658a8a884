//! Planned transitions through the CLI on real stores (contract clause 15): the old
//! leader's command stops before the successor is granted, and how long nobody leads.
//!
//! Every leader command here is [`writer_script`]: a bash loop that sends
//! `WRITE $TENURE_ELECTION $TENURE_TOKEN $TENURE_ID` to a [`GuardedResource`] (which
//! stamps each write with `CLOCK_MONOTONIC` as it receives it) about every 5 ms and, on
//! SIGTERM, keeps writing for a drain time D before it exits (a task that flushes on
//! shutdown). One run of a [`Transition`] on a [`PlannedBench`]:
//!
//! - **shutdown**: leader `a` and waiter `b` (`tenure campaign`); SIGTERM to `a`.
//! - **preemption**: leader `a`; `c` joins with `--priority 10`.
//! - **handover**: leader `a` and waiter `b`; `tenure handover --election E`.
//! - **shard drain**: two `tenure shards run` nodes share [`SHARDS`] shards
//!   (replication 2); SIGTERM to one; every shard it ran moves to the other.
//!
//! A run passes when, for every moved seat, the successor's grant (`elected` or
//! `acquired` mono_ns) comes after the old command's last write (the safety figure of
//! clause 15), the old command did drain for D after the step-down was asked
//! (its last write is at least D after `stepping_down`/`handing_off`), and the lines
//! say what the transition was (`stepping_down` reason, `resigned` cause, a higher
//! token). It measures, as a [`Sample`]:
//!
//! - the *leaderless gap*: the step-down asked (`stepping_down`, `handing_off`) → the
//!   successor's grant, which clause 15 puts at the drain plus one graceful handover;
//!   the target is D + 50 ms (Azure: D + two poll intervals, [`AZURE_POLL`]);
//! - the old command's last write → the grant;
//! - the old leader's release (`resigned`, `handed_off`) → the grant: the store's own
//!   handover.
//!
//! [`PlannedTable`] collects runs and prints one Markdown table, store × transition ×
//! drain. [`PlannedBench::unacknowledged_step_down`] checks the grace: a command that
//! ignores SIGTERM is SIGKILLed at `--grace` and only then is the successor granted.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::candidate::{CandidateProcess, Event};
use crate::cli_faults::{shards_run_args, tenure_bin};
use crate::error::Result;
use crate::fencing::{GuardedResource, WriteRecord};
use crate::os::monotonic_now_ns;
use crate::server::{
    AzuriteServer, EtcdServer, PostgresServer, RedisServer, StoreServer, ZooKeeperServer,
};
use crate::shard_chaos::{ACQUIRED, HANDED_OFF, HANDING_OFF};
use crate::shared::with_query;

/// How often the leader command writes (its pause between writes).
pub const WRITE_EVERY: Duration = Duration::from_millis(5);

/// The Azure poll interval of these runs (the backend's minimum).
pub const AZURE_POLL: Duration = Duration::from_millis(100);

/// The shards of a shard-drain run (two nodes, replication 2).
pub const SHARDS: usize = 4;

/// The `--grace` of the leaders of the transitions (SIGKILL after): above every drain.
const GRACE_SECS: &str = "3";

/// The variable that switches the planned-transition tests to the full runs: that many
/// runs of every transition with every drain of [`DRAINS`].
pub const RUNS_VAR: &str = "TENURE_PLANNED_RUNS";

/// The variable that keeps only some transitions (a comma-separated list of
/// `shutdown`, `preempt`, `handover`, `drain`), to repeat one of them.
pub const ONLY_VAR: &str = "TENURE_PLANNED_ONLY";

/// The drains of the full runs: 0 ms, 100 ms and 1 s.
pub const DRAINS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_secs(1),
];

/// A store the planned transitions run on: a local server of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlannedStore {
    /// etcd.
    Etcd,
    /// ZooKeeper.
    ZooKeeper,
    /// Redis.
    Redis,
    /// PostgreSQL.
    Postgres,
    /// Azure Blob Storage (Azurite), polling every [`AZURE_POLL`].
    Azure,
}

impl PlannedStore {
    /// Every store, in table order.
    pub const ALL: [PlannedStore; 5] = [
        PlannedStore::Etcd,
        PlannedStore::ZooKeeper,
        PlannedStore::Redis,
        PlannedStore::Postgres,
        PlannedStore::Azure,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            PlannedStore::Etcd => "etcd",
            PlannedStore::ZooKeeper => "ZooKeeper",
            PlannedStore::Redis => "Redis",
            PlannedStore::Postgres => "PostgreSQL",
            PlannedStore::Azure => "Azure (Azurite)",
        }
    }

    /// What the issue allows the leaderless gap on top of the drain: 50 ms, or two
    /// poll intervals on Azure (whose holders and waiters poll).
    pub fn target(self) -> Duration {
        match self {
            PlannedStore::Azure => 2 * AZURE_POLL,
            _ => Duration::from_millis(50),
        }
    }

    /// A bound on the gap on top of the drain far above the target, that a transition
    /// which waited for something it should not (the step-down grace, a TTL, a lease)
    /// does not pass: what the bounded test suite asserts besides the order.
    pub fn bound(self) -> Duration {
        match self {
            PlannedStore::Azure => Duration::from_secs(2),
            _ => Duration::from_secs(1),
        }
    }

    /// The session timing flags of its candidates: TTL 2 s, or on Azure (leases of
    /// 15 s at least) TTL 15 s renewed every second with a 10 s deadline.
    fn timing_args(self) -> &'static [&'static str] {
        match self {
            PlannedStore::Azure => &[
                "--ttl",
                "15",
                "--renew-interval",
                "1",
                "--renew-deadline",
                "10",
                "--connect-timeout",
                "5",
            ],
            _ => &["--ttl", "2", "--connect-timeout", "5"],
        }
    }

    /// How long a waiter is given after its `campaigning` line to be queued in the
    /// store before the leader is asked to step down.
    fn queue_settle(self) -> Duration {
        match self {
            PlannedStore::Azure => Duration::from_secs(1),
            _ => Duration::from_millis(300),
        }
    }
}

/// A planned transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transition {
    /// SIGTERM to the leader's `tenure campaign` (a waiter queued).
    Shutdown,
    /// A `--priority 10` candidate joins.
    Preemption,
    /// `tenure handover --election E` (a waiter queued).
    Handover,
    /// SIGTERM to one of two `tenure shards run` nodes.
    ShardDrain,
}

impl Transition {
    /// Every transition, in table order.
    pub const ALL: [Transition; 4] = [
        Transition::Shutdown,
        Transition::Preemption,
        Transition::Handover,
        Transition::ShardDrain,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Transition::Shutdown => "SIGTERM to the leader",
            Transition::Preemption => "`--priority 10` joins",
            Transition::Handover => "`tenure handover`",
            Transition::ShardDrain => "`shards run` drain",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Transition::Shutdown => "shutdown",
            Transition::Preemption => "preempt",
            Transition::Handover => "handover",
            Transition::ShardDrain => "drain",
        }
    }

    /// The `stepping_down` reason and `resigned` cause the old leader should print.
    fn expected_lines(self) -> (&'static str, &'static str) {
        match self {
            Transition::Shutdown => ("shutdown", "shutdown"),
            _ => ("preempted", "stepped down: preempted"),
        }
    }
}

/// A bash script for a leader command: writes `WRITE $TENURE_ELECTION $TENURE_TOKEN
/// $TENURE_ID` to the guarded resource at `addr` about every [`WRITE_EVERY`] (the pause
/// is bash's own `read -t`, so no process is started per write). With `Some(drain)`,
/// SIGTERM makes it keep writing for `drain` (from the moment its trap ran), write once
/// more once `drain` has passed and exit 0 right after that write (so its last write
/// comes at least `drain` after the trap ran); with `None` it ignores SIGTERM (so do
/// the children it starts) and writes until it is killed.
pub fn writer_script(addr: SocketAddr, drain: Option<Duration>) -> String {
    let write = format!(
        "write() {{ {{ printf 'WRITE %s %s %s\\n' \"$TENURE_ELECTION\" \"$TENURE_TOKEN\" \"$TENURE_ID\" >&3; \
           IFS= read -r -t 5 reply <&3; }} 3<>/dev/tcp/{}/{} 2>/dev/null; }}",
        addr.ip(),
        addr.port()
    );
    let pause = format!("read -t {:.3} -u $pause", WRITE_EVERY.as_secs_f64());
    let now_us = "${EPOCHREALTIME//[.,]/}";
    match drain {
        Some(drain) => format!(
            "exec {{pause}}<> <(:); {write}; \
             trap '[ -n \"$stop\" ] || stop={now_us}' TERM; \
             while :; do \
               if [ -n \"$stop\" ] && (( {now_us} - stop >= {drain_us} )); then write; exit 0; fi; \
               write; \
               {pause}; \
             done",
            drain_us = drain.as_micros(),
        ),
        None => format!(
            "trap '' TERM; exec {{pause}}<> <(:); {write}; \
             while :; do write; {pause}; done"
        ),
    }
}

/// One transition measured once: a `tenure campaign` run gives one, a shard drain one
/// per shard moved. Each figure ends at the successor's grant (`elected`/`acquired`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// From the step-down asked (`stepping_down`, `handing_off`): the leaderless gap.
    pub gap_ns: u64,
    /// From the old command's last write.
    pub after_write_ns: u64,
    /// From the old leader's release (`resigned`, `handed_off`).
    pub after_release_ns: u64,
}

/// The runs of one store × transition × drain.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The store.
    pub store: PlannedStore,
    /// The transition.
    pub transition: Transition,
    /// The drain of the old command after SIGTERM.
    pub drain: Duration,
    /// Runs made.
    pub runs: usize,
    /// The samples of the runs that passed.
    pub samples: Vec<Sample>,
    /// What went wrong in the runs that failed, with their event lines.
    pub failures: Vec<String>,
}

impl Cell {
    /// The runs that passed.
    pub fn passed(&self) -> usize {
        self.runs - self.failures.len()
    }

    /// The samples whose gap is within drain + the store's target.
    pub fn within_target(&self) -> usize {
        let limit = (self.drain + self.store.target()).as_nanos() as u64;
        self.samples.iter().filter(|s| s.gap_ns <= limit).count()
    }

    /// The samples whose gap exceeds drain + the store's [`bound`](PlannedStore::bound).
    pub fn over_bound(&self) -> Vec<Sample> {
        let limit = (self.drain + self.store.bound()).as_nanos() as u64;
        let over = self.samples.iter().filter(|s| s.gap_ns > limit);
        over.copied().collect()
    }
}

/// Runs by store × transition × drain, in the order recorded.
#[derive(Debug, Clone, Default)]
pub struct PlannedTable {
    cells: Vec<Cell>,
}

impl PlannedTable {
    /// Adds one run's outcome.
    pub fn record(
        &mut self,
        store: PlannedStore,
        transition: Transition,
        drain: Duration,
        outcome: std::result::Result<Vec<Sample>, String>,
    ) {
        let at = self
            .cells
            .iter()
            .position(|c| (c.store, c.transition, c.drain) == (store, transition, drain));
        let cell = match at {
            Some(i) => &mut self.cells[i],
            None => {
                self.cells.push(Cell {
                    store,
                    transition,
                    drain,
                    runs: 0,
                    samples: Vec::new(),
                    failures: Vec::new(),
                });
                self.cells.last_mut().expect("just pushed")
            }
        };
        cell.runs += 1;
        match outcome {
            Ok(samples) => cell.samples.extend(samples),
            Err(why) => cell.failures.push(why),
        }
    }

    /// Appends another table's cells.
    pub fn extend(&mut self, other: PlannedTable) {
        self.cells.extend(other.cells);
    }

    /// The cells.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// Every failed run, named by its cell.
    pub fn failures(&self) -> Vec<String> {
        let mut all = Vec::new();
        for c in &self.cells {
            for f in &c.failures {
                all.push(format!(
                    "{} / {} / drain {}: {f}",
                    c.store.name(),
                    c.transition.name(),
                    ms_text(c.drain.as_nanos() as u64)
                ));
            }
        }
        all
    }

    /// The table in Markdown: one row per cell.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| store | transition | drain D | runs ok | leaderless gap: asked to step down → successor granted (median / max) | gap − D | old command's last write → grant | release (`resigned`, `handed_off`) → grant | gap ≤ D + target |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for c in &self.cells {
            let drain = c.drain.as_nanos() as u64;
            let pick = |f: fn(&Sample) -> u64| c.samples.iter().map(f).collect::<Vec<u64>>();
            let gaps = pick(|s| s.gap_ns);
            let minus: Vec<i64> = gaps.iter().map(|g| *g as i64 - drain as i64).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} of {} | {} | {} | {} | {} | {} of {} (target {}) |",
                c.store.name(),
                c.transition.name(),
                ms_text(drain),
                c.passed(),
                c.runs,
                median_max(&gaps),
                median_max_signed(&minus),
                median_max(&pick(|s| s.after_write_ns)),
                median_max(&pick(|s| s.after_release_ns)),
                c.within_target(),
                c.samples.len(),
                ms_text(c.store.target().as_nanos() as u64),
            );
        }
        out
    }
}

fn ms_text(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

fn median_max(values: &[u64]) -> String {
    let signed: Vec<i64> = values.iter().map(|v| *v as i64).collect();
    median_max_signed(&signed)
}

fn median_max_signed(values: &[i64]) -> String {
    if values.is_empty() {
        return "–".into();
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let show = |ns: i64| format!("{:.0}", ns as f64 / 1e6);
    format!(
        "{} / {} ms",
        show(sorted[sorted.len() / 2]),
        show(sorted[sorted.len() - 1])
    )
}

/// What a test runs: how many runs of which transitions with which drains.
#[derive(Debug, Clone)]
pub struct PlannedPlan {
    /// Runs of each cell.
    pub runs: usize,
    /// The transitions, each with its drain, in order.
    pub cells: Vec<(Transition, Duration)>,
}

impl PlannedPlan {
    /// The bounded runs of the test suite: 3 runs of each transition, drain 1 s for the
    /// shutdown and 100 ms for the others.
    pub fn bounded() -> Self {
        let ms100 = Duration::from_millis(100);
        PlannedPlan {
            runs: 3,
            cells: vec![
                (Transition::Shutdown, Duration::from_secs(1)),
                (Transition::Preemption, ms100),
                (Transition::Handover, ms100),
                (Transition::ShardDrain, ms100),
            ],
        }
    }

    /// `runs` runs of every transition with every drain of [`DRAINS`].
    pub fn full(runs: usize) -> Self {
        let cells = Transition::ALL
            .iter()
            .flat_map(|t| DRAINS.iter().map(move |d| (*t, *d)))
            .collect();
        PlannedPlan { runs, cells }
    }

    /// [`full`](Self::full) with the number of runs [`RUNS_VAR`] gives, else
    /// [`bounded`](Self::bounded); only the transitions [`ONLY_VAR`] names, if set. A
    /// value that is not a positive number, or a name that is not a transition's,
    /// panics.
    pub fn from_env() -> Self {
        let mut plan = match std::env::var(RUNS_VAR) {
            Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Self::full(n),
                _ => panic!("{RUNS_VAR}={v:?} is not a positive number of runs"),
            },
            _ => Self::bounded(),
        };
        if let Ok(only) = std::env::var(ONLY_VAR) {
            let only: Vec<Transition> = only
                .split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(|w| {
                    let t = Transition::ALL.into_iter().find(|t| t.slug() == w);
                    t.unwrap_or_else(|| {
                        panic!("{ONLY_VAR}: {w:?} is not one of shutdown, preempt, handover, drain")
                    })
                })
                .collect();
            if !only.is_empty() {
                plan.cells.retain(|(t, _)| only.contains(t));
            }
        }
        plan
    }
}

/// One store, a guarded resource and the `tenure` binary: runs planned transitions.
#[derive(Debug)]
pub struct PlannedBench {
    store: PlannedStore,
    _server: StoreServer,
    url: String,
    env: Vec<(&'static str, String)>,
    resource: GuardedResource,
    bin: PathBuf,
    tag: String,
    next: usize,
    slow: Vec<String>,
}

/// Each shard's election with the node that runs its command and the grant's token.
type Runners = Vec<(String, (String, u64))>;

/// How long a run waits for anything before it fails (on top of the drain).
const WAIT: Duration = Duration::from_secs(30);

impl PlannedBench {
    /// Starts a local server of `store` (or the external one its variable names), the
    /// guarded resource, and finds (or builds) the `tenure` binary.
    pub async fn start(store: PlannedStore) -> Result<Self> {
        let tag = tenure_core::testing::random_prefix();
        let (server, url, env): (StoreServer, String, Vec<(&'static str, String)>) = match store {
            PlannedStore::Etcd => {
                let s: StoreServer = EtcdServer::start().await?.into();
                let url = format!("etcd://{}?prefix={tag}", s.addr());
                (s, url, vec![])
            }
            PlannedStore::ZooKeeper => {
                let s: StoreServer = ZooKeeperServer::start().await?.into();
                let url = format!("zk://{}/{tag}", s.addr());
                (s, url, vec![])
            }
            PlannedStore::Redis => {
                let s: StoreServer = RedisServer::start().await?.into();
                let url = with_query(s.endpoint(), &format!("prefix={tag}"));
                (s, url, vec![])
            }
            PlannedStore::Postgres => {
                let s: StoreServer = PostgresServer::start().await?.into();
                let schema = tag.replace('-', "_");
                let url = with_query(s.endpoint(), &format!("schema={schema}"));
                (s, url, vec![])
            }
            PlannedStore::Azure => {
                let s: StoreServer = AzuriteServer::start().await?.into();
                let url = format!(
                    "azblob:///{tag}?poll_interval_ms={}",
                    AZURE_POLL.as_millis()
                );
                let conn =
                    AzuriteServer::connection_string(s.endpoint(), AzuriteServer::ACCOUNT_KEY);
                (s, url, vec![("AZURE_STORAGE_CONNECTION_STRING", conn)])
            }
        };
        Ok(PlannedBench {
            store,
            _server: server,
            url,
            env,
            resource: GuardedResource::start().await?,
            bin: tenure_bin(),
            tag,
            next: 0,
            slow: Vec::new(),
        })
    }

    /// The median and the 99th percentile of the interval between two successive
    /// writes of one command, over every write so far.
    pub fn write_interval(&self) -> (Duration, Duration) {
        let mut by_command: std::collections::HashMap<(String, String, u64), Vec<u64>> =
            Default::default();
        for w in self.resource.writes() {
            let key = (w.writer, w.election, w.token);
            by_command.entry(key).or_default().push(w.mono_ns);
        }
        let mut intervals: Vec<u64> = by_command
            .values_mut()
            .flat_map(|at| {
                at.sort_unstable();
                at.windows(2).map(|w| w[1] - w[0]).collect::<Vec<u64>>()
            })
            .collect();
        intervals.sort_unstable();
        let at = |q: f64| {
            let i = ((intervals.len() as f64 - 1.0) * q).round() as usize;
            Duration::from_nanos(intervals.get(i).copied().unwrap_or(0))
        };
        (at(0.5), at(0.99))
    }

    /// The runs (so far) that passed but had a gap over drain + the store's
    /// [`bound`](PlannedStore::bound), each with its event lines.
    pub fn slow_runs(&self) -> &[String] {
        &self.slow
    }

    /// The store.
    pub fn store(&self) -> PlannedStore {
        self.store
    }

    /// The backend URL the candidates use.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs every cell of `plan` (each `plan.runs` times) and returns the table.
    pub async fn run_plan(&mut self, plan: &PlannedPlan) -> PlannedTable {
        let mut table = PlannedTable::default();
        for &(transition, drain) in &plan.cells {
            for i in 1..=plan.runs {
                let started = std::time::Instant::now();
                let outcome = self.run(transition, drain).await;
                let what = format!(
                    "{} / {} / drain {drain:?}, run {i} of {} ({:.1} s)",
                    self.store.name(),
                    transition.name(),
                    plan.runs,
                    started.elapsed().as_secs_f64()
                );
                match &outcome {
                    Ok(samples) => {
                        let gaps: Vec<String> = samples
                            .iter()
                            .map(|s| format!("{:.0} ms", s.gap_ns as f64 / 1e6))
                            .collect();
                        eprintln!("{what}: ok, gap {}", gaps.join(", "));
                    }
                    Err(why) => eprintln!("{what}: FAILED: {why}"),
                }
                table.record(self.store, transition, drain, outcome);
            }
        }
        table
    }

    /// One run of `transition` with a command draining for `drain`. A run that passes
    /// with a gap over drain + the store's [`bound`](PlannedStore::bound) is kept in
    /// [`slow_runs`](Self::slow_runs) with its event lines.
    pub async fn run(
        &mut self,
        transition: Transition,
        drain: Duration,
    ) -> std::result::Result<Vec<Sample>, String> {
        let limit = (drain + self.store.bound()).as_nanos() as u64;
        let (outcome, lines) = match transition {
            Transition::ShardDrain => self.shard_drain(drain).await,
            _ => self.campaign_transition(transition, drain).await,
        };
        if let Ok(samples) = &outcome {
            if let Some(worst) = samples
                .iter()
                .map(|s| s.gap_ns)
                .filter(|g| *g > limit)
                .max()
            {
                self.slow.push(format!(
                    "{} / {} / drain {drain:?}: leaderless gap {:.0} ms, over drain + {:?}\n{lines}",
                    self.store.name(),
                    transition.name(),
                    worst as f64 / 1e6,
                    self.store.bound()
                ));
            }
        }
        outcome
    }

    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{}-{what}-{}", self.tag, self.next)
    }

    fn spawn(&self, args: &[&str]) -> std::result::Result<CandidateProcess, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut env = self.env.clone();
        env.push(("RUST_LOG", "warn".into()));
        CandidateProcess::spawn(&self.bin, &args, env).map_err(|e| e.to_string())
    }

    /// `tenure campaign` for `id` in `election` with `priority`, running `script`.
    fn campaign(
        &self,
        election: &str,
        id: &str,
        priority: i32,
        grace: &str,
        script: &str,
    ) -> std::result::Result<CandidateProcess, String> {
        let priority = priority.to_string();
        let mut args = vec![
            "campaign",
            "--backend",
            &self.url,
            "--election",
            election,
            "--id",
            id,
            "--priority",
            &priority,
            "--grace",
            grace,
        ];
        args.extend_from_slice(self.store.timing_args());
        args.extend_from_slice(&["--", "bash", "-c", script]);
        self.spawn(&args)
    }

    /// The resource's writes of `writer` for `election` with `token`.
    fn writes_of(&self, writer: &str, election: &str, token: u64) -> Vec<WriteRecord> {
        let all = self.resource.writes().into_iter();
        all.filter(|w| w.writer == writer && w.election == election && w.token == token)
            .collect()
    }

    /// Waits until `writer` wrote for `election` with `token`.
    async fn wait_write(
        &self,
        writer: &str,
        election: &str,
        token: u64,
    ) -> std::result::Result<(), String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.writes_of(writer, election, token).is_empty() {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{writer}'s command wrote nothing for {election} with token {token} within {WAIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Leader `a`, then the transition, then the successor's grant.
    async fn campaign_transition(
        &mut self,
        transition: Transition,
        drain: Duration,
    ) -> (std::result::Result<Vec<Sample>, String>, String) {
        let election = self.fresh(transition.slug());
        let script = writer_script(self.resource.addr(), Some(drain));
        let a_id = format!("a{}", self.next);
        let a = match self.campaign(&election, &a_id, 0, GRACE_SECS, &script) {
            Ok(a) => a,
            Err(why) => return (Err(why), String::new()),
        };
        let mut procs = vec![a];
        let outcome = self
            .transition_with(transition, drain, &election, &a_id, &script, &mut procs)
            .await;
        let lines = lines(&procs);
        (outcome.map_err(|why| format!("{why}\n{lines}")), lines)
    }

    async fn transition_with(
        &self,
        transition: Transition,
        drain: Duration,
        election: &str,
        a_id: &str,
        script: &str,
        procs: &mut Vec<CandidateProcess>,
    ) -> std::result::Result<Vec<Sample>, String> {
        let elected_a = wait_event(&procs[0], Event::ELECTED, WAIT).await?;
        let token_a = elected_a.token.ok_or("a's elected line has no token")?;
        self.wait_write(a_id, election, token_a).await?;
        let n = self.next;
        match transition {
            Transition::Preemption => {
                let c = self.campaign(election, &format!("c{n}"), 10, GRACE_SECS, script)?;
                procs.push(c);
            }
            Transition::Shutdown | Transition::Handover => {
                let b = self.campaign(election, &format!("b{n}"), 0, GRACE_SECS, script)?;
                wait_event(&b, "campaigning", WAIT).await?;
                procs.push(b);
                tokio::time::sleep(self.store.queue_settle()).await;
                if transition == Transition::Shutdown {
                    let pid = procs[0].pid().ok_or("a exited early")?;
                    // SAFETY: kill(2) has no memory-safety preconditions.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                } else {
                    self.handover(election).await?;
                }
            }
            Transition::ShardDrain => unreachable!("not a campaign transition"),
        }
        let successor = &procs[1];
        let elected = wait_event(successor, Event::ELECTED, WAIT + drain).await?;
        let stepping = wait_event(&procs[0], "stepping_down", WAIT).await?;
        let resigned = wait_event(&procs[0], Event::RESIGNED, WAIT + drain).await?;
        let (reason, cause) = transition.expected_lines();
        if stepping.reason.as_deref() != Some(reason) {
            return Err(format!("a's stepping_down reason is not {reason:?}"));
        }
        let got_cause = resigned.extra.get("cause").and_then(|c| c.as_str());
        if got_cause != Some(cause) {
            return Err(format!(
                "a's resigned cause is {got_cause:?}, not {cause:?}"
            ));
        }
        if resigned.extra.get("aborted").and_then(|a| a.as_bool()) != Some(false) {
            return Err("a's task was aborted at the grace".into());
        }
        if elected.token <= elected_a.token {
            return Err("the successor's token is not above a's".into());
        }
        let sample = judge(
            &self.writes_of(a_id, election, token_a),
            drain,
            stepping.mono_ns,
            resigned.mono_ns,
            elected.mono_ns,
        )?;
        Ok(vec![sample])
    }

    /// `tenure handover --election E`; tried again (a few times) if nobody waits yet.
    async fn handover(&self, election: &str) -> std::result::Result<(), String> {
        let mut last = String::new();
        for _ in 0..5 {
            let mut h =
                self.spawn(&["handover", "--backend", &self.url, "--election", election])?;
            let status = h.wait_exit(WAIT).await.map_err(|e| e.to_string())?;
            // Let the reader collect its lines.
            let _ = h.wait_for_kind(Event::EXITED, Duration::from_secs(5)).await;
            if status.success() {
                return Ok(());
            }
            last = format!("tenure handover: {status}: {}", h.stderr_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last)
    }

    /// `tenure shards run` node `id` of `namespace`.
    fn shards_node(
        &self,
        namespace: &str,
        id: &str,
        script: &str,
    ) -> std::result::Result<CandidateProcess, String> {
        let mut args = shards_run_args(&self.url, namespace, SHARDS, id);
        args.extend(["--grace", GRACE_SECS].map(String::from));
        args.extend(self.store.timing_args().iter().map(|a| a.to_string()));
        args.extend(["--", "bash", "-c", script].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(&args)
    }

    /// Two nodes share the shards; SIGTERM one: every shard it ran moves to the other.
    async fn shard_drain(
        &mut self,
        drain: Duration,
    ) -> (std::result::Result<Vec<Sample>, String>, String) {
        let namespace = self.fresh("drain");
        let script = writer_script(self.resource.addr(), Some(drain));
        let n = self.next;
        let (a_id, b_id) = (format!("na{n}"), format!("nb{n}"));
        let started = self
            .shards_node(&namespace, &a_id, &script)
            .and_then(|a| Ok(vec![a, self.shards_node(&namespace, &b_id, &script)?]));
        let mut procs = match started {
            Ok(procs) => procs,
            Err(why) => return (Err(why), String::new()),
        };
        let outcome = self.drain_with(drain, &a_id, &mut procs).await;
        let lines = lines(&procs);
        (outcome.map_err(|why| format!("{why}\n{lines}")), lines)
    }

    async fn drain_with(
        &self,
        drain: Duration,
        a_id: &str,
        procs: &mut [CandidateProcess],
    ) -> std::result::Result<Vec<Sample>, String> {
        let settled = self.settle(procs).await?;
        let moving: Vec<(String, u64)> = settled
            .iter()
            .filter(|(_, (id, _))| id == a_id)
            .map(|(e, (_, t))| (e.clone(), *t))
            .collect();
        if moving.is_empty() {
            return Err(format!("{a_id} runs no shard once settled"));
        }
        let term_at = monotonic_now_ns();
        let status = procs[0]
            .terminate_within(WAIT + drain)
            .await
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{a_id} exited with {status} after SIGTERM"));
        }
        let mut samples = Vec::new();
        for (election, token) in &moving {
            let on = |kind: &'static str| {
                let election = election.clone();
                let token = *token;
                move |e: &Event| e.is(kind) && e.election == election && e.token == Some(token)
            };
            let handing = wait_for(&procs[0], on(HANDING_OFF), WAIT).await?;
            let handed = wait_for(&procs[0], on(HANDED_OFF), WAIT).await?;
            let election_b = election.clone();
            let acquired = wait_for(
                &procs[1],
                move |e: &Event| e.is(ACQUIRED) && e.election == election_b && e.mono_ns > term_at,
                WAIT,
            )
            .await?;
            if acquired.token <= Some(*token) {
                return Err(format!("{election}: the new grant's token is not higher"));
            }
            let sample = judge(
                &self.writes_of(a_id, election, *token),
                drain,
                handing.mono_ns,
                handed.mono_ns,
                acquired.mono_ns,
            )
            .map_err(|why| format!("{election}: {why}"))?;
            samples.push(sample);
        }
        Ok(samples)
    }

    /// Waits until every shard has exactly one command running, both nodes run some,
    /// every running command has written, and that held for half a second; returns
    /// each shard's runner and token.
    async fn settle(
        &self,
        procs: &[CandidateProcess],
    ) -> std::result::Result<std::collections::BTreeMap<String, (String, u64)>, String> {
        let deadline = tokio::time::Instant::now() + 3 * WAIT;
        let mut since: Option<(tokio::time::Instant, Runners)> = None;
        loop {
            let mut running: std::collections::BTreeMap<String, Vec<(String, u64)>> =
                Default::default();
            for p in procs {
                for e in p.events() {
                    let key = (e.id.clone(), e.token.unwrap_or(0));
                    if e.is("command_started") {
                        running.entry(e.election.clone()).or_default().push(key);
                    } else if e.is("command_exited") {
                        if let Some(list) = running.get_mut(&e.election) {
                            list.retain(|k| *k != key);
                        }
                    }
                }
            }
            running.retain(|_, v| !v.is_empty());
            let whole = running.len() == SHARDS && running.values().all(|v| v.len() == 1);
            let ids: std::collections::BTreeSet<&str> = running
                .values()
                .flat_map(|v| v.iter().map(|(id, _)| id.as_str()))
                .collect();
            let written = running.iter().all(|(e, v)| {
                v.iter()
                    .all(|(id, token)| !self.writes_of(id, e, *token).is_empty())
            });
            if whole && ids.len() == 2 && written {
                let now: Runners = running
                    .into_iter()
                    .map(|(e, mut v)| (e, v.remove(0)))
                    .collect();
                match &since {
                    Some((at, seen)) if *seen == now => {
                        if at.elapsed() >= Duration::from_millis(500) {
                            return Ok(now.into_iter().collect());
                        }
                    }
                    _ => since = Some((tokio::time::Instant::now(), now)),
                }
            } else {
                since = None;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the two nodes did not settle with one command per shard within {:?}",
                    3 * WAIT
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A leader whose command ignores SIGTERM (`--grace 1`), a waiter, SIGTERM to the
    /// leader: the command is SIGKILLed at the grace, and the waiter is granted after
    /// its last write. Returns (step-down asked → last write, step-down asked → grant).
    pub async fn unacknowledged_step_down(&mut self) -> std::result::Result<(u64, u64), String> {
        let election = self.fresh("deaf");
        let n = self.next;
        let a_id = format!("a{n}");
        let deaf = writer_script(self.resource.addr(), None);
        let polite = writer_script(self.resource.addr(), Some(Duration::ZERO));
        let a = self.campaign(&election, &a_id, 0, "1", &deaf)?;
        let mut procs = vec![a];
        let outcome = async {
            let elected_a = wait_event(&procs[0], Event::ELECTED, WAIT).await?;
            let token_a = elected_a.token.ok_or("no token")?;
            self.wait_write(&a_id, &election, token_a).await?;
            let b = self.campaign(&election, &format!("b{n}"), 0, GRACE_SECS, &polite)?;
            wait_event(&b, "campaigning", WAIT).await?;
            procs.push(b);
            tokio::time::sleep(self.store.queue_settle()).await;
            let pid = procs[0].pid().ok_or("a exited early")?;
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            let elected = wait_event(&procs[1], Event::ELECTED, WAIT).await?;
            let stepping = wait_event(&procs[0], "stepping_down", WAIT).await?;
            let resigned = wait_event(&procs[0], Event::RESIGNED, WAIT).await?;
            let writes = self.writes_of(&a_id, &election, token_a);
            let last = writes.iter().map(|w| w.mono_ns).max().ok_or("no writes")?;
            let grace = Duration::from_secs(1).as_nanos() as u64;
            if last < stepping.mono_ns + grace * 9 / 10 {
                return Err(format!(
                    "the command's last write came {:.0} ms after stepping_down, before the 1 s grace",
                    (last.saturating_sub(stepping.mono_ns)) as f64 / 1e6
                ));
            }
            if elected.mono_ns <= last {
                return Err(format!(
                    "the successor was granted {:.1} ms before the old command's last write",
                    (last - elected.mono_ns) as f64 / 1e6
                ));
            }
            if elected.mono_ns < stepping.mono_ns + grace {
                return Err("the successor was granted before the grace".into());
            }
            if resigned.mono_ns > elected.mono_ns {
                return Err("resigned is stamped after the successor's grant".into());
            }
            // The CLI logs the SIGKILL (RUST_LOG=warn).
            if !procs[0].stderr_tail().contains("ignored SIGTERM") {
                return Err("a did not log that its command ignored SIGTERM".into());
            }
            Ok((last - stepping.mono_ns, elected.mono_ns - stepping.mono_ns))
        }
        .await;
        outcome.map_err(|why| format!("{why}\n{}", lines(&procs)))
    }
}

/// Checks one moved seat and measures it: the old command's `writes` (its last one
/// must come at least `drain` after the step-down was asked at `asked`, and before the
/// `granted` instant), the release at `released`.
fn judge(
    writes: &[WriteRecord],
    drain: Duration,
    asked: u64,
    released: u64,
    granted: u64,
) -> std::result::Result<Sample, String> {
    let last = writes
        .iter()
        .map(|w| w.mono_ns)
        .max()
        .ok_or("the old command never wrote")?;
    let ms = |ns: u64| ns as f64 / 1e6;
    if granted <= last {
        return Err(format!(
            "the successor was granted {:.1} ms before the old command's last write \
             (last write at {last}, grant at {granted})",
            ms(last - granted)
        ));
    }
    if last < asked + drain.as_nanos() as u64 {
        return Err(format!(
            "the old command's last write came {:.1} ms after the step-down was asked, \
             less than its drain of {drain:?}",
            ms(last.saturating_sub(asked))
        ));
    }
    if released > granted || asked > released {
        return Err(format!(
            "out of order: step-down asked at {asked}, released at {released}, granted at {granted}"
        ));
    }
    Ok(Sample {
        gap_ns: granted - asked,
        after_write_ns: granted - last,
        after_release_ns: granted - released,
    })
}

async fn wait_event(
    c: &CandidateProcess,
    kind: &'static str,
    within: Duration,
) -> std::result::Result<Event, String> {
    wait_for(c, move |e: &Event| e.is(kind), within).await
}

async fn wait_for(
    c: &CandidateProcess,
    pred: impl Fn(&Event) -> bool,
    within: Duration,
) -> std::result::Result<Event, String> {
    c.wait_for_event(pred, within)
        .await
        .map_err(|e| format!("{}: {e}", c.label()))
}

/// Every process's event lines (as JSON, as printed) and stderr tail, for a failure.
fn lines(procs: &[CandidateProcess]) -> String {
    let mut out = String::new();
    for p in procs {
        let _ = writeln!(out, "{}:", p.label());
        for e in p.events() {
            let line = serde_json::to_string(&e).unwrap_or_else(|_| e.to_string());
            let tag = if e.synthetic { " (harness)" } else { "" };
            let _ = writeln!(out, "  {line}{tag}");
        }
        let stderr = p.stderr_tail();
        if !stderr.is_empty() {
            let _ = writeln!(out, "  stderr: {stderr}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_drains_for_the_time_given_or_ignores_sigterm() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 4321));
        let s = writer_script(addr, Some(Duration::from_millis(100)));
        assert!(s.contains("/dev/tcp/127.0.0.1/4321"), "{s}");
        assert!(s.contains(">= 100000"), "{s}");
        assert!(s.contains("read -t 0.005"), "{s}");
        let s = writer_script(addr, None);
        assert!(s.starts_with("trap '' TERM"), "{s}");
    }

    #[test]
    fn judge_wants_the_grant_after_the_last_write() {
        let w = |at: u64| WriteRecord {
            election: "e".into(),
            token: 1,
            writer: "a".into(),
            accepted: true,
            highest_before: None,
            mono_ns: at,
        };
        let d = Duration::from_nanos(100);
        let s = judge(&[w(50), w(250)], d, 100, 260, 300).unwrap();
        assert_eq!(
            (s.gap_ns, s.after_write_ns, s.after_release_ns),
            (200, 50, 40)
        );
        assert!(judge(&[w(50), w(350)], d, 100, 260, 300).is_err());
        // Drained less than asked.
        assert!(judge(&[w(50), w(150)], d, 100, 260, 300).is_err());
    }

    #[test]
    fn the_table_counts_runs_and_targets() {
        let mut t = PlannedTable::default();
        let d = Duration::from_millis(100);
        let s = |gap_ms: u64| Sample {
            gap_ns: gap_ms * 1_000_000,
            after_write_ns: 1,
            after_release_ns: 1,
        };
        let (st, tr) = (PlannedStore::Redis, Transition::Handover);
        t.record(st, tr, d, Ok(vec![s(120)]));
        t.record(st, tr, d, Ok(vec![s(200)]));
        t.record(st, tr, d, Err("boom".into()));
        let c = &t.cells()[0];
        assert_eq!((c.runs, c.passed(), c.within_target()), (3, 2, 1));
        let md = t.markdown();
        assert!(md.contains("| 2 of 3 |"), "{md}");
        assert!(md.contains("| 1 of 2 (target 50 ms) |"), "{md}");
        assert_eq!(t.failures().len(), 1);
    }
}
