//! The controller task of a manager: its state, its loop over member lists, grants,
//! losses and commands, and the reconcile that brings the node in line with the plan
//! after each pass. Membership and planning, campaigns and grants, handoffs and
//! balance by load extend it in the sibling modules.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tenure_core::{
    Candidate, FencingToken, Leadership, LeadershipWatch, LossReason, Member, MemberStream, Result,
    Session, StepDownReason,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::bookkeeping::{Bucket, ByShard, Counted, Dirty};
use super::planning::{acting_on, next_wake};
use super::{lock, Asked, Command, Picture, ShardEvent, ShardStatus};
use crate::assign::Plan;
use crate::balance::LoadPolicy;
use crate::config::{HandoffHook, Layout};
use crate::state::{OwnState, ShardSet, View};

pub(super) enum Internal {
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

pub(super) struct Held {
    pub(super) watch: LeadershipWatch,
    pub(super) leadership: Option<Leadership>,
    /// Set once this node asked the grant to step down for a handoff or drain: the
    /// node it goes to. Its end is then reported as `HandedOff`.
    pub(super) handing_off: Option<Option<String>>,
}

pub(super) struct Startup {
    pub(super) ids: Vec<String>,
    pub(super) since: Instant,
    pub(super) quiet: Duration,
}

pub(super) struct Controller {
    pub(super) layout: Arc<Layout>,
    pub(super) node_id: String,
    pub(super) session: Session,
    pub(super) candidate: Candidate,
    pub(super) draining: bool,
    pub(super) view: Arc<View>,
    /// The plan for `planned_view`; `None` once the view moved on.
    pub(super) plan: Option<Arc<Plan>>,
    /// The view the last plan was computed for (node numbers in a plan index it).
    pub(super) planned_view: Arc<View>,
    /// Plans of large namespaces cost milliseconds; the next is computed no earlier
    /// than this, so a busy member list cannot keep a node computing.
    pub(super) next_plan_at: Instant,
    pub(super) held: ByShard<Held>,
    pub(super) campaigning: ByShard<JoinHandle<()>>,
    /// Shards asked for in a batch of tries (in flight, or waiting in `to_try` for
    /// their batch): free in the view, so taken without queueing, many per store
    /// round trip.
    pub(super) trying: ShardSet,
    pub(super) to_try: VecDeque<usize>,
    /// Seats of the batches of tries sent and not answered yet.
    pub(super) trying_in_flight: usize,
    /// Bounds the campaigns in flight, so a node that must take thousands of shards
    /// at once does not swamp the store (and its own renewals).
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    /// The permits in all (`campaign_limit`): a batch of tries takes one per seat,
    /// up to this many.
    pub(super) permit_count: usize,
    /// Failed campaigns: shard → (attempts, not before).
    pub(super) failures: ByShard<(u32, Instant)>,
    /// The failures' retry times, earliest first (an entry whose shard has failed
    /// again or succeeded since is passed over), so a reconcile looks only at the
    /// shards due rather than at every failure.
    pub(super) retries: BinaryHeap<Reverse<(Instant, usize)>>,
    pub(super) retry_at: Option<Instant>,
    /// Until the member list first holds still, no campaigns start (so that nodes
    /// started together do not all grab shards from partial views and hand them
    /// back a moment later).
    pub(super) startup: Option<Startup>,
    /// Shards to hand off, checked again (and their new node found) when their turn
    /// comes. `queued` marks the shards in it.
    pub(super) pending: VecDeque<usize>,
    pub(super) queued: ShardSet,
    /// This node's published state: what it holds, and the campaigns that hold a
    /// permit (the ones other nodes may see as campaigning); `mine_changed` when it
    /// differs from the last one handed to the publisher.
    pub(super) mine: OwnState,
    pub(super) mine_changed: bool,
    /// This node's number in the view of the last reconcile.
    pub(super) me: Option<u32>,
    /// When to plan again from the latest member list: set when a new list only
    /// moved shards the way the plan asked, so the plan was kept.
    pub(super) replan_at: Option<Instant>,
    /// When the plan was first kept across a change since it was computed.
    pub(super) kept_since: Option<Instant>,
    /// How long the last plan took to compute.
    pub(super) plan_took: Duration,
    /// Shards to look at in the next reconcile (grants, losses, retries, plan moves).
    pub(super) dirty: Dirty,
    /// Shards the member list changed since the last plan: looked at once a plan for
    /// that list is in place.
    pub(super) view_dirty: Dirty,
    /// Shards not led by their preferred node in the last reconcile's view and plan.
    pub(super) unsettled: Counted,
    /// Shards held that the plan gives to another node (or none).
    pub(super) misplaced: Counted,
    pub(super) bucket: Bucket,
    /// Awaited before the seats of a handoff are resigned.
    pub(super) before_handoff: Option<HandoffHook>,
    pub(super) internal_tx: mpsc::UnboundedSender<Internal>,
    pub(super) events: mpsc::UnboundedSender<ShardEvent>,
    pub(super) publish: watch::Sender<String>,
    pub(super) status: watch::Sender<ShardStatus>,
    pub(super) picture: Arc<Mutex<Picture>>,
    pub(super) held_watches: Arc<Mutex<HashMap<usize, LeadershipWatch>>>,
    pub(super) version: u64,
    /// Balance by load, with this policy (`None`: by count).
    pub(super) balance: Option<LoadPolicy>,
    /// As the balancer: the leaders it asks for, shard → (node, when asked).
    pub(super) my_moves: BTreeMap<usize, (String, Instant)>,
    /// When each move of the current window was asked for, oldest first.
    pub(super) issued: VecDeque<Instant>,
    /// The last asks, for the tests of the move budget (`moves_asked`).
    pub(super) asked: Asked,
    /// When the balancer looks again by itself (the window frees budget, a move
    /// goes stale).
    pub(super) balance_at: Option<Instant>,
    /// The balancer looks at the next reconcile (a new plan came).
    pub(super) balance_due: bool,
    /// Load reports not yet published, shard → latest figure.
    pub(super) pending_loads: ByShard<f64>,
    pub(super) load_interval: Duration,
    /// When the pending reports are published.
    pub(super) load_flush_at: Option<Instant>,
    pub(super) last_flush: Instant,
    /// When a published load figure last changed in the view.
    pub(super) figures_changed_at: Instant,
    /// When the figures first changed since the balancer last started a rebalance,
    /// and how many codes changed since.
    pub(super) figures_pending_since: Option<Instant>,
    pub(super) figures_pending: usize,
    /// As the balancer: the moves of the last rebalance not yet asked for, and the
    /// figures and members it was worked out for.
    pub(super) to_issue: VecDeque<(usize, String)>,
    pub(super) to_issue_for: Option<RebalanceKey>,
    /// A rebalance is being worked out on the blocking pool.
    pub(super) rebalancing: bool,
    /// When the next rebalance may start: as long after the last one ended as it
    /// took, so the balancer spends at most half a core on it however often the
    /// figures change.
    pub(super) next_rebalance_at: Instant,
    /// A shard had no leader at a step since the last rebalance was worked out.
    pub(super) vacancy_seen: bool,
    /// When the balancer last saw one of its moves made.
    pub(super) moves_progressed_at: Instant,
    /// [`ShardStatus::balancing`] as of the last balancer step.
    pub(super) balancing: usize,
    /// This node's member value leaves its load codes out (see `OwnState`).
    pub(super) loads_withheld: bool,
    /// How long a member that left the list without draining stays in the view.
    pub(super) member_grace: Duration,
    /// The last member list the store gave.
    pub(super) listed: Vec<Member>,
    /// Members gone from the list (not draining), kept in the view with their last
    /// value until their grace ends: id → (member, when it went).
    pub(super) absent: BTreeMap<String, (Member, Instant)>,
    /// When the first grace of `absent` ends.
    pub(super) grace_at: Option<Instant>,
    /// The session's generation last seen: it grows when the session was re-opened
    /// after the store expired or revoked it.
    pub(super) generation: u64,
    /// Shards whose batch of tries met the ended session before it was re-opened:
    /// tried again once it is.
    pub(super) after_reopen_try: Vec<usize>,
    /// Shards this node lost because the store ended its session, still published as
    /// held until it has them again, finds them taken, or the member grace passes
    /// (see `end_grant`): shard → when the claim ends.
    pub(super) claims: BTreeMap<usize, Instant>,
}

impl Controller {
    pub(super) async fn run(
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
    pub(super) fn examine(&mut self, s: usize, view: &View, plan: &Plan, now: Instant) {
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
    pub(super) fn free_in(&self, view: &View, s: usize) -> bool {
        match view.holders.get(s) {
            None => true,
            Some(h) => Some(h) == self.me && !self.held.contains_key(&s),
        }
    }

    /// Whether the plan gives shard `s` to this node (never while it drains).
    pub(super) fn is_mine(&self, s: usize, plan: &Plan) -> bool {
        !self.draining && self.me.is_some() && plan.preferred(s) == self.me
    }

    pub(super) fn set_campaigning(&mut self, s: usize, on: bool) {
        if self.mine.set_campaigning(s, on) {
            self.mine_changed = true;
        }
    }

    pub(super) fn set_held(&mut self, s: usize, on: bool) {
        if self.mine.set_held(s, on) {
            self.mine_changed = true;
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
