//! `run_when_leader`: campaign, run a task while leader, and start over.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::Result;
use crate::grant::{LossReason, StepDownReason};
use crate::leadership::Leadership;
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
    /// The runner was shut down: the task was stopped first, then the seat released
    /// (contract clause 15).
    Shutdown,
    /// The holder was asked to step down (a preemption, a handover, a request of its
    /// own code): the task was stopped first, then the seat released.
    SteppedDown(StepDownReason),
}

impl fmt::Display for ResignCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResignCause::TaskFinished => f.write_str("task finished"),
            ResignCause::TaskFailed(e) => write!(f, "task failed: {e}"),
            ResignCause::Stalled => f.write_str("task stalled"),
            ResignCause::Shutdown => f.write_str("shutdown"),
            ResignCause::SteppedDown(r) => write!(f, "stepped down: {r}"),
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
        /// The size of the state the grant inherited (clause 16), if any.
        inherited_bytes: Option<usize>,
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
    /// A planned transition began (contract clause 15): the task was told to stop
    /// (its cancellation fired) while the seat stays held; `Resigned` follows once the
    /// task ended (or was aborted at the grace), or `Lost` if the seat ended first.
    SteppingDown {
        /// The election.
        election: ElectionName,
        /// The grant's fencing token.
        token: FencingToken,
        /// Why.
        reason: StepDownReason,
        /// When the step-down was asked for.
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
        /// When the lost signal fired (the seat is released right after).
        at: Instant,
        /// Whether the task had to be aborted at the grace (it ignored cancellation).
        aborted: bool,
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
    inherited: Option<(FencingToken, Arc<[u8]>)>,
    leave: Arc<Mutex<Option<Vec<u8>>>>,
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

    /// What the grant inherited (clause 16): the token of the grant that left it and
    /// the state, as [`Leadership::inherited`](crate::Leadership::inherited) gives it.
    pub fn inherited(&self) -> Option<(FencingToken, &[u8])> {
        self.inherited.as_ref().map(|(t, s)| (*t, &s[..]))
    }

    /// Leave `state` to the next grant when the runner resigns this one (clause 16;
    /// [`Leadership::resign_with`](crate::Leadership::resign_with)); the last call
    /// wins. Over [`MAX_STATE`](crate::engine::MAX_STATE) bytes: `InvalidArgument`, and
    /// nothing is left.
    pub fn leave_state(&self, state: impl Into<Vec<u8>>) -> Result<()> {
        let state = state.into();
        crate::engine::check_state("leave_state", &state)?;
        *crate::backend::lock(&self.leave) = Some(state);
        Ok(())
    }

    /// Completes when the task must stop: a step-down (shutdown, preemption,
    /// handover), leadership lost, or a stall (`lost().cancelled()`). On a step-down the
    /// seat stays held until the task has returned.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The stop signal, as [`Leadership::stepping_down`](crate::Leadership::stepping_down)
    /// and the shard manager's `Acquired { stop, .. }` give it: cancelled when the task
    /// must stop (a step-down, a loss, a stall, a shutdown). Hand it to other tasks.
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
    SteppingDown(StepDownReason),
}

impl LeaderRunner {
    /// A runner for `candidate` in `election` through `session`.
    pub fn new(session: Session, election: ElectionName, candidate: Candidate) -> Self {
        let task_grace = session.timing().step_down_grace;
        LeaderRunner {
            session,
            election,
            candidate,
            stall_timeout: None,
            task_grace,
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

    /// How long a cancelled task may take to finish before it is aborted (default: the
    /// session's [`step_down_grace`](crate::Timing::step_down_grace), 10 s unless set).
    /// The runner does not campaign again until the old task is gone, and on a
    /// step-down it keeps the seat until then (within the session's step-down grace,
    /// after which the seat is released anyway: keep this at or below it).
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
                let inherited = leadership
                    .inherited()
                    .map(|(t, s)| (t, Arc::<[u8]>::from(s)));
                self.emit(LeadershipEvent::Elected {
                    election: self.election.clone(),
                    candidate: self.candidate.id().to_string(),
                    token,
                    at: leadership.granted_at(),
                    inherited_bytes: inherited.as_ref().map(|(_, s)| s.len()),
                });
                let leave = Arc::new(Mutex::new(None));
                // The task's stop signal: a child of the grant's, which fires on a
                // step-down and on a loss; the runner cancels it itself on a stall.
                let cancel = leadership.stepping_down();
                let heartbeat = Heartbeat::new();
                let ctx = LeaderContext {
                    election: self.election.clone(),
                    token,
                    cancel: cancel.clone(),
                    heartbeat: heartbeat.clone(),
                    inherited,
                    leave: leave.clone(),
                };
                let mut handle = tokio::spawn(task(ctx));
                let mut outcome = self
                    .watch(&leadership, &mut handle, &heartbeat, &shutdown)
                    .await;
                // Whether `handle` has completed (and so must not be polled again).
                let mut task_done = matches!(outcome, Outcome::TaskDone(_));
                // The task may end because its stop signal fired: that is a loss or a
                // step-down, not a task that finished.
                if let Outcome::TaskDone(_) = outcome {
                    if let Some(reason) = leadership.loss_reason().filter(|_| !leadership.is_leader()) {
                        outcome = Outcome::Lost(reason);
                    } else if let Some(reason) = leadership.step_down_reason() {
                        outcome = Outcome::SteppingDown(reason);
                    }
                }
                let mut aborted = false;
                // A planned transition (clause 15): stop the task while the seat is
                // still held, then release.
                let planned = match &outcome {
                    Outcome::Shutdown => Some(StepDownReason::Shutdown),
                    Outcome::SteppingDown(r) => Some(r.clone()),
                    _ => None,
                };
                if let Some(reason) = planned {
                    leadership.step_down(reason.clone());
                    self.emit(LeadershipEvent::SteppingDown {
                        election: self.election.clone(),
                        token,
                        reason: reason.clone(),
                        at: leadership.stepping_down_at().unwrap_or_else(Instant::now),
                    });
                    cancel.cancel();
                    if !task_done {
                        aborted = self.finish_task(&mut handle).await;
                        task_done = true;
                    }
                    // The seat may have ended meanwhile (the step-down grace, a loss).
                    if leadership.loss_reason().is_some() && !leadership.is_leader() {
                        if let Some(reason) = leadership.loss_reason() {
                            outcome = Outcome::Lost(reason);
                        }
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
                            self.finish_task(&mut handle).await;
                        }
                        if shutdown.is_cancelled() {
                            return Ok(());
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
                    Outcome::SteppingDown(reason) => ResignCause::SteppedDown(reason),
                };
                tracing::info!(token = token.0, %cause, "resigning");
                let state = leadership.state.clone();
                let left = crate::backend::lock(&leave).take();
                let resigned = match left {
                    Some(left) => leadership.resign_with(left).await,
                    None => leadership.resign().await,
                };
                if let Err(e) = resigned {
                    tracing::warn!(error = %e, "resign failed; the release goes on until the store answers or the session ends");
                }
                cancel.cancel();
                let at = state.reason().map_or_else(Instant::now, |(_, at)| *at);
                self.emit(LeadershipEvent::Resigned {
                    election: self.election.clone(),
                    token,
                    cause: cause.clone(),
                    at,
                    aborted,
                });
                if !task_done {
                    // A stalled task: the seat is released first, so that a hung task
                    // cannot keep it (clause 11).
                    self.finish_task(&mut handle).await;
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
        let stop = leadership.stepping_down();
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
                _ = stop.cancelled() => {
                    // The stop signal fires on a step-down and on a loss.
                    match leadership.step_down_reason() {
                        Some(reason) if leadership.is_leader() => return Outcome::SteppingDown(reason),
                        _ => return Outcome::Lost(leadership.lost_wait().await),
                    }
                }
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

    /// Wait for a cancelled task to end, up to the task grace; abort it then. Returns
    /// whether it had to be aborted.
    async fn finish_task<T>(&self, handle: &mut tokio::task::JoinHandle<T>) -> bool {
        if tokio::time::timeout(self.task_grace, &mut *handle)
            .await
            .is_err()
        {
            tracing::warn!(grace = ?self.task_grace, "leader task ignored cancellation; aborting it");
            handle.abort();
            // Wait for the abort to take effect (at the task's next await), but not
            // forever: a task stuck outside an await cannot be aborted.
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut *handle).await;
            return true;
        }
        false
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
