//! The shard manager of one node: registers the node, follows the member list,
//! campaigns for the shards the assignment gives it, hands off the ones it no longer
//! should lead, and reports what it holds.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tenure_core::{
    Candidate, DynBackend, ElectionName, Error, ErrorKind, FencingToken, Leadership,
    LeadershipWatch, LossReason, Member, MemberStream, Result, Session, StepDownReason, WorkGuard,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::assign::Plan;
use crate::balance::{self, LoadPolicy};
use crate::config::{HandoffHook, Layout, Shard, ShardManagerBuilder};
use crate::state::{Changed, OwnState, ShardSet, View};
pub use crate::status::ShardStatus;
use crate::view::{plan_after, plan_by_load_with, plan_for, ShardView};

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

enum Internal {
    /// A campaign got its permit and is about to reach the store.
    Started(usize),
    Granted(usize, Result<Leadership>),
    /// The answer to one batch of tries for free shards, shard by shard, and the
    /// session's generation when the batch was sent.
    Tried(Vec<usize>, Result<Vec<Option<Leadership>>>, u64),
    Lost(usize, FencingToken, LossReason, Instant),
    /// The balancer's moves, worked out off the controller task for these figures
    /// and members.
    Rebalanced(RebalanceKey, Vec<(usize, u32)>, Duration),
}

/// What a rebalance was worked out for: the figures' epoch and the member list.
type RebalanceKey = (u64, Vec<crate::assign::NodeSpec>);

enum Command {
    Drain,
    /// A load report: shard, figure.
    Load(usize, f64),
    /// Load reports of many shards at once.
    Loads(Vec<(usize, f64)>),
    Close(oneshot::Sender<()>),
}

struct Held {
    watch: LeadershipWatch,
    leadership: Option<Leadership>,
    /// Set once this node asked the grant to step down for a handoff or drain: the
    /// node it goes to. Its end is then reported as `HandedOff`.
    handing_off: Option<Option<String>>,
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

impl ShardManagerBuilder {
    /// Validate, open a session, register this node and start following the
    /// namespace. Returns the manager and its event receiver.
    pub async fn start(self) -> Result<(ShardManager, ShardEvents)> {
        let (layout, node_id) = self.validate()?;
        let member_grace = self.grace();
        let layout = Arc::new(layout);
        let candidate = Candidate::new(&node_id)?;
        let session = Session::open(self.backend.clone(), self.timing.clone()).await?;
        let shards = layout.shards.len();
        let nonce = crate::hash::key_hash(&session.id())
            ^ crate::hash::mix64(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
            );
        let mut mine = OwnState::new(shards, self.weight, nonce).in_zone(self.zone.clone());
        if self.balance.is_some() {
            // Balancing by load: as the balancer, this node's (empty) list of moves
            // says so to the others.
            mine.set_moves(Some(Vec::new()));
        }
        let initial = mine.value();
        let member = Member::new(&node_id, &initial)?;
        session.register(&layout.namespace, &member).await?;
        let members = session.watch_members(&layout.namespace).await?;

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (status_tx, status_rx) = watch::channel(ShardStatus::default());
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        let (publish_tx, publish_rx) = watch::channel(initial);
        let picture = Arc::new(Mutex::new(None));
        let held_watches = Arc::new(Mutex::new(HashMap::new()));
        let asked = Asked::default();
        let span =
            tracing::info_span!("tenure.shard", namespace = %layout.namespace, node = %node_id);

        tokio::spawn(
            publisher(
                session.clone(),
                layout.namespace.clone(),
                node_id.clone(),
                publish_rx,
                self.publish_interval,
            )
            .instrument(span.clone()),
        );
        let controller = Controller {
            layout: layout.clone(),
            node_id: node_id.clone(),
            session: session.clone(),
            candidate,
            draining: false,
            view: Arc::new(View::build(&[], shards)),
            plan: None,
            planned_view: Arc::new(View::build(&[], shards)),
            next_plan_at: Instant::now(),
            held: ByShard::default(),
            campaigning: ByShard::default(),
            trying: ShardSet::new(shards),
            to_try: VecDeque::new(),
            trying_in_flight: 0,
            permits: Arc::new(tokio::sync::Semaphore::new(self.campaign_limit)),
            permit_count: self.campaign_limit,
            failures: ByShard::default(),
            retries: BinaryHeap::new(),
            retry_at: Some(Instant::now() + self.startup_quiet),
            startup: Some(Startup {
                ids: Vec::new(),
                since: Instant::now(),
                quiet: self.startup_quiet,
            }),
            pending: VecDeque::new(),
            queued: ShardSet::new(shards),
            mine,
            mine_changed: false,
            me: None,
            replan_at: None,
            kept_since: None,
            plan_took: Duration::ZERO,
            dirty: Dirty::all(shards),
            view_dirty: Dirty::all(shards),
            unsettled: Counted::new(shards),
            misplaced: Counted::new(shards),
            bucket: Bucket::new(self.handoff_rate, self.handoff_burst),
            before_handoff: self.before_handoff.clone(),
            internal_tx,
            events: events_tx,
            publish: publish_tx,
            status: status_tx,
            picture: picture.clone(),
            held_watches: held_watches.clone(),
            version: 0,
            balance: self.balance.clone(),
            my_moves: BTreeMap::new(),
            issued: VecDeque::new(),
            asked: asked.clone(),
            balance_at: None,
            balance_due: false,
            pending_loads: ByShard::default(),
            load_interval: self.load_interval,
            load_flush_at: None,
            last_flush: Instant::now() - self.load_interval,
            figures_changed_at: Instant::now(),
            figures_pending_since: None,
            figures_pending: 0,
            to_issue: VecDeque::new(),
            to_issue_for: None,
            rebalancing: false,
            next_rebalance_at: Instant::now(),
            vacancy_seen: false,
            moves_progressed_at: Instant::now(),
            balancing: 0,
            loads_withheld: false,
            member_grace,
            listed: Vec::new(),
            absent: BTreeMap::new(),
            grace_at: None,
            generation: session.generation(),
            after_reopen_try: Vec::new(),
            claims: BTreeMap::new(),
        };
        let task = tokio::spawn(
            controller
                .run(members, internal_rx, commands_rx)
                .instrument(span),
        );
        Ok((
            ShardManager {
                layout: layout.clone(),
                node_id,
                session,
                commands: commands_tx.clone(),
                status: status_rx,
                picture,
                held: held_watches,
                loads: LoadReporter {
                    layout: layout.clone(),
                    commands: commands_tx.clone(),
                },
                member_grace,
                asked,
                task: Mutex::new(Some(task)),
            },
            events_rx,
        ))
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

/// Publishes this node's latest state as its member value, at most once per
/// `interval`, retrying failures.
async fn publisher(
    session: Session,
    namespace: tenure_core::ElectionName,
    node_id: String,
    mut rx: watch::Receiver<String>,
    interval: Duration,
) {
    let mut last_sent = rx.borrow_and_update().clone();
    loop {
        if rx.changed().await.is_err() {
            return;
        }
        let mut attempt = 0u32;
        loop {
            let value = rx.borrow_and_update().clone();
            if value == last_sent {
                break;
            }
            let member = match Member::new(&node_id, &value) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(error = %e, "cannot publish this node's state");
                    break;
                }
            };
            match session.register(&namespace, &member).await {
                Ok(()) => {
                    last_sent = value;
                    tokio::time::sleep(interval).await;
                }
                Err(e) if e.kind() == ErrorKind::Closed => return,
                Err(e) => {
                    let delay = session.timing().retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(error = %e, ?delay, "could not publish this node's state");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// A token bucket for handoffs.
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, burst: u32) -> Self {
        Bucket {
            rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + (now - self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
    }

    fn take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token is there.
    fn next(&self) -> Instant {
        let missing = (1.0 - self.tokens).max(0.0);
        self.at + Duration::from_secs_f64(missing / self.rate)
    }
}

/// How long the member list must hold still before a plan kept across changes (see
/// [`follows_plan`]) is computed again from it.
const PLAN_QUIET: Duration = Duration::from_millis(100);

/// A plan kept across changes is computed again at the latest this long (or eight
/// times what the last plan took, if more) after the first of them.
const PLAN_KEPT_AT_MOST: Duration = Duration::from_secs(2);

/// Whether going from `old` to `new` (the same nodes; `changed` the shards whose claims
/// changed) only did what `plan` asked: every new holder of a changed shard is its
/// preferred node, the holder it had, or none. Such a change leaves the plan as it is,
/// and computing it again (O(P) or more) is work for nothing. Anything else (a node's
/// weight or drain flag, a shard taken by another node) calls for a new plan.
fn follows_plan(old: &View, new: &View, plan: &Plan, changed: &[usize]) -> bool {
    old.nodes == new.nodes
        && changed.iter().all(|&s| {
            let h = new.holders.get(s);
            h.is_none() || h == old.holders.get(s) || h == plan.preferred(s)
        })
}

/// When the controller must wake by itself: for a retry (failed campaigns, the end of
/// the startup quiet, a paced plan), for the plan kept across member changes to be
/// computed again from the latest list, or for the next queued handoff. The replan
/// has a wake-up of its own: when it shared the retry's, a retry due earlier used it
/// up, the replan never came, and a node could keep a plan of an older list than the
/// others' while nothing else changed — nodes that disagree on a shard's preferred
/// node wait on each other for ever.
fn next_wake(
    retry: Option<Instant>,
    replan: Option<Instant>,
    handoff: Option<Instant>,
) -> Option<Instant> {
    [retry, replan, handoff].into_iter().flatten().min()
}

/// The member list a reconcile acts on and the plan it follows, and whether that list
/// is the latest (so its changes since the last plan are looked at now).
///
/// Node numbers in a plan index the list it was computed for. With a plan for the
/// latest list (`plan`, computed for `planned`), that pair. While a new plan is on its
/// way (`plan` is `None`; planning is paced by its cost, seconds at 10^5 shards), the
/// last plan still indexes the latest list if the nodes are the same, so it is used
/// with the latest list: a holder hands a shard over as soon as the shard's node
/// campaigns for it, rather than after the next plan. When the nodes changed, the last
/// pair (`picture`) stands until the new plan comes.
fn acting_on(
    plan: Option<&Arc<Plan>>,
    planned: &Arc<View>,
    picture: Option<&(Arc<View>, Arc<Plan>)>,
    latest: &Arc<View>,
) -> Option<(Arc<View>, Arc<Plan>, bool)> {
    match (plan, picture) {
        (Some(p), _) => Some((planned.clone(), p.clone(), true)),
        (None, Some((v, p))) if v.nodes == latest.nodes => Some((latest.clone(), p.clone(), true)),
        (None, Some((v, p))) => Some((v.clone(), p.clone(), false)),
        (None, None) => None,
    }
}

/// Whether a node of `old` is missing from `new` or has started to drain (both sorted
/// by id): its shards need new leaders soon.
fn node_going(old: &View, new: &View) -> bool {
    old.nodes
        .iter()
        .any(|n| match new.nodes.binary_search_by(|m| m.id.cmp(&n.id)) {
            Ok(i) => new.nodes[i].draining && !n.draining,
            Err(_) => true,
        })
}

/// Hashes a shard index with one multiplication: SipHash over the controller's maps
/// was a third of its time at 40,000 shards.
#[derive(Default)]
struct ShardHasher(u64);

impl std::hash::Hasher for ShardHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by shard index.
type ByShard<V> = HashMap<usize, V, BuildHasherDefault<ShardHasher>>;

/// Free shards asked for in one `try_campaign_many` (the session splits it further into
/// the backend's own batch size).
const TRY_BATCH: usize = 1024;

/// Shards to look at again: each marked once, or all of them.
struct Dirty {
    all: bool,
    marked: ShardSet,
    list: Vec<usize>,
    shards: usize,
}

impl Dirty {
    fn all(shards: usize) -> Self {
        Dirty {
            all: true,
            marked: ShardSet::new(shards),
            list: Vec::new(),
            shards,
        }
    }

    fn mark(&mut self, s: usize) {
        if !self.all && !self.marked.contains(s) {
            self.marked.set(s, true);
            self.list.push(s);
        }
    }

    fn mark_all(&mut self) {
        self.all = true;
    }

    /// Move `other`'s marks into this one.
    fn absorb(&mut self, other: &mut Dirty) {
        if other.all {
            self.all = true;
        }
        for s in other.take() {
            self.mark(s);
        }
    }

    /// The marked shards (every shard after `mark_all`), clearing the marks.
    fn take(&mut self) -> Vec<usize> {
        for &s in &self.list {
            self.marked.set(s, false);
        }
        if std::mem::take(&mut self.all) {
            self.list.clear();
            (0..self.shards).collect()
        } else {
            std::mem::take(&mut self.list)
        }
    }
}

/// A set of shards with its size.
struct Counted {
    set: ShardSet,
    count: usize,
}

impl Counted {
    fn new(shards: usize) -> Self {
        Counted {
            set: ShardSet::new(shards),
            count: 0,
        }
    }

    fn set(&mut self, s: usize, on: bool) {
        if self.set.contains(s) != on {
            self.set.set(s, on);
            if on {
                self.count += 1;
            } else {
                self.count -= 1;
            }
        }
    }
}

struct Startup {
    ids: Vec<String>,
    since: Instant,
    quiet: Duration,
}

struct Controller {
    layout: Arc<Layout>,
    node_id: String,
    session: Session,
    candidate: Candidate,
    draining: bool,
    view: Arc<View>,
    /// The plan for `planned_view`; `None` once the view moved on.
    plan: Option<Arc<Plan>>,
    /// The view the last plan was computed for (node numbers in a plan index it).
    planned_view: Arc<View>,
    /// Plans of large namespaces cost milliseconds; the next is computed no earlier
    /// than this, so a busy member list cannot keep a node computing.
    next_plan_at: Instant,
    held: ByShard<Held>,
    campaigning: ByShard<JoinHandle<()>>,
    /// Shards asked for in a batch of tries (in flight, or waiting in `to_try` for
    /// their batch): free in the view, so taken without queueing, many per store
    /// round trip.
    trying: ShardSet,
    to_try: VecDeque<usize>,
    /// Seats of the batches of tries sent and not answered yet.
    trying_in_flight: usize,
    /// Bounds the campaigns in flight, so a node that must take thousands of shards
    /// at once does not swamp the store (and its own renewals).
    permits: Arc<tokio::sync::Semaphore>,
    /// The permits in all (`campaign_limit`): a batch of tries takes one per seat,
    /// up to this many.
    permit_count: usize,
    /// Failed campaigns: shard → (attempts, not before).
    failures: ByShard<(u32, Instant)>,
    /// The failures' retry times, earliest first (an entry whose shard has failed
    /// again or succeeded since is passed over), so a reconcile looks only at the
    /// shards due rather than at every failure.
    retries: BinaryHeap<Reverse<(Instant, usize)>>,
    retry_at: Option<Instant>,
    /// Until the member list first holds still, no campaigns start (so that nodes
    /// started together do not all grab shards from partial views and hand them
    /// back a moment later).
    startup: Option<Startup>,
    /// Shards to hand off, checked again (and their new node found) when their turn
    /// comes. `queued` marks the shards in it.
    pending: VecDeque<usize>,
    queued: ShardSet,
    /// This node's published state: what it holds, and the campaigns that hold a
    /// permit (the ones other nodes may see as campaigning); `mine_changed` when it
    /// differs from the last one handed to the publisher.
    mine: OwnState,
    mine_changed: bool,
    /// This node's number in the view of the last reconcile.
    me: Option<u32>,
    /// When to plan again from the latest member list: set when a new list only
    /// moved shards the way the plan asked, so the plan was kept.
    replan_at: Option<Instant>,
    /// When the plan was first kept across a change since it was computed.
    kept_since: Option<Instant>,
    /// How long the last plan took to compute.
    plan_took: Duration,
    /// Shards to look at in the next reconcile (grants, losses, retries, plan moves).
    dirty: Dirty,
    /// Shards the member list changed since the last plan: looked at once a plan for
    /// that list is in place.
    view_dirty: Dirty,
    /// Shards not led by their preferred node in the last reconcile's view and plan.
    unsettled: Counted,
    /// Shards held that the plan gives to another node (or none).
    misplaced: Counted,
    bucket: Bucket,
    /// Awaited before the seats of a handoff are resigned.
    before_handoff: Option<HandoffHook>,
    internal_tx: mpsc::UnboundedSender<Internal>,
    events: mpsc::UnboundedSender<ShardEvent>,
    publish: watch::Sender<String>,
    status: watch::Sender<ShardStatus>,
    picture: Arc<Mutex<Picture>>,
    held_watches: Arc<Mutex<HashMap<usize, LeadershipWatch>>>,
    version: u64,
    /// Balance by load, with this policy (`None`: by count).
    balance: Option<LoadPolicy>,
    /// As the balancer: the leaders it asks for, shard → (node, when asked).
    my_moves: BTreeMap<usize, (String, Instant)>,
    /// When each move of the current window was asked for, oldest first.
    issued: VecDeque<Instant>,
    /// The last asks, for the tests of the move budget (`moves_asked`).
    asked: Asked,
    /// When the balancer looks again by itself (the window frees budget, a move
    /// goes stale).
    balance_at: Option<Instant>,
    /// The balancer looks at the next reconcile (a new plan came).
    balance_due: bool,
    /// Load reports not yet published, shard → latest figure.
    pending_loads: ByShard<f64>,
    load_interval: Duration,
    /// When the pending reports are published.
    load_flush_at: Option<Instant>,
    last_flush: Instant,
    /// When a published load figure last changed in the view.
    figures_changed_at: Instant,
    /// When the figures first changed since the balancer last started a rebalance,
    /// and how many codes changed since.
    figures_pending_since: Option<Instant>,
    figures_pending: usize,
    /// As the balancer: the moves of the last rebalance not yet asked for, and the
    /// figures and members it was worked out for.
    to_issue: VecDeque<(usize, String)>,
    to_issue_for: Option<RebalanceKey>,
    /// A rebalance is being worked out on the blocking pool.
    rebalancing: bool,
    /// When the next rebalance may start: as long after the last one ended as it
    /// took, so the balancer spends at most half a core on it however often the
    /// figures change.
    next_rebalance_at: Instant,
    /// A shard had no leader at a step since the last rebalance was worked out.
    vacancy_seen: bool,
    /// When the balancer last saw one of its moves made.
    moves_progressed_at: Instant,
    /// [`ShardStatus::balancing`] as of the last balancer step.
    balancing: usize,
    /// This node's member value leaves its load codes out (see `OwnState`).
    loads_withheld: bool,
    /// How long a member that left the list without draining stays in the view.
    member_grace: Duration,
    /// The last member list the store gave.
    listed: Vec<Member>,
    /// Members gone from the list (not draining), kept in the view with their last
    /// value until their grace ends: id → (member, when it went).
    absent: BTreeMap<String, (Member, Instant)>,
    /// When the first grace of `absent` ends.
    grace_at: Option<Instant>,
    /// The session's generation last seen: it grows when the session was re-opened
    /// after the store expired or revoked it.
    generation: u64,
    /// Shards whose batch of tries met the ended session before it was re-opened:
    /// tried again once it is.
    after_reopen_try: Vec<usize>,
    /// Shards this node lost because the store ended its session, still published as
    /// held until it has them again, finds them taken, or the member grace passes
    /// (see `end_grant`): shard → when the claim ends.
    claims: BTreeMap<usize, Instant>,
}

impl Controller {
    async fn run(
        mut self,
        mut members: MemberStream,
        mut internal: mpsc::UnboundedReceiver<Internal>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut members_open = true;
        let mut losses = self.session.losses();
        let mut losses_open = true;
        loop {
            // Whether a member list came in this pass: lists that arrive together are
            // applied once, as the last of them (a member stream may coalesce); each is
            // noted, for the members that left (`note_list`).
            let mut listed = false;
            let handoffs = (!self.pending.is_empty()).then(|| self.bucket.next());
            let wake = next_wake(self.retry_at, self.replan_at, handoffs);
            let claim_at = self.claims.values().min().copied();
            let wake = [
                wake,
                self.load_flush_at,
                self.balance_at,
                self.grace_at,
                claim_at,
            ]
            .into_iter()
            .flatten()
            .min();
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                m = members.next(), if members_open => match m {
                    Some(Ok(list)) => {
                        self.note_list(list);
                        listed = true;
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "member watch error"),
                    None => {
                        // The watch ended (store gone?): try to open a new one.
                        match self.session.watch_members(&self.layout.namespace).await {
                            Ok(s) => members = s,
                            Err(e) => {
                                tracing::warn!(error = %e, "could not watch members again");
                                members_open = false;
                                self.retry_at = Some(Instant::now() + self.session.timing().retry.max);
                            }
                        }
                    }
                },
                msg = internal.recv() => match msg {
                    Some(m) => self.handle(m),
                    None => return,
                },
                loss = losses.next(), if losses_open => match loss {
                    Some(loss) => {
                        if let Some(s) = self.layout.shard_of(&loss.election) {
                            self.handle(Internal::Lost(s, loss.token, loss.reason, loss.at));
                        }
                    }
                    // The session is closed: its grants ended with it.
                    None => losses_open = false,
                },
                cmd = commands.recv() => match cmd {
                    Some(Command::Load(s, load)) => self.report(s, load),
                    Some(Command::Loads(loads)) => {
                        loads.into_iter().for_each(|(s, load)| self.report(s, load))
                    }
                    Some(Command::Drain) => {
                        self.draining = true;
                        let claimed: Vec<usize> = self.claims.keys().copied().collect();
                        claimed.into_iter().for_each(|s| self.end_claim(s));
                        self.mine.set_draining(true);
                        self.mine_changed = true;
                        self.dirty.mark_all();
                    }
                    Some(Command::Close(done)) => {
                        self.shutdown().await;
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        self.shutdown().await;
                        return;
                    }
                },
                _ = sleep => {
                    if self.replan_at.is_some_and(|at| at <= Instant::now()) {
                        self.replan_at = None;
                        self.plan = None;
                    }
                    if self.balance_at.is_some_and(|at| at <= Instant::now()) {
                        self.balance_at = None;
                        self.balance_due = true;
                    }
                    if self.grace_at.is_some_and(|at| at <= Instant::now()) {
                        // A member's grace ended: the view again, without it.
                        listed = true;
                    }
                    self.end_claims_due();
                    if !members_open {
                        if let Ok(s) = self.session.watch_members(&self.layout.namespace).await {
                            members = s;
                            members_open = true;
                        }
                    }
                    self.retry_at = None;
                }
            }
            // Take whatever else is ready before recomputing once.
            while let Ok(m) = internal.try_recv() {
                self.handle(m);
            }
            while let Some(Some(Ok(list))) = members.next().now_or_never() {
                self.note_list(list);
                listed = true;
            }
            // Every loss that is waiting, so that the shards of a session the store
            // ended are asked for again in one batch, not one try per loss.
            while losses_open {
                match losses.next().now_or_never() {
                    Some(Some(loss)) => {
                        if let Some(s) = self.layout.shard_of(&loss.election) {
                            self.handle(Internal::Lost(s, loss.token, loss.reason, loss.at));
                        }
                    }
                    Some(None) => losses_open = false,
                    None => break,
                }
            }
            if listed {
                let list = self.with_absent();
                self.set_members(&list);
            }
            self.after_reopen();
            self.refresh_plan().await;
            self.reconcile();
        }
    }

    /// Compute the plan for the latest view, unless the last one was computed too
    /// recently for its cost; big plans run on the blocking pool so renewals and
    /// other tasks keep running meanwhile.
    async fn refresh_plan(&mut self) {
        if self.plan.is_some() {
            return;
        }
        let now = Instant::now();
        if now < self.next_plan_at {
            let at = self.next_plan_at;
            self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            return;
        }
        let previous = lock(&self.picture).as_ref().map(|(_, p)| p.clone());
        let (layout, view) = (self.layout.clone(), self.view.clone());
        let started = std::time::Instant::now();
        let plan = if layout.shards.len() >= 20_000 {
            let previous = previous.clone();
            match tokio::task::spawn_blocking(move || {
                plan_after(previous.as_deref(), &layout, &view)
            })
            .await
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "computing the assignment failed");
                    return;
                }
            }
        } else {
            plan_after(previous.as_deref(), &layout, &view)
        };
        // Spend at most about a fifth of the time computing plans.
        self.plan_took = started.elapsed();
        self.next_plan_at = Instant::now() + self.plan_took * 4;
        self.kept_since = None;
        // Look again at the shards whose preferred node moved.
        match previous {
            Some(prev) if prev.shards() == plan.shards() => {
                for s in 0..plan.shards() {
                    if prev.preferred(s) != plan.preferred(s) {
                        self.view_dirty.mark(s);
                    }
                }
            }
            _ => self.view_dirty.mark_all(),
        }
        self.planned_view = self.view.clone();
        self.plan = Some(plan);
        self.balance_due = true;
    }

    /// Take in a member list from the store: a member of the last list that is not in
    /// this one and was not draining there is kept, with its last value, for the
    /// member grace (see `with_absent`); one that is back is no longer absent. Every
    /// list is noted, also those a pass then applies only the last of, so that a
    /// member that said it was leaving (draining) just before it went is let go.
    fn note_list(&mut self, list: Vec<Member>) {
        let now = Instant::now();
        let present: std::collections::HashSet<&str> = list.iter().map(|m| m.id()).collect();
        if !self.member_grace.is_zero() {
            for m in &self.listed {
                if present.contains(m.id())
                    || self.absent.contains_key(m.id())
                    || crate::state::draining_in(m.value())
                {
                    continue;
                }
                tracing::debug!(member = m.id(), grace = ?self.member_grace, "member left the list; kept for the grace");
                self.absent.insert(m.id().to_string(), (m.clone(), now));
            }
        }
        if self.listed.iter().any(|m| m.id() == self.node_id) && !present.contains(&*self.node_id) {
            // This node's own member is gone, so its session is (the store ended it):
            // have the session find out now rather than at its next renewal, so that
            // it is re-opened, the member registered again and the shards campaigned
            // for at once.
            tracing::warn!("this node's member left the list; checking the session now");
            self.session.renew_now();
        }
        self.absent.retain(|id, _| !present.contains(id.as_str()));
        self.listed = list;
    }

    /// The member list the view is built from: the store's last list and the members
    /// that left it within their grace, with their last value. A member that leaves
    /// without draining stays in the plan for `member_grace`, so that a node whose
    /// session the store took away (and which is back at once: its session finds out
    /// and re-opens, registers again and campaigns, see `note_list` and
    /// `after_reopen`) keeps its shards: nobody else campaigns for them meanwhile, and
    /// nothing moves away and back. A crashed node's shards go to others once its
    /// grace ends.
    fn with_absent(&mut self) -> Vec<Member> {
        let now = Instant::now();
        let grace = self.member_grace;
        self.absent.retain(|id, (_, since)| {
            let keep = now < *since + grace;
            if !keep {
                tracing::info!(member = %id, ?grace, "member gone for the grace; its shards go to others");
            }
            keep
        });
        self.grace_at = self.absent.values().map(|(_, since)| *since + grace).min();
        let mut all = self.listed.clone();
        all.extend(self.absent.values().map(|(m, _)| m.clone()));
        all
    }

    /// Whether node `n` of `view` is a member that left the list and is kept for its
    /// grace: it campaigns for nothing, whatever its last value says.
    fn is_absent(&self, view: &View, n: u32) -> bool {
        !self.absent.is_empty()
            && view
                .nodes
                .get(n as usize)
                .is_some_and(|node| self.absent.contains_key(&node.id))
    }

    /// After the session was re-opened (the store had expired or revoked it): the
    /// campaigns that failed on the old session are tried again now, not at their
    /// back-off, and as tries for free shards where the view has them free (a batch
    /// of tries sent through the revoked session failed as a whole).
    fn after_reopen(&mut self) {
        let generation = self.session.generation();
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        let failed: Vec<usize> = self.failures.keys().copied().collect();
        tracing::info!(
            retried = failed.len(),
            "session re-opened; campaigning again for this node's shards"
        );
        for s in failed {
            self.failures.remove(&s);
            self.dirty.mark(s);
        }
        for s in std::mem::take(&mut self.after_reopen_try) {
            self.dirty.mark(s);
        }
    }

    /// This node no longer claims shard `s` it lost to the store (see `end_grant`):
    /// unless it holds it again, it is published as not held.
    fn end_claim(&mut self, s: usize) {
        if self.claims.remove(&s).is_some() && !self.held.contains_key(&s) {
            self.set_held(s, false);
            self.dirty.mark(s);
        }
    }

    /// End the claims whose member grace has passed.
    fn end_claims_due(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .claims
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(s, _)| *s)
            .collect();
        if !due.is_empty() {
            tracing::info!(
                shards = due.len(),
                "shards lost to the store not led again within the member grace; no longer claimed"
            );
        }
        due.into_iter().for_each(|s| self.end_claim(s));
    }

    fn set_members(&mut self, list: &[Member]) {
        if let Some(st) = &mut self.startup {
            let ids: Vec<String> = list.iter().map(|m| m.id().to_string()).collect();
            if ids != st.ids {
                st.ids = ids;
                st.since = Instant::now();
                let at = st.since + st.quiet;
                self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            }
        }
        let (view, changed) = View::update(&self.view, list, self.layout.shards.len());
        if node_going(&self.view, &view) {
            // A node went (its shards may be leaderless until this plan names their
            // next leaders) or drains (it waits for this plan to hand its shards
            // over): plan at once, whatever the cost of the last plan. Joins and the
            // churn of holdings keep the pacing.
            self.next_plan_at = Instant::now();
        }
        // Under balance by load, a new move changes the plan where the move is (the
        // kept plan follows it, see `plan_with_new_moves`); a new figure alone changes
        // no leader the plan has chosen.
        let loads_same = view.moves.is_none() || view.load_epoch == self.view.load_epoch;
        if view.figures_epoch != self.view.figures_epoch {
            self.figures_changed_at = Instant::now();
            self.figures_pending_since
                .get_or_insert(self.figures_changed_at);
            self.figures_pending += view.figures_changed;
        }
        let mut moved = Vec::new();
        let keep = match (&changed, &self.plan) {
            (Changed::Shards(shards), Some(plan)) if loads_same => {
                follows_plan(&self.view, &view, plan, shards).then(|| plan.clone())
            }
            (Changed::Shards(shards), Some(plan)) => {
                crate::view::plan_with_new_moves(plan, &self.view, &view)
                    .filter(|(p, _)| follows_plan(&self.view, &view, p, shards))
                    .map(|(p, m)| {
                        moved = m;
                        p
                    })
            }
            _ => None,
        };
        match changed {
            Changed::All => self.view_dirty.mark_all(),
            Changed::Shards(shards) => shards.into_iter().for_each(|s| self.view_dirty.mark(s)),
        }
        moved.iter().for_each(|s| self.view_dirty.mark(*s));
        self.view = Arc::new(view);
        if let Some(plan) = keep {
            // The plan still holds for the new list (same node numbers); plan again
            // from the latest list once it has been quiet a while, so that every node
            // ends on the plan of the same list — and, by load, at the latest a while
            // after the first change it was kept across, for lists that never hold
            // still (10^6 shards whose moves go on for a minute).
            self.plan = Some(plan);
            self.planned_view = self.view.clone();
            let now = Instant::now();
            self.replan_at = Some(now + PLAN_QUIET);
            if self.view.moves.is_some() {
                // By load (by count, plans kept across handoffs were fine as they were).
                let kept_since = *self.kept_since.get_or_insert(now);
                let latest = kept_since + (self.plan_took * 8).max(PLAN_KEPT_AT_MOST);
                self.replan_at = self.replan_at.map(|at| at.min(latest));
            }
            if !loads_same || !self.my_moves.is_empty() || !self.to_issue.is_empty() {
                // New figures, or moves made or taken back: the balancer looks again.
                self.balance_due = true;
            }
        } else {
            self.plan = None;
            self.replan_at = None;
        }
    }

    fn handle(&mut self, msg: Internal) {
        match &msg {
            Internal::Started(s) | Internal::Granted(s, _) | Internal::Lost(s, ..) => {
                self.dirty.mark(*s)
            }
            Internal::Tried(shards, ..) => shards.iter().for_each(|s| self.dirty.mark(*s)),
            Internal::Rebalanced(..) => {}
        }
        match msg {
            Internal::Rebalanced(key, moves, took) => {
                self.rebalancing = false;
                self.next_rebalance_at = Instant::now() + took;
                // Moves for other members are dropped. Figures that changed meanwhile
                // make them a little stale, but they are asked for (each is checked
                // then) while the next rebalance is worked out for the new figures: at
                // 10^6 shards some figure changes during every rebalance.
                let same_members = key.1 == self.view.nodes;
                tracing::debug!(
                    moves = moves.len(),
                    same_members,
                    same_figures = key.0 == self.view.figures_epoch,
                    took_ms = took.as_millis() as u64,
                    "rebalance worked out"
                );
                if same_members {
                    self.to_issue = moves
                        .into_iter()
                        .filter_map(|(s, n)| key.1.get(n as usize).map(|m| (s, m.id.clone())))
                        .collect();
                    self.to_issue_for = Some(key);
                }
                self.balance_due = true;
            }
            Internal::Tried(shards, answers, generation) => {
                self.trying_in_flight = self.trying_in_flight.saturating_sub(shards.len());
                for &s in &shards {
                    self.trying.set(s, false);
                }
                match answers {
                    // Granted seats count as grants. The others were taken after all
                    // (the view was behind): queue for them now, rather than try
                    // again while the view still says they are free. The next look
                    // withdraws the campaign if the shard is no longer this node's.
                    Ok(answers) => {
                        for (s, answer) in shards.into_iter().zip(answers) {
                            match answer {
                                Some(leadership) => {
                                    self.handle(Internal::Granted(s, Ok(leadership)))
                                }
                                None if !self.held.contains_key(&s) => {
                                    // Taken: this node's claim on it (if it lost it to
                                    // the store) is over.
                                    self.end_claim(s);
                                    self.start_campaign(s)
                                }
                                None => {}
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::SessionExpired => {
                        // Sent through the session the store had just ended (the
                        // losses arrive before the re-open): no back-off, the batch goes
                        // again through the re-opened session, at once if that is open
                        // already, else as soon as it is (`after_reopen`).
                        tracing::debug!(shards = shards.len(), "a batch of tries met the ended session; trying again after the re-open");
                        if self.session.generation() != generation {
                            shards.into_iter().for_each(|s| self.dirty.mark(s));
                        } else {
                            self.after_reopen_try.extend(shards);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(shards = shards.len(), error = %e, "a batch of campaigns failed");
                        for s in shards {
                            self.campaign_failed(s);
                        }
                    }
                }
            }
            Internal::Started(s) => {
                if self.campaigning.contains_key(&s) {
                    self.set_campaigning(s, true);
                }
            }
            Internal::Granted(s, Ok(leadership)) => {
                // A second campaign for the same shard (started after the first was
                // withdrawn too late to stop its grant) can only fail now.
                if let Some(t) = self.campaigning.remove(&s) {
                    t.abort();
                }
                self.set_campaigning(s, false);
                self.failures.remove(&s);
                // Its loss arrives through the session's loss feed (no task per shard).
                let watch = leadership.watch();
                let token = leadership.token();
                if let Some(old) = self.held.get(&s) {
                    // A grant of the same shard still held with an older token: its
                    // seat is gone (tokens only grow); end it first.
                    let old = old.watch.token();
                    self.end_grant(
                        s,
                        old,
                        LossReason::Revoked("granted again".into()),
                        Instant::now(),
                    );
                }
                let work = leadership.work_guard();
                if let Some(hook) = &self.before_handoff {
                    // The hook is one more holder of the work: a handoff waits for it.
                    let hook = hook.clone();
                    let (shard, guard) = (self.layout.shards[s].clone(), leadership.work_guard());
                    let stop = leadership.stepping_down();
                    tokio::spawn(async move {
                        stop.cancelled().await;
                        // Only a planned transition waits for the hook; a loss does not.
                        if guard.step_down_reason().is_some() {
                            hook(&shard, token).await;
                        }
                        drop(guard);
                    });
                }
                let event = ShardEvent::Acquired {
                    shard: self.layout.shards[s].clone(),
                    token,
                    lost: leadership.lost(),
                    stop: leadership.stepping_down(),
                    work,
                    at: leadership.granted_at(),
                };
                let ended = leadership.loss_reason().zip(leadership.lost_at());
                lock(&self.held_watches).insert(s, watch.clone());
                self.claims.remove(&s);
                self.set_held(s, true);
                // A new leader starts from the last figure published for the shard.
                let last = self.view.loads.get(s);
                self.set_load(s, last);
                self.held.insert(
                    s,
                    Held {
                        watch,
                        leadership: Some(leadership),
                        handing_off: None,
                    },
                );
                tracing::debug!(shard = s, %token, "acquired");
                let _ = self.events.send(event);
                // Lost before it was registered here (its loss may have been read from
                // the session's feed first, and passed over): end it now, so that it
                // is not kept and published as held.
                if let Some((reason, at)) = ended {
                    self.end_grant(s, token, reason, at);
                }
            }
            Internal::Granted(s, Err(e)) => {
                if self.held.contains_key(&s) {
                    tracing::debug!(shard = s, error = %e, "a second campaign for a held shard ended");
                } else {
                    tracing::warn!(shard = s, error = %e, "campaign failed");
                }
                self.campaign_failed(s);
            }
            Internal::Lost(s, token, reason, at) => self.end_grant(s, token, reason, at),
        }
    }

    /// The grant `token` of shard `s` ended (at `at`): forget it and report its end
    /// once, as `HandedOff` if this node was handing it off, else as `Lost`. A report
    /// of a grant not held (an older one, or one already ended) is dropped.
    fn end_grant(&mut self, s: usize, token: FencingToken, reason: LossReason, at: Instant) {
        if self.held.get(&s).is_none_or(|h| h.watch.token() != token) {
            return;
        }
        let Some(held) = self.held.remove(&s) else {
            return;
        };
        if held.handing_off.is_none()
            && matches!(reason, LossReason::SessionExpired | LossReason::Revoked(_))
            && !self.draining
            && !self.member_grace.is_zero()
        {
            // The store ended this node's seat (or its whole session); the node
            // re-opens the session if need be and asks for the shard again at once. Until it has it again
            // (or finds it taken, or the member grace passes), its published state
            // still claims the shard, so that every node's plan keeps it here, as the
            // plan keeps a vanished member's shards for the grace: dropping the claim
            // had the plans give the shards whose best-ranked replica is another node
            // to that node, and 16 of 384 shards moved when etcd revoked 3 nodes' leases.
            self.claims.insert(s, Instant::now() + self.member_grace);
        } else {
            self.claims.remove(&s);
            self.set_held(s, false);
        }
        self.set_load(s, 0);
        self.misplaced.set(s, false);
        self.dirty.mark(s);
        lock(&self.held_watches).remove(&s);
        let shard = self.layout.shards[s].clone();
        let event = match held.handing_off {
            Some(to) => {
                tracing::debug!(shard = s, %token, to = ?to, "handed off");
                ShardEvent::HandedOff {
                    shard,
                    token,
                    to,
                    at,
                }
            }
            None => {
                tracing::info!(shard = s, %token, %reason, "leadership lost");
                ShardEvent::Lost {
                    shard,
                    token,
                    reason,
                    at,
                }
            }
        };
        let _ = self.events.send(event);
    }

    /// Bring this node in line with the plan, looking only at the shards that may
    /// have changed since the last time (see [`Dirty`]); counters are kept as it goes.
    fn reconcile(&mut self) {
        let acting = acting_on(
            self.plan.as_ref(),
            &self.planned_view,
            lock(&self.picture).as_ref(),
            &self.view,
        );
        let Some((view, plan, current)) = acting else {
            return;
        };
        if current {
            self.dirty.absorb(&mut self.view_dirty);
        }
        *lock(&self.picture) = Some((view.clone(), plan.clone()));
        let me = view.index_of(&self.node_id);
        if me != self.me {
            self.me = me;
            self.dirty.mark_all();
        }
        let now = Instant::now();
        if let Some(st) = &self.startup {
            if me.is_some() && now >= st.since + st.quiet {
                self.startup = None;
                self.dirty.mark_all();
            } else {
                let at = st.since + st.quiet;
                self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            }
        }
        while let Some(&Reverse((at, s))) = self.retries.peek() {
            if at > now {
                self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
                break;
            }
            self.retries.pop();
            if self.failures.get(&s).is_some_and(|(_, due)| *due == at) {
                self.dirty.mark(s);
            }
        }
        for s in self.dirty.take() {
            self.examine(s, &view, &plan, now);
        }
        self.try_free_shards(&view, &plan, now);
        self.run_handoffs(&view, &plan);
        self.flush_loads(now);
        if self.balance_due {
            self.balance_step(&view, &plan, now);
        }
        if self.mine_changed {
            self.mine_changed = false;
            self.publish.send_replace(self.mine.value());
            let withheld = self.mine.loads_withheld();
            if withheld && !self.loads_withheld {
                tracing::warn!(
                    held = self.held.len(),
                    limit = tenure_core::MAX_MEMBER_VALUE_LEN,
                    "load figures not published: with them this node's member value could pass \
                     the limit; the balancer counts its shards as without load until it holds fewer"
                );
            }
            self.loads_withheld = withheld;
        }
        self.version += 1;
        let target = me.map_or(0, |m| plan.load(m) as usize);
        let status = ShardStatus {
            members: view.nodes.len(),
            held: self.held.len(),
            campaigning: self.campaigning.len(),
            target: if self.draining { 0 } else { target },
            pending_handoffs: self.misplaced.count,
            draining: self.draining,
            settled: self.unsettled.count == 0,
            balancing: self.balancing,
            version: self.version,
        };
        crate::metrics::record(&self.layout, &self.node_id, &status, &view);
        self.status.send_replace(status);
    }

    /// Look at shard `s`: campaign for it if it is this node's and not yet held or
    /// asked for, withdraw a campaign that is no longer wanted, queue a handoff the
    /// plan asks for, and update the counters.
    fn examine(&mut self, s: usize, view: &View, plan: &Plan, now: Instant) {
        let pref = plan.preferred(s);
        self.unsettled.set(
            s,
            view.holders.get(s).is_none() || view.holders.get(s) != pref,
        );
        let mine = self.is_mine(s, plan);
        let holding = self.held.contains_key(&s);
        self.misplaced.set(s, holding && !mine);
        if mine {
            let blocked = self.failures.get(&s).is_some_and(|(_, at)| *at > now);
            let starting = self.startup.is_some();
            let asked = self.campaigning.contains_key(&s) || self.trying.contains(s);
            if !holding && !asked && !blocked && !starting {
                if self.free_in(view, s) && !self.failures.contains_key(&s) {
                    self.trying.set(s, true);
                    self.to_try.push_back(s);
                } else {
                    self.start_campaign(s);
                }
            }
            return;
        }
        if let Some(task) = self.campaigning.remove(&s) {
            task.abort();
            self.set_campaigning(s, false);
        }
        if self.claims.contains_key(&s) {
            self.end_claim(s);
        }
        let stepping = self.held.get(&s).is_some_and(|h| h.handing_off.is_some());
        if holding
            && !stepping
            && !self.queued.contains(s)
            && self.handoff_of(s, view, plan).is_some()
        {
            self.queued.set(s, true);
            self.pending.push_back(s);
        }
    }

    /// Whether shard `s`, which this node does not hold, is free as far as `view` knows:
    /// nobody claims it, or only this node's own published state does, which is behind
    /// (a grant this node lost, such as every seat of a session the store revoked, is
    /// claimed until its next publication). Free shards are asked for in batches of
    /// tries, many per store round trip; a seat found taken after all is queued for.
    fn free_in(&self, view: &View, s: usize) -> bool {
        match view.holders.get(s) {
            None => true,
            Some(h) => Some(h) == self.me && !self.held.contains_key(&s),
        }
    }

    /// Whether the plan gives shard `s` to this node (never while it drains).
    fn is_mine(&self, s: usize, plan: &Plan) -> bool {
        !self.draining && self.me.is_some() && plan.preferred(s) == self.me
    }

    /// Whether held shard `s` should go now: `Some(to)` when its preferred node `to`
    /// campaigns for it, or `Some(None)` when draining and the plan (which already
    /// sees this node draining) has nobody else for it.
    fn handoff_of(&self, s: usize, view: &View, plan: &Plan) -> Option<Option<String>> {
        match plan.preferred(s) {
            Some(t)
                if Some(t) != self.me
                    && view.states[t as usize].campaigning.contains(s)
                    && !self.is_absent(view, t) =>
            {
                Some(Some(view.nodes[t as usize].id.clone()))
            }
            None if self.draining => Some(None),
            _ => None,
        }
    }

    /// A campaign for shard `s` ended in an error: unless the shard is held after all,
    /// try again after the retry policy's delay for its attempts so far.
    fn campaign_failed(&mut self, s: usize) {
        self.campaigning.remove(&s);
        self.set_campaigning(s, false);
        if self.held.contains_key(&s) {
            return;
        }
        let (attempt, _) = self
            .failures
            .get(&s)
            .copied()
            .unwrap_or((0, Instant::now()));
        let at = Instant::now() + self.session.timing().retry.delay(attempt);
        self.failures.insert(s, (attempt.saturating_add(1), at));
        self.retries.push(Reverse((at, s)));
        self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
    }

    fn set_campaigning(&mut self, s: usize, on: bool) {
        if self.mine.set_campaigning(s, on) {
            self.mine_changed = true;
        }
    }

    /// Publish `code` as shard `s`'s load (0: none).
    fn set_load(&mut self, s: usize, code: u8) {
        if self.mine.set_load(s, code) {
            self.mine_changed = true;
        }
        if code == 0 {
            self.pending_loads.remove(&s);
        }
    }

    /// A load report for shard `s`: kept until the next publication of loads, at
    /// most one per `load_interval`.
    fn report(&mut self, s: usize, load: f64) {
        if !self.held.contains_key(&s) {
            tracing::trace!(
                shard = s,
                load,
                "load report for a shard not led here; dropped"
            );
            return;
        }
        self.pending_loads.insert(s, load);
        if self.load_flush_at.is_none() {
            self.load_flush_at = Some((self.last_flush + self.load_interval).max(Instant::now()));
        }
    }

    /// Publish the pending load reports if it is time: each only if it moved out of
    /// the deadband around the published figure.
    fn flush_loads(&mut self, now: Instant) {
        if self.load_flush_at.is_none_or(|at| at > now) {
            return;
        }
        self.load_flush_at = None;
        self.last_flush = now;
        let pending: Vec<(usize, f64)> = self.pending_loads.drain().collect();
        for (s, load) in pending {
            if !self.held.contains_key(&s) {
                continue;
            }
            if let Some(code) = balance::republish(self.mine.load(s), load, balance::DEADBAND) {
                self.set_load(s, code);
            }
        }
    }

    /// As the balancer (the first active node of the view, balancing by load): drop
    /// the moves done, impossible or stale, and ask for the moves that bring the nodes
    /// back within the tolerance, as far as the window's budget allows. Any other
    /// node withdraws moves it asked for while it was the balancer.
    fn balance_step(&mut self, view: &Arc<View>, plan: &Arc<Plan>, now: Instant) {
        self.balance_due = false;
        let Some(policy) = self.balance.clone() else {
            return;
        };
        let balancer = view
            .nodes
            .iter()
            .position(|n| !n.draining && n.weight > 0)
            .map(|b| b as u32);
        let levels_known = view.loads.reported > 0;
        if self.draining || balancer.is_none() || balancer != self.me || !levels_known {
            self.to_issue.clear();
            self.to_issue_for = None;
            self.balancing = 0;
            if !self.my_moves.is_empty() {
                self.my_moves.clear();
                self.publish_moves();
            }
            return;
        }
        // A move is dropped when it was not made within two TTLs and a window while
        // none was: moves are made as fast as the cluster can, which at 10^6 shards
        // on this machine is a hundred or so a second, and dropping them for being
        // slow only cancelled them in flight.
        let stale = self.session.timing().ttl * 2 + policy.window;
        let before = self.my_moves.len();
        let made = self.my_moves.iter().any(|(&s, (to, _))| {
            view.index_of(to)
                .is_some_and(|n| view.holders.get(s) == Some(n))
        });
        if made {
            self.moves_progressed_at = now;
        }
        let progressed = self.moves_progressed_at;
        let mut expired = false;
        self.my_moves.retain(|&s, (to, at)| {
            let due = view
                .index_of(to)
                .is_some_and(|n| view.holders.get(s) != Some(n) && plan.replicas(s).contains(&n));
            let late = now >= (*at).max(progressed) + stale;
            expired |= due && late;
            due && !late
        });
        let mut changed = self.my_moves.len() != before;
        // A rebalance is worked out once for the same figures and members: carried
        // out, its result is its own fixpoint. It is worked out again when the leaders
        // may not be where it left them: a move was not made, or shards went without
        // a leader (placed anew by the plan) since it was; the latter once all of its
        // moves are done, as handoffs leave shards leaderless for a moment.
        let vacant = view.leads.iter().sum::<usize>() < self.layout.shards.len();
        self.vacancy_seen |= vacant;
        let done = self.to_issue.is_empty() && self.my_moves.is_empty() && !self.rebalancing;
        if expired || (self.vacancy_seen && !vacant && done) {
            tracing::debug!(expired, "rebalancing again: leaders may have moved");
            self.vacancy_seen = false;
            self.to_issue_for = None;
        }
        while self
            .issued
            .front()
            .is_some_and(|t| *t + policy.window <= now)
        {
            self.issued.pop_front();
        }
        // Nodes publish their figures up to a load interval apart: a rebalance waits
        // until the figures have held still that long, so that a shift is acted on
        // once, whole. Among many shards some figure may always be changing, so where
        // few have (at most a tenth of the shards: a trickle or a shift, not a cold
        // start whose figures come in for seconds) it waits no longer than two
        // intervals after the first change since the last one began.
        let still_at = self.figures_changed_at + self.load_interval;
        let trickle = self.figures_pending <= (self.layout.shards.len() / 10).max(1);
        let ready_at = match self.figures_pending_since {
            Some(t) if trickle => still_at.min(t + self.load_interval * 2),
            _ => still_at,
        };
        let ready = now >= ready_at;
        // The whole rebalance is worked out once for the figures and members it saw,
        // and its moves are asked for as the budget allows. Working it out again after
        // each budget's worth moved went back and forth: a partial rebalance is not
        // on the way to the whole one (on Redis, 200 shards at 5 moves a second,
        // max/mean swung between 1.57 and 1.61 for 30 s).
        // It runs on the blocking pool (0.2 s at 10^5 shards on 10 nodes, 3.5 s at
        // 10^6, 23 s at 10^6 on 100 nodes), and its moves come back as
        // `Internal::Rebalanced`.
        let key = (view.figures_epoch, view.nodes.clone());
        let fresh = self.to_issue_for.as_ref() == Some(&key);
        if self.to_issue_for.as_ref().is_none_or(|k| k.1 != key.1) {
            self.to_issue.clear();
        }
        // The last rebalance's moves are asked for while its figures are the latest,
        // or once the new ones are ready to be worked out too; at most `max_moves` in
        // a window, and no more than that many not made yet (at 10^6 shards moves
        // were asked for faster than this machine made them, went stale after two
        // TTLs and had the whole rebalance worked out again, over and over).
        let budget = if fresh || ready {
            policy
                .max_moves
                .saturating_sub(self.issued.len())
                .min(policy.max_moves.saturating_sub(self.my_moves.len()))
        } else {
            0
        };
        let mut new = 0;
        while new < budget {
            let Some((s, to)) = self.to_issue.pop_front() else {
                break;
            };
            // Still a move to make (the target a replica that does not hold it)?
            let due = view
                .index_of(&to)
                .is_some_and(|n| view.holders.get(s) != Some(n) && plan.replicas(s).contains(&n));
            if due {
                self.my_moves.insert(s, (to, now));
                self.issued.push_back(now);
                let mut asked = lock(&self.asked);
                if asked.len() == ASKED_KEPT {
                    asked.pop_front();
                }
                asked.push_back(now);
                new += 1;
            }
        }
        if new > 0 {
            tracing::debug!(
                moves = new,
                left = self.to_issue.len(),
                budget,
                "balancing by load"
            );
            changed = true;
        }
        // The next rebalance starts from the moves asked for so far, these included
        // (started before them, it undid none of them: a move of the last rebalance,
        // for older figures, was then made after a new one had found nothing to do).
        let moves: Vec<(usize, u32)> = self
            .my_moves
            .iter()
            .filter_map(|(s, (to, _))| view.index_of(to).map(|n| (*s, n)))
            .collect();
        let paced = now < self.next_rebalance_at;
        if ready && !fresh && !self.rebalancing && !paced {
            self.rebalancing = true;
            self.figures_pending_since = None;
            self.figures_pending = 0;
            let (plan, layout, view) = (plan.clone(), self.layout.clone(), view.clone());
            let (tx, policy, key) = (self.internal_tx.clone(), policy.clone(), key.clone());
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let current = plan_by_load_with(Some(&plan), &layout, &view, &moves);
                let levels = view.loads.levels(layout.shards.len());
                let all = balance::rebalance(&current, &view.nodes, &levels, &policy, usize::MAX);
                let _ = tx.send(Internal::Rebalanced(key, all, started.elapsed()));
            });
        }
        // While moves of the window count against the budget, look again when the
        // oldest leaves it: a step the budget cut short (a chain of two that did not
        // fit counts too) has more to do, and nothing else may wake the balancer.
        let refill = if !fresh && !ready {
            Some(ready_at)
        } else {
            self.issued.front().map(|t| *t + policy.window)
        };
        let expiry = self
            .my_moves
            .values()
            .map(|(_, at)| (*at).max(self.moves_progressed_at) + stale)
            .min();
        let pacing = (!fresh && paced).then_some(self.next_rebalance_at);
        self.balance_at = [refill, expiry, pacing].into_iter().flatten().min();
        // Moves not made yet, and one while the latest figures and members have no
        // rebalance yet (waiting for the figures to hold still, or working it out).
        let worked_out = self.to_issue_for.as_ref() == Some(&key);
        self.balancing = self.to_issue.len() + self.my_moves.len() + usize::from(!worked_out);
        if changed {
            self.publish_moves();
        }
        crate::metrics::record_load_imbalance(
            &self.layout,
            &self.node_id,
            crate::view::load_imbalance(view),
        );
    }

    fn publish_moves(&mut self) {
        let list = self
            .my_moves
            .iter()
            .map(|(s, (to, _))| (*s as u32, to.clone()))
            .collect();
        if self.mine.set_moves(Some(list)) {
            self.mine_changed = true;
        }
    }

    fn set_held(&mut self, s: usize, on: bool) {
        if self.mine.set_held(s, on) {
            self.mine_changed = true;
        }
    }

    fn start_campaign(&mut self, s: usize) {
        let session = self.session.clone();
        let election = self.layout.elections[s].clone();
        let candidate = self.candidate.clone();
        let tx = self.internal_tx.clone();
        let permits = self.permits.clone();
        let task = tokio::spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            let _ = tx.send(Internal::Started(s));
            let r = session.campaign(&election, &candidate).await;
            let _ = tx.send(Internal::Granted(s, r));
        });
        self.campaigning.insert(s, task);
    }

    /// Ask for the shards gathered in `to_try` in batches, each batch one task holding
    /// a campaign permit per seat (a batch is at most the limit): the session sends a batch in
    /// as few store round trips as the backend allows (`Session::try_campaign_many`).
    /// A batch counts its seats against the limit so that a node taking 10,000 free
    /// shards keeps one batch in flight rather than ten; with one permit per batch,
    /// ten nodes of 100,000 shards on Redis queued a hundred scripts ahead of their
    /// own renewals, which timed out, and the sessions expired.
    ///
    /// Batches leave `to_try` only while at most two limits' worth of seats are out
    /// (one in flight, one waiting for its permits), and each shard is checked against
    /// the current plan and view as its batch is made: a node that saw only itself
    /// for a moment at start queues every shard, and sending them all at once had it
    /// take 600,000 of 1,000,000 shards after the plan had given it 100,000, then hand
    /// 500,000 back at its handoff rate (a 23–29 s cold start instead of 5).
    fn try_free_shards(&mut self, view: &View, plan: &Plan, now: Instant) {
        let size = TRY_BATCH.min(self.permit_count).max(1);
        while self.trying_in_flight < 2 * self.permit_count.max(1) && !self.to_try.is_empty() {
            let mut shards = Vec::with_capacity(size);
            while shards.len() < size {
                let Some(s) = self.to_try.pop_front() else {
                    break;
                };
                let still =
                    self.is_mine(s, plan) && !self.held.contains_key(&s) && self.free_in(view, s);
                if still {
                    shards.push(s);
                } else {
                    // No longer a free shard of this node's: look again (it may be
                    // this node's and taken, to queue for, or nobody's business here).
                    self.trying.set(s, false);
                    self.examine(s, view, plan, now);
                }
            }
            if shards.is_empty() {
                continue;
            }
            self.trying_in_flight += shards.len();
            let seats: Vec<(ElectionName, Candidate)> = shards
                .iter()
                .map(|&s| (self.layout.elections[s].clone(), self.candidate.clone()))
                .collect();
            let session = self.session.clone();
            let tx = self.internal_tx.clone();
            let permits = self.permits.clone();
            let count = u32::try_from(shards.len()).unwrap_or(1);
            tokio::spawn(async move {
                let Ok(_permit) = permits.acquire_many_owned(count).await else {
                    return;
                };
                let generation = session.generation();
                let answers = session.try_campaign_many(&seats).await;
                let _ = tx.send(Internal::Tried(shards, answers, generation));
            });
        }
    }

    /// Start the queued handoffs the token bucket allows, each checked again first:
    /// each grant is asked to step down (contract clause 15), and its seat is released
    /// once the shard's work acknowledged (its `Acquired` event's work guard is gone)
    /// or at the step-down grace; its end comes through the session's loss feed and is
    /// reported as `HandedOff`. Releases that come due together go out in one batch.
    fn run_handoffs(&mut self, view: &View, plan: &Plan) {
        while let Some(&s) = self.pending.front() {
            // Still held, not already stepping down, and still to hand over (the plan
            // or the claims may have moved since it was queued)?
            let due = self
                .held
                .get(&s)
                .filter(|h| h.handing_off.is_none())
                .and_then(|_| self.handoff_of(s, view, plan));
            if due.is_some() && !self.bucket.take() {
                break;
            }
            self.pending.pop_front();
            self.queued.set(s, false);
            // Only a handoff still due lets go of the shard: one the plan no longer
            // asks for stays held (and published as held).
            let Some(to) = due else {
                continue;
            };
            let draining = self.draining;
            let Some(held) = self.held.get_mut(&s) else {
                continue;
            };
            let token = held.watch.token();
            tracing::debug!(shard = s, %token, to = ?to, "handing off");
            held.handing_off = Some(to.clone());
            let reason = if draining && to.is_none() {
                StepDownReason::Drain
            } else {
                StepDownReason::Handoff(to)
            };
            if let Some(l) = &held.leadership {
                l.step_down(reason);
            }
        }
    }

    async fn shutdown(&mut self) {
        self.mine.clear();
        // Leaving on purpose: say so (draining, nothing held) before the member goes,
        // so the other nodes plan without this one at once rather than keep its
        // shards for the member grace, and campaign for them while they are stepped
        // down here.
        self.mine.set_draining(true);
        let leaving = self.mine.value();
        let announce = async {
            if let Ok(member) = Member::new(&self.node_id, &leaving) {
                if let Err(e) = self.session.register(&self.layout.namespace, &member).await {
                    tracing::debug!(error = %e, "could not say this node is leaving");
                }
            }
        };
        for (_, t) in self.campaigning.drain() {
            t.abort();
        }
        // A planned transition too: every grant is asked to step down, and the seats
        // are released once the work acknowledged (or at the step-down grace).
        for h in self.held.values() {
            if let Some(l) = &h.leadership {
                l.step_down(StepDownReason::Shutdown);
            }
        }
        let ends: Vec<_> = self
            .held
            .values()
            .map(|h| {
                let w = h.watch.clone();
                async move { w.lost().cancelled().await }
            })
            .collect();
        let grace = self.session.timing().step_down_grace;
        let stepped_down = tokio::time::timeout(grace, futures::future::join_all(ends));
        let _ = tokio::join!(announce, stepped_down);
        let held: Vec<_> = self.held.drain().collect();
        lock(&self.held_watches).clear();
        let mut resigning = Vec::with_capacity(held.len());
        for (s, mut h) in held {
            let reason = h.watch.loss_reason().unwrap_or(LossReason::Resigned);
            let at = h.watch.lost_at().unwrap_or_else(Instant::now);
            let event = match h.handing_off.take() {
                Some(to) => ShardEvent::HandedOff {
                    shard: self.layout.shards[s].clone(),
                    token: h.watch.token(),
                    to,
                    at,
                },
                None => ShardEvent::Lost {
                    shard: self.layout.shards[s].clone(),
                    token: h.watch.token(),
                    reason,
                    at,
                },
            };
            let _ = self.events.send(event);
            resigning.extend(h.leadership.take());
        }
        let _ = self.session.resign_many(resigning).await;
        let _ = self
            .session
            .unregister(&self.layout.namespace, &self.node_id)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenure_core::Member;

    use std::time::Duration;

    use super::{acting_on, next_wake};
    use crate::config::Layout;
    use crate::state::{OwnState, View};
    use crate::view::plan_after;

    const SHARDS: usize = 12;

    fn list(nodes: &mut [(&str, &mut OwnState)]) -> Vec<Member> {
        let mut members = Vec::new();
        for (id, state) in nodes.iter_mut() {
            members.push(Member::new(*id, state.value()).expect("member"));
        }
        members
    }

    #[test]
    fn a_pending_replan_wakes_the_controller_whatever_else_is_due() {
        let now = tokio::time::Instant::now();
        let (early, late) = (
            now + Duration::from_millis(10),
            now + Duration::from_millis(100),
        );
        assert_eq!(next_wake(None, Some(late), None), Some(late));
        assert_eq!(next_wake(Some(early), Some(late), None), Some(early));
        // After the retry's wake-up the retry is gone; the replan still wakes.
        assert_eq!(next_wake(None, Some(late), None), Some(late));
        assert_eq!(next_wake(Some(late), None, Some(early)), Some(early));
        assert_eq!(next_wake(None, None, None), None);
    }

    #[test]
    fn while_a_plan_is_pending_for_the_same_nodes_the_latest_claims_count() {
        let layout = Layout::new("ns", SHARDS, 1).expect("layout");
        let (mut a, mut b) = (OwnState::new(SHARDS, 1, 1), OwnState::new(SHARDS, 1, 2));
        let first = list(&mut [("a", &mut a), ("b", &mut b)]);
        let (v1, _) = View::update(&View::default(), &first, SHARDS);
        let v1 = Arc::new(v1);
        let plan = plan_after(None, &layout, &v1);
        let b_index = v1.index_of("b").expect("b");
        let shard = (0..SHARDS)
            .find(|&s| plan.preferred(s) == Some(b_index))
            .expect("a shard for b");
        // b starts to campaign for its shard; a new plan is on its way.
        b.set_campaigning(shard, true);
        let second = list(&mut [("a", &mut a), ("b", &mut b)]);
        let (v2, _) = View::update(&v1, &second, SHARDS);
        let v2 = Arc::new(v2);
        let picture = (v1.clone(), plan.clone());
        let (view, used, current) =
            acting_on(None, &v1, Some(&picture), &v2).expect("something to act on");
        assert!(current, "the latest list's changes count now");
        assert!(Arc::ptr_eq(&used, &plan));
        assert!(
            view.states[b_index as usize].campaigning.contains(shard),
            "the campaign is seen before the next plan"
        );

        // A node joins: the last plan's numbers do not index the new list.
        let mut c = OwnState::new(SHARDS, 1, 3);
        let third = list(&mut [("a", &mut a), ("b", &mut b), ("c", &mut c)]);
        let (v3, _) = View::update(&v2, &third, SHARDS);
        let v3 = Arc::new(v3);
        let (view, _, current) =
            acting_on(None, &v1, Some(&picture), &v3).expect("something to act on");
        assert!(!current && Arc::ptr_eq(&view, &v1), "the last pair stands");

        // With a plan for the latest list, that pair.
        let fresh = plan_after(Some(&plan), &layout, &v3);
        let (view, used, current) =
            acting_on(Some(&fresh), &v3, Some(&picture), &v3).expect("something to act on");
        assert!(current && Arc::ptr_eq(&view, &v3) && Arc::ptr_eq(&used, &fresh));
        assert!(acting_on(None, &v1, None, &v2).is_none());
    }
}
