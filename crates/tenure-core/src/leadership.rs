//! The guard a winner holds.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::CampaignMode;
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{is_valid, GrantState, LossReason, StepDownReason, WorkGuard};
use crate::name::{Candidate, ElectionName, FencingToken};
use crate::session::{Session, SessionCore};

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
        let refused = if let Err(e) = crate::engine::check_state("resign_with", &left) {
            Some(e)
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

/// The campaigns of a session, which hand out [`Leadership`]s (the session itself keeps
/// only the grants' shared state).
impl Session {
    /// Campaign for `election` and mode == CampaignMode::Wait until granted. Store errors that may pass
    /// (`Unavailable`, `Timeout`, an expired session) are retried with back-off; bad input
    /// and other errors are returned. Dropping the future withdraws the candidacy.
    pub async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Leadership> {
        let span = tracing::info_span!("tenure.campaign", election = %election, candidate = candidate.id());
        self.campaign_inner(election, candidate, CampaignMode::Wait)
            .instrument(span)
            .await?
            .map(|state| self.leadership(state))
            .ok_or_else(|| Error::new(ErrorKind::Backend, "campaign ended without a grant"))
    }

    /// Take `election` only if it is free now; `Ok(None)` if someone else holds it.
    pub async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<Leadership>> {
        let span = tracing::info_span!("tenure.try_campaign", election = %election, candidate = candidate.id());
        let grant = self.campaign_inner(election, candidate, CampaignMode::TryOnce);
        Ok(grant
            .instrument(span)
            .await?
            .map(|state| self.leadership(state)))
    }

    /// Take each of `seats` that is free now, in as few store round trips as the
    /// backend allows (see [`Capabilities::batch`](crate::backend::Capabilities::batch)):
    /// one answer per seat, in order, `None` where another session holds or queues for
    /// it. Each [`Leadership`] is as one from [`try_campaign`](Self::try_campaign), with
    /// its own token. The same election twice, or one this session holds or is
    /// campaigning for, is `InvalidArgument`; on an error no seat of the batch is kept.
    /// The batch may take the connect timeout once per round trip it needs.
    pub async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<Leadership>>> {
        let span = tracing::info_span!("tenure.try_campaign_many", seats = seats.len());
        let grants = self.try_many_inner(seats).instrument(span).await?;
        Ok(grants
            .into_iter()
            .map(|g| g.map(|state| self.leadership(state)))
            .collect())
    }

    /// Resign every one of `leaderships`, as [`Leadership::resign`] does for one, in as
    /// few store round trips as the backend allows
    /// ([`Capabilities::batch`](crate::backend::Capabilities::batch)): every lost signal
    /// fires first ([`LossReason::Resigned`]), then the seats are released, with the
    /// retries of a single resign. A leadership of another session is resigned through
    /// its own. The first error is returned; every lost signal fires either way.
    pub async fn resign_many(&self, leaderships: Vec<Leadership>) -> Result<()> {
        let core = self.core();
        let (mine, others): (Vec<Leadership>, Vec<Leadership>) = leaderships
            .into_iter()
            .partition(|l| Arc::ptr_eq(l.session.core(), core));
        let mut result = Ok(());
        for other in others {
            result = result.and(other.resign().await);
        }
        let states: Vec<Arc<GrantState>> = mine.into_iter().map(Leadership::end).collect();
        let span = tracing::info_span!("tenure.resign_many", seats = states.len());
        result.and(core.release_many(&states).instrument(span).await)
    }

    /// The handle of a grant this session registered.
    fn leadership(&self, state: Arc<GrantState>) -> Leadership {
        Leadership {
            state,
            session: self.clone(),
        }
    }
}
