//! The guard a winner holds.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::name::{Candidate, ElectionName, FencingToken};
use crate::session::{Session, SessionCore};

/// Why a leadership ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The holder resigned (or dropped its [`Leadership`]).
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
    /// The holder's own code asked ([`Leadership::step_down`]) for a reason of its own.
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
    /// deadline itself ([`Leadership::lost_at`]).
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

    fn guard(self: &Arc<Self>) -> WorkGuard {
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

/// Proof of leadership of one election, held by the winner of a campaign.
///
/// - [`token`](Self::token) is the fencing token of this grant.
/// - [`lost`](Self::lost) fires exactly once, before the store could grant the seat to
///   anyone else: when the local deadline (send time of the last confirmed renewal +
///   renew deadline) passes, when the store reports the seat or session gone, or on
///   resign. Once fired it never un-fires (contract clause 3).
/// - [`is_leader`](Self::is_leader) checks the local monotonic deadline without I/O, so
///   it is false after a pause even if no timer has run yet (clause 4).
///
/// Dropping a `Leadership` resigns it in the background; call [`resign`](Self::resign)
/// to wait for the store to confirm.
pub struct Leadership {
    pub(crate) state: Arc<GrantState>,
    pub(crate) session: Session,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.state.election)
            .field("candidate", &self.state.candidate.id())
            .field("token", &self.state.token.0)
            .field("lost", &self.state.is_lost())
            .finish()
    }
}

/// The read side of a grant, shared by [`Leadership`] and [`LeadershipWatch`]: both hold
/// the grant's state and reach the session's deadline through `self.core()`.
macro_rules! grant_reads {
    () => {
        /// The election held.
        pub fn election(&self) -> &ElectionName {
            &self.state.election
        }

        /// The candidate that holds it.
        pub fn candidate(&self) -> &Candidate {
            &self.state.candidate
        }

        /// The fencing token of this grant.
        pub fn token(&self) -> FencingToken {
            self.state.token
        }

        /// When the grant was received (tokio clock).
        pub fn granted_at(&self) -> Instant {
            self.state.granted_at
        }

        /// True while this grant is valid: the lost signal has not fired and the local
        /// deadline has not passed. No I/O; if the deadline has passed it fires the lost
        /// signal itself.
        pub fn is_leader(&self) -> bool {
            is_valid(&self.state, self.core().deadline())
        }

        /// The instant until which this grant is valid unless renewed.
        pub fn deadline(&self) -> Instant {
            self.core().deadline()
        }

        /// The lost signal: a child token that is cancelled when leadership ends.
        /// Cancelling the child does not end leadership.
        pub fn lost(&self) -> CancellationToken {
            self.state.lost_token().child_token()
        }

        /// The stop signal (contract clause 15): cancelled when the holder is asked to
        /// step down ([`step_down_reason`](Self::step_down_reason) says why) and when
        /// leadership ends ([`lost`](Self::lost)). The work should stop when it fires;
        /// on a step-down the seat stays held until the work acknowledges or the
        /// step-down grace runs out. A holder that never asks for this signal (nor
        /// for a [`work_guard`](Self::work_guard)) cannot hear a step-down: its seat is
        /// released at the ask, and its lost signal fires then.
        pub fn stepping_down(&self) -> CancellationToken {
            self.state.listen()
        }

        /// Why the holder was asked to step down, once it was.
        pub fn step_down_reason(&self) -> Option<StepDownReason> {
            self.state.step_down_reason().map(|(r, _)| r.clone())
        }

        /// When the holder was asked to step down, once it was.
        pub fn stepping_down_at(&self) -> Option<Instant> {
            self.state.step_down_reason().map(|(_, at)| *at)
        }

        /// A guard for the work done under this grant (contract clause 15). Once any
        /// guard was handed out, a step-down releases the seat as soon as every guard
        /// is dropped or [`done`](WorkGuard::done) (or at the step-down grace), instead
        /// of waiting for the holder to resign. The shard manager hands one out with
        /// every `Acquired` event.
        pub fn work_guard(&self) -> WorkGuard {
            self.state.guard()
        }

        /// Why leadership ended, once it has.
        pub fn loss_reason(&self) -> Option<LossReason> {
            self.state.reason().map(|(r, _)| r.clone())
        }

        /// When leadership ended: the instant the lost signal fired, or for a missed
        /// deadline the deadline itself.
        pub fn lost_at(&self) -> Option<Instant> {
            self.state.reason().map(|(_, at)| *at)
        }
    };
}

impl Leadership {
    grant_reads!();

    fn core(&self) -> &Arc<SessionCore> {
        self.session.core()
    }

    /// A read-only, clonable view of this grant for other tasks: validity, token and
    /// lost signal. It does not keep the session open nor resign on drop.
    pub fn watch(&self) -> LeadershipWatch {
        LeadershipWatch {
            state: self.state.clone(),
            core: self.session.core().clone(),
        }
    }

    /// Wait until leadership ends and say why.
    pub async fn lost_wait(&self) -> LossReason {
        loop {
            tokio::select! {
                _ = self.state.lost_token().cancelled() => break,
                _ = tokio::time::sleep_until(self.session.deadline()) => {
                    // is_leader() fires the signal if the deadline really passed.
                    if !self.is_leader() {
                        break;
                    }
                }
            }
        }
        self.loss_reason().unwrap_or(LossReason::SessionClosed)
    }

    /// Ask this leadership to step down (contract clause 15) for `reason`: the stop
    /// signal ([`stepping_down`](Self::stepping_down)) fires, the seat stays held and
    /// renewed, and it is released when the holder acknowledges: it resigns or drops
    /// this `Leadership`, or, where [`work_guard`](Self::work_guard)s were handed out,
    /// every guard is gone. At the session's step-down grace it is released anyway (the
    /// lost signal fires then). Returns false if it was asked already or has ended.
    pub fn step_down(&self, reason: StepDownReason) -> bool {
        self.state.ask_step_down(reason)
    }

    /// Resign: the lost signal fires first (reason [`LossReason::Resigned`]), then the
    /// seat is released in the store so the next waiter is granted.
    pub async fn resign(self) -> Result<()> {
        let session = self.session.clone();
        let state = self.end();
        session.release(&state, None).await
    }

    /// Resign as [`resign`](Self::resign) does, leaving `state` (a cursor, a checkpoint:
    /// at most [`MAX_STATE`](crate::engine::MAX_STATE) bytes) to the next grant of the
    /// election (contract clause 16): the waiter this release grants, or with nobody
    /// waiting the next candidate granted, reads it with
    /// [`inherited`](Self::inherited). A state over the limit is `InvalidArgument`, and
    /// a backend that does not declare [`Capabilities::state_transfer`](crate::backend::Capabilities::state_transfer)
    /// answers `Unsupported`; in both cases the seat is released all the same, with no
    /// state left.
    pub async fn resign_with(self, state: impl Into<Vec<u8>>) -> Result<()> {
        let left: Vec<u8> = state.into();
        let session = self.session.clone();
        let grant = self.end();
        let refused = if left.len() > crate::engine::MAX_STATE {
            Some(crate::Error::invalid(format!(
                "resign_with: a state of {} bytes is over the {} a successor may inherit",
                left.len(),
                crate::engine::MAX_STATE
            )))
        } else if let Err(why) = session
            .backend()
            .capabilities()
            .supports(crate::backend::Clause::StateTransfer)
        {
            Some(crate::Error::new(crate::ErrorKind::Unsupported, why))
        } else {
            None
        };
        match refused {
            Some(e) => {
                session.release(&grant, None).await?;
                Err(e.with_backend(grant.backend))
            }
            None => session.release(&grant, Some(&left)).await,
        }
    }

    /// What this grant inherited (clause 16): the fencing token of the grant that left
    /// it and the state, or `None` if the holder before did not leave one (it crashed,
    /// expired, or resigned without a state).
    pub fn inherited(&self) -> Option<(FencingToken, &[u8])> {
        self.state
            .inherited
            .get()
            .map(|(token, state)| (*token, state.as_slice()))
    }

    /// Fire the lost signal ([`LossReason::Resigned`]) and take the release of the seat
    /// on oneself: the caller releases the returned grant in the store.
    pub(crate) fn end(self) -> Arc<GrantState> {
        let state = self.state.clone();
        let session = self.session.clone();
        // Drop runs next and only fires the signal; the caller does the release.
        state.release_claimed.store(true, Ordering::SeqCst);
        drop(self);
        state.fire(LossReason::Resigned, session.core().loss_instant());
        state
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // The session's watcher for this grant releases the seat once the signal fires.
        self.state
            .fire(LossReason::Resigned, self.session.core().loss_instant());
    }
}

fn is_valid(state: &GrantState, deadline: Instant) -> bool {
    if state.is_lost() {
        return false;
    }
    if Instant::now() >= deadline {
        state.fire(LossReason::DeadlineExceeded, deadline);
        return false;
    }
    true
}

/// A guard kept by the work a holder runs under one grant ([`Leadership::work_guard`]).
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

    /// The stop signal of the grant (see [`Leadership::stepping_down`]); a detached
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

/// A clonable, read-only view of a [`Leadership`] (see [`Leadership::watch`]).
#[derive(Clone)]
pub struct LeadershipWatch {
    state: Arc<GrantState>,
    core: Arc<SessionCore>,
}

impl fmt::Debug for LeadershipWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeadershipWatch")
            .field("election", &self.state.election)
            .field("token", &self.state.token.0)
            .field("lost", &self.state.is_lost())
            .finish()
    }
}

impl LeadershipWatch {
    grant_reads!();

    fn core(&self) -> &Arc<SessionCore> {
        &self.core
    }
}
