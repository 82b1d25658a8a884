//! The shard manager of one node: registers the node, follows the member list,
//! campaigns for the shards the assignment gives it, hands off the ones it no longer
//! should lead, and reports what it holds.
//!
//! This module holds the public handle ([`ShardManager`], its events and its
//! [`LoadReporter`]); the work is done by the controller task (`controller`, and the
//! sibling modules that extend it).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::{
    DynBackend, Error, ErrorKind, FencingToken, LeadershipWatch, LossReason, Result, Session,
    WorkGuard,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::assign::Plan;
use crate::config::{Layout, Shard, ShardManagerBuilder};
use crate::state::View;
pub use crate::status::ShardStatus;
use crate::view::{plan_for, ShardView};

mod bookkeeping;
mod campaigns;
mod controller;
mod handoff;
mod loads;
mod membership;
mod planning;
mod start;

/// What happens to this node's shards.
///
/// Every `Acquired` is followed by exactly one `Lost` or `HandedOff` with the same
/// token, also for a grant that ended before its `Acquired` was sent, and at close;
/// the events of one shard come in the order of its grants. Each carries the instant
/// of what it reports (`at`, tokio's clock), not when it was sent.
#[derive(Clone, Debug)]
pub enum ShardEvent {
    /// This node now leads `shard`. Do the shard's work until `stop` is cancelled,
    /// passing `token` with every write to a guarded resource (the same pair a
    /// [`Leadership`](tenure_core::Leadership) gives with `token()` and
    /// `stepping_down()`). Drop `work` (every clone of it) or call
    /// [`WorkGuard::done`] once the work has stopped: on a planned transition (a
    /// handoff, a drain, a preemption, a handover, close) the seat stays this node's
    /// until then (or until the session's step-down grace), so the next leader starts
    /// after this one stopped (contract clause 15). An application that keeps no work
    /// drops the event, and with it the guard.
    Acquired {
        /// The shard.
        shard: Shard,
        /// The grant's fencing token.
        token: FencingToken,
        /// Cancelled when this leadership ends for any reason.
        lost: CancellationToken,
        /// Cancelled when the work must stop: a planned transition began (the seat
        /// is still held) or the leadership ended.
        stop: CancellationToken,
        /// The acknowledgement of a planned transition: dropped (or `done()`) once the
        /// shard's work has stopped.
        work: WorkGuard,
        /// When the grant arrived.
        at: Instant,
    },
    /// Leadership of `shard` ended without a handoff (deadline passed, session
    /// expired, seat taken away, preempted, manager closed).
    Lost {
        /// The shard.
        shard: Shard,
        /// The grant that ended.
        token: FencingToken,
        /// Why.
        reason: LossReason,
        /// When it ended (for a missed deadline, the deadline).
        at: Instant,
    },
    /// This node gave `shard` up on purpose, after its work acknowledged (or the
    /// step-down grace ran out): the preferred node `to` was campaigning for it
    /// (rebalancing or drain), or `to` is `None` when a drain found no other node to
    /// take it.
    HandedOff {
        /// The shard.
        shard: Shard,
        /// The grant that ended.
        token: FencingToken,
        /// The node that campaigns for it.
        to: Option<String>,
        /// When the seat was let go.
        at: Instant,
    },
}

enum Command {
    Drain,
    /// A load report: shard, figure.
    Load(usize, f64),
    /// Load reports of many shards at once.
    Loads(Vec<(usize, f64)>),
    Close(oneshot::Sender<()>),
}

/// The last view and plan, for [`ShardManager::view`].
type Picture = Option<(Arc<View>, Arc<Plan>)>;

/// One node of a sharded service: leads the shards the assignment gives it.
///
/// Build it with [`ShardManager::builder`]; events arrive on the receiver returned by
/// [`start`](ShardManagerBuilder::start).
pub struct ShardManager {
    layout: Arc<Layout>,
    node_id: String,
    session: Session,
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<ShardStatus>,
    picture: Arc<Mutex<Picture>>,
    held: Arc<Mutex<HashMap<usize, LeadershipWatch>>>,
    loads: LoadReporter,
    member_grace: Duration,
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    asked: Asked,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// When this node, as the balancer by load, asked for each of its last
/// [`ASKED_KEPT`] moves, oldest first (what the move budget limits).
type Asked = Arc<Mutex<VecDeque<Instant>>>;

/// How many ask instants [`Asked`] keeps.
const ASKED_KEPT: usize = 4096;

/// Reports the load of the shards a node leads, for balance by load
/// ([`ShardManagerBuilder::balance_by_load`]). Cheap to clone: hand one to each
/// shard's worker. Reports are folded and published at most once per
/// `load_interval`, and only when a figure moved by more than a factor
/// [`DEADBAND`](crate::balance::DEADBAND) from the published one, so reporting often
/// costs nothing while loads hold steady. A report for a shard the node does not lead
/// (any more) is dropped; a new leader starts from the last published figure.
#[derive(Clone)]
pub struct LoadReporter {
    layout: Arc<Layout>,
    commands: mpsc::UnboundedSender<Command>,
}

impl fmt::Debug for LoadReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadReporter")
            .field("namespace", &self.layout.namespace.as_str())
            .finish()
    }
}

impl LoadReporter {
    /// Report `load` (a figure ≥ 0 in a unit the application picks, such as
    /// requests per second) for `shard`. Errors: `InvalidArgument` for a figure that
    /// is negative or not finite or a shard of another layout, `Closed` once the
    /// manager stopped.
    pub fn report(&self, shard: &Shard, load: f64) -> Result<()> {
        let s = self.check(shard, load)?;
        self.commands
            .send(Command::Load(s, load))
            .map_err(|_| closed())
    }

    /// Report the loads of many shards at once, as [`report`](Self::report) does for
    /// one: for a node that gathers its shards' figures in one place, one message to
    /// the manager instead of one per shard (at 10^5 shards a node, reporting shard by
    /// shard every half second was most of the work a node did). Every report is
    /// checked first: on an error nothing is reported.
    pub fn report_many<'a>(&self, loads: impl IntoIterator<Item = (&'a Shard, f64)>) -> Result<()> {
        let loads = loads
            .into_iter()
            .map(|(shard, load)| self.check(shard, load).map(|s| (s, load)))
            .collect::<Result<Vec<_>>>()?;
        if loads.is_empty() {
            return Ok(());
        }
        self.commands
            .send(Command::Loads(loads))
            .map_err(|_| closed())
    }

    /// The index of `shard` if `load` may be reported for it.
    fn check(&self, shard: &Shard, load: f64) -> Result<usize> {
        if !(load.is_finite() && load >= 0.0) {
            return Err(Error::invalid(format!(
                "load of shard {}: {load}; a finite figure of at least 0",
                shard.name()
            )));
        }
        if self.layout.shards.get(shard.index()) != Some(shard) {
            return Err(Error::invalid(format!(
                "load of shard {}: not a shard of namespace {}",
                shard.name(),
                self.layout.namespace
            )));
        }
        Ok(shard.index())
    }
}

impl fmt::Debug for ShardManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardManager")
            .field("namespace", &self.layout.namespace.as_str())
            .field("node_id", &self.node_id)
            .field("status", &*self.status.borrow())
            .finish()
    }
}

/// The receiving end of a manager's [`ShardEvent`]s.
pub type ShardEvents = mpsc::UnboundedReceiver<ShardEvent>;

impl ShardManager {
    /// A builder over `backend`.
    pub fn builder(backend: DynBackend) -> ShardManagerBuilder {
        ShardManagerBuilder::new(backend)
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Report the load of `shard`, which this node leads (see [`LoadReporter`]).
    pub fn report_load(&self, shard: &Shard, load: f64) -> Result<()> {
        self.loads.report(shard, load)
    }

    /// Report the loads of many shards at once (see [`LoadReporter::report_many`]).
    pub fn report_loads<'a>(
        &self,
        loads: impl IntoIterator<Item = (&'a Shard, f64)>,
    ) -> Result<()> {
        self.loads.report_many(loads)
    }

    /// A handle to report loads with from elsewhere (each shard's worker, say).
    pub fn load_reporter(&self) -> LoadReporter {
        self.loads.clone()
    }

    /// How long this node keeps a member that left the list without draining before
    /// its shards go to others ([`ShardManagerBuilder::member_grace`]).
    pub fn member_grace(&self) -> Duration {
        self.member_grace
    }

    /// The session this node's registration and leaderships live in.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// When this node, as the balancer by load, asked for each of its last 4096
    /// moves, oldest first: what the move budget (`LoadPolicy::max_moves` per
    /// `window`) limits. A move is made later, when the store hands the seat over.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn moves_asked(&self) -> Vec<Instant> {
        lock(&self.asked).iter().copied().collect()
    }

    /// The current counters; `status().changed()` wakes on every recomputation.
    pub fn status(&self) -> watch::Receiver<ShardStatus> {
        self.status.clone()
    }

    /// The shards this node holds, with a read-only handle on each leadership (check
    /// `is_leader()` before a write; pass `token()` to guarded resources).
    pub fn held(&self) -> Vec<(Shard, LeadershipWatch)> {
        let held = lock(&self.held);
        let mut v: Vec<_> = held
            .iter()
            .map(|(s, w)| (self.layout.shards[*s].clone(), w.clone()))
            .collect();
        v.sort_by_key(|(s, _)| s.index());
        v
    }

    /// The whole map as this node sees it from the member list (no store reads;
    /// tokens only for this node's own shards).
    pub fn view(&self) -> ShardView {
        let picture = lock(&self.picture).clone();
        let mut v = match picture {
            Some((view, plan)) => ShardView::build(&self.layout, &view, &plan),
            None => ShardView::build(
                &self.layout,
                &View::build(&[], self.layout.shards.len()),
                &plan_for(&self.layout, &View::build(&[], self.layout.shards.len())),
            ),
        };
        for (s, w) in lock(&self.held).iter() {
            if w.is_leader() {
                v.shards[*s].token = Some(w.token());
            }
        }
        v
    }

    /// The whole map with every shard's leader and token read from the store (one
    /// read per shard, 64 at a time), replicas and preferred leaders from this node's
    /// view.
    pub async fn snapshot(&self) -> Result<ShardView> {
        snapshot_from_store(&self.session, &self.layout, self.view()).await
    }

    /// Hand every leadership of this node to the next in line and return when it
    /// leads nothing (campaigns included). Other nodes take each shard over gracefully:
    /// this node resigns a shard only once its new preferred node is campaigning for
    /// it. If no other node is active, the shards are resigned without a successor.
    pub async fn drain(&self) -> Result<()> {
        if self.commands.send(Command::Drain).is_err() {
            return Err(closed());
        }
        let mut status = self.status.clone();
        loop {
            {
                let s = status.borrow_and_update();
                if s.draining && s.held == 0 && s.campaigning == 0 {
                    return Ok(());
                }
            }
            if status.changed().await.is_err() {
                return Err(closed());
            }
        }
    }

    /// Leave: stop campaigning, resign everything held, unregister and close the
    /// session. Call [`drain`](Self::drain) first for a graceful exit.
    pub async fn close(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Close(tx)).is_ok() {
            let _ = rx.await;
        }
        let task = lock(&self.task).take();
        if let Some(t) = task {
            let _ = t.await;
        }
        self.session.close().await
    }

    /// Stop as a crashed process would: no resigns, no unregistering; the store frees
    /// everything after the TTL. For tests and demos.
    pub fn abandon(&self) {
        self.session.abandon();
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

impl Drop for ShardManager {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

fn closed() -> Error {
    Error::new(ErrorKind::Closed, "shard manager closed")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Fill leaders and tokens of `view` from the store.
pub(crate) async fn snapshot_from_store(
    session: &Session,
    layout: &Layout,
    mut view: ShardView,
) -> Result<ShardView> {
    // 64 reads at a time (chunks rather than a stream combinator, so the future
    // stays `Send`).
    let mut reads = Vec::with_capacity(layout.elections.len());
    for chunk in layout.elections.chunks(64) {
        reads.extend(futures::future::join_all(chunk.iter().map(|e| session.leader(e))).await);
    }
    for (i, r) in reads.into_iter().enumerate() {
        let info = r?;
        view.shards[i].leader = info.as_ref().map(|l| l.id.clone());
        view.shards[i].token = info.map(|l| l.token);
    }
    let mut leads: HashMap<&str, usize> = HashMap::new();
    for s in &view.shards {
        if let Some(l) = &s.leader {
            *leads.entry(l.as_str()).or_default() += 1;
        }
    }
    let counts: Vec<usize> = view
        .nodes
        .iter()
        .map(|n| leads.get(n.id.as_str()).copied().unwrap_or(0))
        .collect();
    for (n, c) in view.nodes.iter_mut().zip(counts) {
        n.leads = c;
    }
    Ok(view)
}
