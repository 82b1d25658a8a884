//! Starting a manager ([`ShardManagerBuilder::start`]): the session, this node's
//! registration, the task that publishes its member value, and the controller task.

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::{Candidate, ErrorKind, Member, Result, Session};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::bookkeeping::{Bucket, ByShard, Counted, Dirty};
use super::controller::{Controller, Startup};
use super::{Asked, LoadReporter, ShardEvents, ShardManager, ShardStatus};
use crate::config::ShardManagerBuilder;
use crate::state::{OwnState, ShardSet, View};

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
