//! The guard a winner holds.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// A candidate with a higher priority joined the election (contract clause 14):
    /// the seat is released as soon as the lost signal has fired, and the preferred
    /// candidate is granted next.
    Preempted,
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
    /// Set by whoever takes on releasing the seat in the store.
    pub(crate) release_claimed: AtomicBool,
    /// Set once the seat is released in the store (or release was given up).
    pub(crate) released: Released,
    /// Where the loss is reported: the session's release task.
    on_loss: mpsc::UnboundedSender<Loss>,
}

impl GrantState {
    pub(crate) fn new(
        backend: &'static str,
        election: ElectionName,
        candidate: Candidate,
        token: FencingToken,
        granted_at: Instant,
        on_loss: mpsc::UnboundedSender<Loss>,
    ) -> Self {
        GrantState {
            backend,
            election,
            candidate,
            token,
            granted_at,
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            release_claimed: AtomicBool::new(false),
            released: Released::default(),
            on_loss,
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
        });
        true
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
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

    /// Resign: the lost signal fires first (reason [`LossReason::Resigned`]), then the
    /// seat is released in the store so the next waiter is granted.
    pub async fn resign(self) -> Result<()> {
        let session = self.session.clone();
        let state = self.end();
        session.release(&state).await
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
