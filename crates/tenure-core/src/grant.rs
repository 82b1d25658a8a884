//! One grant's shared state: why it ended, a step-down and its grace, the work
//! guards, what it inherited. The session keeps it to fire the lost signal; the
//! [`Leadership`](crate::Leadership) handle reads it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::name::{Candidate, ElectionName, FencingToken};

/// Why a leadership ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The holder resigned (or dropped its [`Leadership`](crate::Leadership)).
    Resigned,
    /// No renewal was confirmed before the local deadline; the store may give the seat
    /// to someone else from now on.
    DeadlineExceeded,
    /// The store reported the session expired.
    SessionExpired,
    /// The store reported the seat gone or taken (e.g. the key was deleted).
    Revoked(String),
    /// The session was closed or abandoned.
    SessionClosed,
    /// The holder was asked to step down by the store (contract clause 14: a candidate
    /// with a higher priority joined, or a handover was asked for) and the step-down
    /// ended (clause 15): the holder's work acknowledged, or the step-down grace ran
    /// out. The seat is released right after, and the preferred candidate is granted
    /// next.
    Preempted,
}

/// Why a holder is asked to step down (contract clause 15): a planned transition. The
/// seat stays held and renewed while the holder's work stops; it is released once the
/// work acknowledges or the step-down grace ([`Timing::step_down_grace`]) runs out.
///
/// [`Timing::step_down_grace`]: crate::Timing::step_down_grace
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepDownReason {
    /// The store asked: a candidate with a higher priority queued, or someone asked
    /// for a handover (clause 14). Stores report both the same way.
    Preempted,
    /// The holder's own process is shutting down (the runner's shutdown, the CLI's
    /// SIGTERM).
    Shutdown,
    /// The holder's own code asked ([`Leadership::step_down`](crate::Leadership::step_down)) for a reason of its own.
    Requested,
    /// The shard manager moves the shard to another node (plan, balance or zone move),
    /// to the node named if known.
    Handoff(Option<String>),
    /// The shard manager drains this node.
    Drain,
}

impl fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepDownReason::Preempted => f.write_str("preempted"),
            StepDownReason::Shutdown => f.write_str("shutdown"),
            StepDownReason::Requested => f.write_str("requested"),
            StepDownReason::Handoff(Some(to)) => write!(f, "handoff to {to}"),
            StepDownReason::Handoff(None) => f.write_str("handoff"),
            StepDownReason::Drain => f.write_str("drain"),
        }
    }
}

impl StepDownReason {
    /// The loss reason of a grant whose step-down for this reason ended: `Preempted`
    /// when the store asked, else `Resigned` (the holder's own side chose it).
    pub(crate) fn loss_reason(&self) -> LossReason {
        match self {
            StepDownReason::Preempted => LossReason::Preempted,
            _ => LossReason::Resigned,
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Resigned => f.write_str("resigned"),
            LossReason::DeadlineExceeded => f.write_str("renew deadline passed"),
            LossReason::SessionExpired => f.write_str("session expired"),
            LossReason::Revoked(why) => write!(f, "revoked: {why}"),
            LossReason::SessionClosed => f.write_str("session closed"),
            LossReason::Preempted => f.write_str("preempted"),
        }
    }
}

/// A one-way flag to wait for, lighter than a `CancellationToken` (no allocation of
/// its own): one per grant.
#[derive(Debug, Default)]
pub(crate) struct Released {
    done: AtomicBool,
    notify: Notify,
}

impl Released {
    pub(crate) fn set(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.done.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// The end of one grant of a session, as [`Session::losses`](crate::Session::losses)
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Loss {
    /// The election whose seat the session no longer holds.
    pub election: ElectionName,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// Why it ended.
    pub reason: LossReason,
    /// When it ended: the instant the lost signal fired, or for a missed deadline the
    /// deadline itself ([`Leadership::lost_at`](crate::Leadership::lost_at)).
    pub at: Instant,
}

/// Shared state of one grant; the session keeps it to fire the lost signal.
#[derive(Debug)]
pub(crate) struct GrantState {
    pub(crate) backend: &'static str,
    pub(crate) election: ElectionName,
    pub(crate) candidate: Candidate,
    pub(crate) token: FencingToken,
    pub(crate) granted_at: Instant,
    lost: CancellationToken,
    reason: OnceLock<(LossReason, Instant)>,
    /// Cancelled when the holder is asked to step down, and with `lost` (a child of it).
    stop: CancellationToken,
    step_down: OnceLock<(StepDownReason, Instant)>,
    /// Work guards ([`WorkGuard`]) alive; `guarded` once one was ever handed out.
    guards: AtomicUsize,
    guarded: AtomicBool,
    /// Set once the holder asked for its stop signal or a work guard: only such a
    /// holder can hear a step-down, so only its step-downs wait for it.
    listening: AtomicBool,
    /// The step-down grace of the session.
    grace: std::time::Duration,
    /// Set by whoever takes on releasing the seat in the store.
    pub(crate) release_claimed: AtomicBool,
    /// Set once the seat is released in the store (or release was given up).
    pub(crate) released: Released,
    /// Where the loss is reported: the session's release task.
    on_loss: mpsc::UnboundedSender<Loss>,
    /// What this grant inherited (clause 16): the token that left it and the state.
    pub(crate) inherited: OnceLock<(FencingToken, Vec<u8>)>,
}

impl GrantState {
    pub(crate) fn new(
        backend: &'static str,
        election: ElectionName,
        candidate: Candidate,
        token: FencingToken,
        granted_at: Instant,
        grace: std::time::Duration,
        on_loss: mpsc::UnboundedSender<Loss>,
    ) -> Self {
        let lost = CancellationToken::new();
        GrantState {
            backend,
            election,
            candidate,
            token,
            granted_at,
            stop: lost.child_token(),
            lost,
            reason: OnceLock::new(),
            step_down: OnceLock::new(),
            guards: AtomicUsize::new(0),
            guarded: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            grace,
            release_claimed: AtomicBool::new(false),
            released: Released::default(),
            on_loss,
            inherited: OnceLock::new(),
        }
    }

    /// Fire the lost signal once; `at` is when leadership ended (for a missed deadline,
    /// the deadline itself). Returns true if this call fired it.
    pub(crate) fn fire(&self, reason: LossReason, at: Instant) -> bool {
        if self.reason.set((reason.clone(), at)).is_err() {
            return false;
        }
        self.lost.cancel();
        let transition = if reason == LossReason::Resigned {
            "resigned"
        } else {
            "lost"
        };
        tracing::info!(election = %self.election, token = self.token.0, %reason, "leadership ended");
        crate::metrics::leadership_ended(self.backend, &self.election, transition);
        let _ = self.on_loss.send(Loss {
            election: self.election.clone(),
            token: self.token,
            reason,
            at,
        });
        true
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Ask the holder to step down (clause 15), once: the stop signal fires; the seat is
    /// released when the work acknowledges ([`Self::acknowledged`]) or at the grace.
    /// Returns true if this call asked. A lost grant is not asked.
    pub(crate) fn ask_step_down(self: &Arc<Self>, reason: StepDownReason) -> bool {
        if self.is_lost()
            || self
                .step_down
                .set((reason.clone(), Instant::now()))
                .is_err()
        {
            return false;
        }
        tracing::info!(election = %self.election, token = self.token.0, %reason, grace = ?self.grace, "asked to step down");
        crate::metrics::stepping_down(self.backend, &self.election);
        self.stop.cancel();
        let unheard = !self.listening.load(Ordering::SeqCst);
        if unheard
            || (self.guarded.load(Ordering::SeqCst) && self.guards.load(Ordering::SeqCst) == 0)
        {
            // The work stopped before it was asked, or the holder never asked for the
            // stop signal (it watches `lost()` alone, which waiting would only delay):
            // nothing to wait for.
            self.end_step_down();
            return true;
        }
        let state = self.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(state.grace) => {
                        if !state.is_lost() {
                            tracing::warn!(election = %state.election, token = state.token.0, grace = ?state.grace, "the holder did not step down within the grace; releasing the seat");
                        }
                        state.end_step_down();
                    }
                    _ = state.lost.cancelled() => {}
                }
            });
        }
        true
    }

    /// The step-down is over (acknowledged or timed out): fire the lost signal with the
    /// step-down's loss reason; the session's release task releases the seat.
    fn end_step_down(&self) {
        if let Some((reason, _)) = self.step_down.get() {
            self.fire(reason.loss_reason(), Instant::now());
        }
    }

    pub(crate) fn step_down_reason(&self) -> Option<&(StepDownReason, Instant)> {
        self.step_down.get()
    }

    pub(crate) fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// The stop signal for a holder that will act on it (see `listening`).
    pub(crate) fn listen(&self) -> CancellationToken {
        self.listening.store(true, Ordering::SeqCst);
        self.stop.child_token()
    }

    pub(crate) fn guard(self: &Arc<Self>) -> WorkGuard {
        self.guards.fetch_add(1, Ordering::SeqCst);
        self.guarded.store(true, Ordering::SeqCst);
        self.listening.store(true, Ordering::SeqCst);
        WorkGuard {
            inner: Some(Arc::new(GuardInner {
                state: self.clone(),
                done: AtomicBool::new(false),
            })),
        }
    }

    /// One work guard was dropped or marked done: the last one ends a step-down.
    fn guard_done(&self) {
        if self.guards.fetch_sub(1, Ordering::SeqCst) == 1 && self.step_down.get().is_some() {
            self.end_step_down();
        }
    }

    pub(crate) fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn reason(&self) -> Option<&(LossReason, Instant)> {
        self.reason.get()
    }
}

/// Whether the grant still holds at `deadline` (the session's local one); a grant
/// past it is lost now.
pub(crate) fn is_valid(state: &GrantState, deadline: Instant) -> bool {
    if state.is_lost() {
        return false;
    }
    if Instant::now() >= deadline {
        state.fire(LossReason::DeadlineExceeded, deadline);
        return false;
    }
    true
}

/// A guard kept by the work a holder runs under one grant ([`Leadership::work_guard`](crate::Leadership::work_guard)).
/// Cloning it makes one more holder of the same guard. When the holder is asked to
/// step down, the seat is released once every clone is dropped or one of them is
/// [`done`](Self::done) (or at the step-down grace), so the successor starts after the
/// work stopped.
#[derive(Clone)]
pub struct WorkGuard {
    inner: Option<Arc<GuardInner>>,
}

struct GuardInner {
    state: Arc<GrantState>,
    done: AtomicBool,
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.state.guard_done();
        }
    }
}

impl WorkGuard {
    /// A guard of no grant, for events made by hand (tests, simulations): it has no
    /// token, never stops, and dropping it does nothing.
    pub fn detached() -> WorkGuard {
        WorkGuard { inner: None }
    }

    /// Say the work stopped: as if every clone of this guard were dropped.
    pub fn done(&self) {
        if let Some(inner) = &self.inner {
            if !inner.done.swap(true, Ordering::SeqCst) {
                inner.state.guard_done();
            }
        }
    }

    /// The fencing token of the grant this guard belongs to (`None` if detached).
    pub fn token(&self) -> Option<FencingToken> {
        self.inner.as_ref().map(|i| i.state.token)
    }

    /// The stop signal of the grant (see [`Leadership::stepping_down`](crate::Leadership::stepping_down)); a detached
    /// guard's never fires.
    pub fn stepping_down(&self) -> CancellationToken {
        match &self.inner {
            Some(i) => i.state.stop_token().child_token(),
            None => CancellationToken::new(),
        }
    }

    /// Why the holder was asked to step down, once it was.
    pub fn step_down_reason(&self) -> Option<StepDownReason> {
        self.state()?.step_down_reason().map(|(r, _)| r.clone())
    }

    /// When the holder was asked to step down, once it was.
    pub fn stepping_down_at(&self) -> Option<Instant> {
        self.state()?.step_down_reason().map(|(_, at)| *at)
    }

    fn state(&self) -> Option<&GrantState> {
        self.inner.as_ref().map(|i| &*i.state)
    }
}

impl fmt::Debug for WorkGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(i) => f
                .debug_struct("WorkGuard")
                .field("election", &i.state.election)
                .field("token", &i.state.token.0)
                .field("done", &i.done.load(Ordering::SeqCst))
                .finish(),
            None => f.write_str("WorkGuard(detached)"),
        }
    }
}
