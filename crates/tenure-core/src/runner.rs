//! `run_when_leader`: campaign, run a task while leader, and start over.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::Result;
use crate::leadership::{Leadership, LossReason};
use crate::name::{Candidate, ElectionName, FencingToken};
use crate::session::Session;

/// Why a runner gave up a leadership on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResignCause {
    /// The leader task returned `Ok`.
    TaskFinished,
    /// The leader task returned an error or panicked (the message says which).
    TaskFailed(String),
    /// The leader task missed its heartbeat for longer than the stall timeout.
    Stalled,
    /// The runner was shut down.
    Shutdown,
}

impl fmt::Display for ResignCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResignCause::TaskFinished => f.write_str("task finished"),
            ResignCause::TaskFailed(e) => write!(f, "task failed: {e}"),
            ResignCause::Stalled => f.write_str("task stalled"),
            ResignCause::Shutdown => f.write_str("shutdown"),
        }
    }
}

/// What happened to a runner's leadership, in order.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum LeadershipEvent {
    /// The runner started campaigning.
    Campaigning {
        /// The election.
        election: ElectionName,
    },
    /// The runner was granted the seat and started the task.
    Elected {
        /// The election.
        election: ElectionName,
        /// The candidate id.
        candidate: String,
        /// The grant's fencing token.
        token: FencingToken,
        /// When the grant arrived.
        at: Instant,
    },
    /// Leadership ended without the runner asking (deadline, expiry, revocation); the
    /// task was cancelled.
    Lost {
        /// The election.
        election: ElectionName,
        /// The grant's fencing token.
        token: FencingToken,
        /// Why.
        reason: LossReason,
        /// When leadership ended (for a missed deadline, the deadline itself).
        at: Instant,
    },
    /// The runner resigned.
    Resigned {
        /// The election.
        election: ElectionName,
        /// The grant's fencing token.
        token: FencingToken,
        /// Why.
        cause: ResignCause,
        /// When the lost signal fired.
        at: Instant,
    },
}

/// What the leader task gets: the grant's token, a cancellation token that fires the
/// moment leadership ends (or the runner stops the task), and a heartbeat.
#[derive(Clone, Debug)]
pub struct LeaderContext {
    election: ElectionName,
    token: FencingToken,
    cancel: CancellationToken,
    heartbeat: Heartbeat,
}

impl LeaderContext {
    /// The election led.
    pub fn election(&self) -> &ElectionName {
        &self.election
    }

    /// The fencing token to pass with every write.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Completes when the task must stop: leadership lost, stall, or shutdown
    /// (`lost().cancelled()`).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The stop signal, as [`Leadership::lost`](crate::Leadership::lost) and the shard
    /// manager's `Acquired { lost, .. }` give it: cancelled when this leadership ends
    /// for the task (lost, stalled, or shut down). Hand it to other tasks.
    pub fn lost(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Tell the runner the task is making progress (needed only with a stall timeout).
    pub fn heartbeat(&self) {
        self.heartbeat.beat();
    }
}

#[derive(Clone, Debug)]
struct Heartbeat {
    base: Instant,
    last_ns: Arc<AtomicU64>,
}

impl Heartbeat {
    fn new() -> Self {
        Heartbeat {
            base: Instant::now(),
            last_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    fn beat(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.fetch_max(ns, Ordering::SeqCst);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_nanos(self.last_ns.load(Ordering::SeqCst))
    }
}

/// Runs a task whenever this candidate leads an election (the cloud pattern's
/// `RunTaskWhenMutexAcquired`), until shut down:
///
/// campaign → start the task with a [`LeaderContext`] → while the session renews, watch
/// for loss, task end and stalls → on loss cancel the task; when the task ends (or
/// stalls, or on shutdown) resign → campaign again.
#[derive(Debug)]
pub struct LeaderRunner {
    session: Session,
    election: ElectionName,
    candidate: Candidate,
    stall_timeout: Option<Duration>,
    task_grace: Duration,
    subscribers: Vec<mpsc::UnboundedSender<LeadershipEvent>>,
}

enum Outcome {
    TaskDone(std::result::Result<(), String>),
    Lost(LossReason),
    Stalled,
    Shutdown,
}

impl LeaderRunner {
    /// A runner for `candidate` in `election` through `session`.
    pub fn new(session: Session, election: ElectionName, candidate: Candidate) -> Self {
        LeaderRunner {
            session,
            election,
            candidate,
            stall_timeout: None,
            task_grace: Duration::from_secs(10),
            subscribers: Vec::new(),
        }
    }

    /// Require the task to call [`LeaderContext::heartbeat`] at least this often; if it
    /// does not, the runner resigns and cancels it, so a hung leader cannot keep the seat
    /// by renewing alone.
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = Some(timeout);
        self
    }

    /// How long a cancelled task may take to finish before it is aborted (default 10 s).
    /// The runner does not campaign again until the old task is gone.
    pub fn task_grace(mut self, grace: Duration) -> Self {
        self.task_grace = grace;
        self
    }

    /// A stream of [`LeadershipEvent`]s; subscribe before [`run`](Self::run).
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<LeadershipEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subscribers.push(tx);
        rx
    }

    fn emit(&self, event: LeadershipEvent) {
        for s in &self.subscribers {
            let _ = s.send(event.clone());
        }
    }

    /// Loop until `shutdown` fires (then resign and return `Ok`) or the session is
    /// closed (then return its error).
    pub async fn run<F, Fut, E>(self, shutdown: CancellationToken, mut task: F) -> Result<()>
    where
        F: FnMut(LeaderContext) -> Fut,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let span = tracing::info_span!("tenure.run_when_leader", election = %self.election, candidate = self.candidate.id());
        async move {
            let mut failures = 0u32;
            loop {
                if shutdown.is_cancelled() {
                    return Ok(());
                }
                self.emit(LeadershipEvent::Campaigning {
                    election: self.election.clone(),
                });
                let leadership = tokio::select! {
                    r = self.session.campaign(&self.election, &self.candidate) => r?,
                    _ = shutdown.cancelled() => return Ok(()),
                };
                let token = leadership.token();
                self.emit(LeadershipEvent::Elected {
                    election: self.election.clone(),
                    candidate: self.candidate.id().to_string(),
                    token,
                    at: leadership.granted_at(),
                });
                let cancel = leadership.lost();
                let heartbeat = Heartbeat::new();
                let ctx = LeaderContext {
                    election: self.election.clone(),
                    token,
                    cancel: cancel.clone(),
                    heartbeat: heartbeat.clone(),
                };
                let mut handle = tokio::spawn(task(ctx));
                let mut outcome = self
                    .watch(&leadership, &mut handle, &heartbeat, &shutdown)
                    .await;
                // Whether `handle` has completed (and so must not be polled again).
                let task_done = matches!(outcome, Outcome::TaskDone(_));
                // The task may end because its cancellation (a child of the lost signal)
                // fired: that is a loss, not a task that finished.
                if !matches!(outcome, Outcome::Lost(_)) && !leadership.is_leader() {
                    if let Some(reason) = leadership.loss_reason() {
                        outcome = Outcome::Lost(reason);
                    }
                }
                let cause = match outcome {
                    Outcome::Lost(reason) => {
                        cancel.cancel();
                        self.emit(LeadershipEvent::Lost {
                            election: self.election.clone(),
                            token,
                            reason,
                            at: leadership.lost_at().unwrap_or_else(Instant::now),
                        });
                        drop(leadership);
                        if !task_done {
                            self.finish_task(handle).await;
                        }
                        continue;
                    }
                    Outcome::TaskDone(Ok(())) => {
                        failures = 0;
                        ResignCause::TaskFinished
                    }
                    Outcome::TaskDone(Err(e)) => ResignCause::TaskFailed(e),
                    Outcome::Stalled => ResignCause::Stalled,
                    Outcome::Shutdown => ResignCause::Shutdown,
                };
                tracing::info!(token = token.0, %cause, "resigning");
                let state = leadership.state.clone();
                if let Err(e) = leadership.resign().await {
                    tracing::warn!(error = %e, "resign failed; the seat is freed when the session ends");
                }
                cancel.cancel();
                let at = state.reason().map_or_else(Instant::now, |(_, at)| *at);
                self.emit(LeadershipEvent::Resigned {
                    election: self.election.clone(),
                    token,
                    cause: cause.clone(),
                    at,
                });
                if !task_done {
                    self.finish_task(handle).await;
                }
                match cause {
                    ResignCause::Shutdown => return Ok(()),
                    ResignCause::TaskFailed(_) | ResignCause::Stalled => {
                        let delay = self.session.timing().retry.delay(failures);
                        failures = failures.saturating_add(1);
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = shutdown.cancelled() => return Ok(()),
                        }
                    }
                    _ => {}
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn watch<E: fmt::Display>(
        &self,
        leadership: &Leadership,
        handle: &mut tokio::task::JoinHandle<std::result::Result<(), E>>,
        heartbeat: &Heartbeat,
        shutdown: &CancellationToken,
    ) -> Outcome {
        loop {
            let stall_at = self.stall_timeout.map(|t| heartbeat.last() + t);
            tokio::select! {
                r = &mut *handle => {
                    return Outcome::TaskDone(match r {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(e) => Err(format!("task ended abnormally: {e}")),
                    });
                }
                reason = leadership.lost_wait() => return Outcome::Lost(reason),
                _ = shutdown.cancelled() => return Outcome::Shutdown,
                _ = sleep_until_opt(stall_at) => {
                    if let Some(t) = self.stall_timeout {
                        if heartbeat.last() + t <= Instant::now() {
                            tracing::warn!(timeout = ?t, "leader task missed its heartbeat");
                            return Outcome::Stalled;
                        }
                    }
                }
            }
        }
    }

    async fn finish_task<T>(&self, mut handle: tokio::task::JoinHandle<T>) {
        if tokio::time::timeout(self.task_grace, &mut handle)
            .await
            .is_err()
        {
            tracing::warn!(grace = ?self.task_grace, "leader task ignored cancellation; aborting it");
            handle.abort();
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
