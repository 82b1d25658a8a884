//! For backend authors: the store primitives a backend supplies, and the kit every
//! backend is built on ([`config`]: URL grammar, secrets, value parsers, environment
//! overrides; [`requests`]: the timeout, error tagging and counting of every store
//! request). Users normally work with [`Session`](crate::Session) and
//! [`Leadership`](crate::Leadership), which drive these.

mod caps;
pub mod config;
mod driven;
mod floor;
mod follow;
mod inflight;
pub use inflight::{Entered, Inflight};
mod life;
pub(crate) mod mem_members;
pub mod primitive;
mod primitive_mem;
mod record;
pub mod requests;
mod stream;

pub use crate::random::{random_id, random_unit};
pub use caps::{Capabilities, Clause, PRIORITY_NOT_YET, STATE_NOT_YET};
pub use driven::DrivenBackend;
pub use floor::FailoverFloor;
pub use life::Lifetime;
pub use primitive::Primitives;
pub use primitive_mem::MemPrimitives;
pub use record::{decode_record, encode_record, revision_token};
pub use requests::{Purpose, Requests, Tag};
pub use stream::{poll_stream, watch_stream, Published};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_core::Stream;
use tokio::sync::mpsc;

use crate::error::Result;
use crate::error::{Error, ErrorKind};
use crate::name::{Candidate, ElectionName, FencingToken, LeaderInfo, Member};
use crate::timing::Timing;

/// Whether a campaign waits for the seat or takes it only if it is free now (what
/// `BackendSession::campaign` and `try_campaign` do); backends that share one code path
/// for both pass this instead of a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CampaignMode {
    /// Queue and wait until granted.
    Wait,
    /// Take the seat only if it is free now; never queue.
    TryOnce,
}

/// The future a [`Driver`] returns.
pub type Connecting<'a> = Pin<Box<dyn Future<Output = Result<DynBackend>> + Send + 'a>>;

/// How a backend is opened from a URL: the schemes it answers to and its constructor.
/// Each backend crate exports one (`tenure_etcd::DRIVER`, …); `tenure::connect` and
/// `tenure::schemes` read the same list of them, so a backend is registered in one
/// place.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Driver {
    /// The schemes, lowercase (`["etcd", "etcds"]`).
    pub schemes: &'static [&'static str],
    /// Parse the URL and connect.
    pub connect: for<'a> fn(&'a str) -> Connecting<'a>,
}

impl Driver {
    /// A driver for `schemes` opened by `connect`.
    pub const fn new(
        schemes: &'static [&'static str],
        connect: for<'a> fn(&'a str) -> Connecting<'a>,
    ) -> Self {
        Driver { schemes, connect }
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("schemes", &self.schemes)
            .finish()
    }
}

/// Open `url` with the driver of `drivers` whose schemes contain the URL's scheme; an
/// unknown scheme is `InvalidArgument` listing the known ones.
pub async fn connect_with(drivers: &[Driver], url: &str) -> Result<DynBackend> {
    let (scheme, _) = config::split_scheme(url)?;
    match drivers
        .iter()
        .find(|d| d.schemes.contains(&scheme.as_str()))
    {
        Some(driver) => (driver.connect)(url).await,
        None => {
            let known: Vec<&str> = drivers
                .iter()
                .flat_map(|d| d.schemes.iter().copied())
                .collect();
            Err(Error::invalid(format!(
                "url: unknown scheme {scheme:?}; this build knows: {}",
                known.join(", ")
            )))
        }
    }
}

/// A stream of leader states of one election: `None` while the seat is free.
pub type LeaderStream = Pin<Box<dyn Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static>>;

/// A stream of member lists of one namespace (sorted by id): the current list first,
/// then the list after changes (coalescing allowed, never a stale final state).
pub type MemberStream = Pin<Box<dyn Stream<Item = Result<Vec<Member>>> + Send + 'static>>;

/// Lock `mutex`, also when a thread panicked while holding it (a poisoned lock): a
/// backend goes on with the state as it was left rather than panicking in turn.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many whole `unit`s cover `d`: rounded up (so a store never keeps something
/// shorter than asked), saturating at `u64::MAX`. Stores count TTLs in whole seconds
/// (etcd leases) or milliseconds (Redis).
pub fn whole_units(d: Duration, unit: Duration) -> u64 {
    let units = d.as_nanos().div_ceil(unit.as_nanos().max(1));
    u64::try_from(units).unwrap_or(u64::MAX)
}

/// The error a backend without membership returns (the default of the membership
/// methods).
pub fn membership_unsupported(scheme: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("membership is not supported by the {scheme} backend"),
    )
}

/// The error a backend without priorities (clause 14) answers to a handover.
pub fn handover_unsupported(scheme: &'static str) -> Error {
    handover_refused(scheme, None)
}

/// A handover refused with `Unsupported`, with the backend's declared reason if any
/// (see [`Capabilities::priority_refusal`]).
pub(crate) fn handover_refused(scheme: &'static str, why: Option<&str>) -> Error {
    let text = match why {
        Some(why) => format!("handover is not supported by the {scheme} backend: {why}"),
        None => {
            format!("handover is not supported by the {scheme} backend yet (contract clause 14)")
        }
    };
    Error::new(ErrorKind::Unsupported, text).with_backend(scheme)
}

/// A backend behind an `Arc`, as services hold it.
pub type DynBackend = Arc<dyn Backend>;

/// A backend session behind an `Arc`, as [`Backend::open_session`] returns it.
pub type DynSession = Arc<dyn BackendSession>;

/// A coordination store: opens sessions and lets anyone read and watch leaders.
///
/// Implementations supply store primitives only; the core ([`Session`](crate::Session))
/// drives renewal, deadlines, retries and the lost signal for every backend alike.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// The URL scheme of this backend (`"mem"`, `"etcd"`, …), also used in errors and
    /// metrics.
    fn scheme(&self) -> &'static str;

    /// Which contract clauses this backend keeps, and why not where it does not; the
    /// default is every clause, with notifications (no polling).
    fn capabilities(&self) -> Capabilities {
        Capabilities::full()
    }

    /// Reject timings this backend cannot honour (e.g. Azure leases of 15–60 s only).
    /// Called after [`Timing::validate`], before a session opens.
    fn check_timing(&self, timing: &Timing) -> Result<()> {
        let _ = timing;
        Ok(())
    }

    /// Open a session that the store keeps for `ttl` after each renewal. The backend
    /// reports losses it learns of by itself through `events`.
    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession>;

    /// The current holder of `election`, if any.
    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>>;

    /// Leader changes of `election`: the current state first, then every change in order
    /// or at least the latest state (coalescing allowed, never a stale final state).
    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream>;

    /// Ask the holder of `election` to step down to a waiter (contract clause 14): the
    /// waiter whose candidate id is `to`, or with `None` the best one (highest priority,
    /// then queue order), even a holder that campaigned
    /// [`never_preempted`](crate::Candidate::never_preempted). The holder is told as for
    /// a preemption ([`SessionEvents::preempted`]); the next grant goes to `to` if it
    /// still waits then. Returns the holder asked. Nobody leading, nobody waiting, or no
    /// waiter `to`: `InvalidArgument` naming the election. Only for a backend that
    /// declares [`Capabilities::priority`]; the default answers `Unsupported`.
    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        let _ = (election, to);
        Err(handover_unsupported(self.scheme()))
    }

    /// Store requests made for elections (campaign, resign, wake-ups, reads) since the
    /// backend was created, not counting session renewals; `None` if not counted. The
    /// conformance suite uses it to check that waiters do not stampede (clause 7).
    fn election_requests(&self) -> Option<u64> {
        None
    }

    /// The members registered under `namespace` right now, sorted by id, one entry per
    /// id (the latest registration wins). Namespaces are separate from elections: a
    /// namespace and an election may have the same name.
    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let _ = namespace;
        Err(membership_unsupported(self.scheme()))
    }

    /// The member list of `namespace`: the current list first, then the list after
    /// every change (coalescing allowed, never a stale final state). A member whose
    /// session ends or expires disappears within the TTL plus the store's own expiry
    /// granularity.
    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let _ = namespace;
        Err(membership_unsupported(self.scheme()))
    }
}

/// A session in the store. At most one candidacy per election per session.
#[async_trait]
pub trait BackendSession: Send + Sync + fmt::Debug + 'static {
    /// An id for logs and fault hooks (e.g. the etcd lease id).
    fn id(&self) -> &str;

    /// Renew the session once: one round trip for every election it holds where the
    /// store allows. `Err` with [`ErrorKind::SessionExpired`](crate::ErrorKind) if the
    /// store no longer has the session.
    async fn keep_alive(&self) -> Result<()>;

    /// Join `election` and wait until this session holds it; returns the grant's fencing
    /// token. Waiters are woken one at a time (no herd) where the store allows.
    ///
    /// If the future is dropped, the core calls [`resign`](Self::resign) with `None`.
    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken>;

    /// Take `election` if it is free right now, without queueing.
    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>>;

    /// Give up `election`: with `Some(token)`, only the grant with that token; with
    /// `None`, whatever candidacy or grant this session has. Idempotent.
    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()>;

    /// Give up `election` held with `token`, leaving `state` (at most
    /// [`MAX_STATE`](crate::engine::MAX_STATE) bytes) to the next grant (clause 16):
    /// the waiter this release grants, or with nobody waiting the next candidate
    /// granted. Only for a backend that declares [`Capabilities::inheriting`]; the
    /// default answers `Unsupported`.
    async fn resign_with(
        &self,
        election: &ElectionName,
        token: FencingToken,
        state: &[u8],
    ) -> Result<()> {
        let _ = (election, token, state);
        Err(Error::new(ErrorKind::Unsupported, STATE_NOT_YET))
    }

    /// What this session's grant of `election` with `token` inherited (clause 16): the
    /// token of the grant that left it and the state. `None` when nothing was left, or
    /// the backend does not keep clause 16.
    fn inherited(
        &self,
        election: &ElectionName,
        token: FencingToken,
    ) -> Option<(FencingToken, Vec<u8>)> {
        let _ = (election, token);
        None
    }

    /// Take each of `seats` that is free right now, without queueing, as
    /// [`try_campaign`](Self::try_campaign) does for one: one answer per seat, in order
    /// (`Some(token)` granted, `None` held or queued for by another session). Each
    /// granted seat has its own fencing token and the same at-most-one guarantee. A store
    /// that can ask for many seats in one round trip (an etcd transaction, one Redis
    /// script) overrides this and declares its batch size in
    /// [`Capabilities::batch`]; the default asks seat by seat. On `Err`, some seats may
    /// have been granted: the core then resigns every seat of the batch.
    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let mut answers = Vec::with_capacity(seats.len());
        for (election, candidate) in seats {
            answers.push(self.try_campaign(election, candidate).await?);
        }
        Ok(answers)
    }

    /// Give up each of `grants`, as [`resign`](Self::resign) does for one. The default
    /// resigns one by one; a store with batches overrides it.
    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        for (election, token) in grants {
            self.resign(election, *token).await?;
        }
        Ok(())
    }

    /// End the session in the store, releasing everything it holds (e.g. revoke the
    /// etcd lease). Idempotent.
    async fn close(&self) -> Result<()>;

    /// The process gives this session up without releasing anything, as in a crash
    /// ([`Session::abandon`](crate::Session::abandon)): stop whatever would keep it alive
    /// without renewals (e.g. a client's own pings), so the store expires it after its
    /// TTL. The default does nothing (a lease that is not renewed expires by itself).
    fn abandon(&self) {}

    /// Register `member` under `namespace` for as long as this session lives, or
    /// replace the value of this session's registration with the same id. The entry
    /// goes when the session is closed or expires, or on
    /// [`unregister_member`](Self::unregister_member).
    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let _ = (namespace, member);
        Err(Error::new(
            ErrorKind::Unsupported,
            "membership is not supported by this backend",
        ))
    }

    /// Remove this session's registration `id` under `namespace`. Idempotent.
    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        let _ = (namespace, id);
        Err(Error::new(
            ErrorKind::Unsupported,
            "membership is not supported by this backend",
        ))
    }
}

/// What a backend learned about its session by itself (watch events, failed pushes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// The seat of `election` held with `token` is gone (deleted, taken over).
    ElectionLost {
        /// The election.
        election: ElectionName,
        /// The grant that was lost.
        token: FencingToken,
        /// Why, for logs.
        reason: String,
    },
    /// The whole session expired in the store.
    Expired {
        /// Why, for logs.
        reason: String,
    },
    /// A candidate with a higher priority waits for the seat of `election` held with
    /// `token`, or a handover was asked for (contract clause 14): the core asks the
    /// holder to step down (clause 15) and releases the seat once its work
    /// acknowledged or the step-down grace ran out; the lost signal fires then
    /// ([`LossReason::Preempted`](crate::LossReason::Preempted)).
    Preempted {
        /// The election.
        election: ElectionName,
        /// The grant to give up.
        token: FencingToken,
    },
}

/// The channel through which a backend reports [`SessionEvent`]s to the core.
#[derive(Clone, Debug)]
pub struct SessionEvents(mpsc::UnboundedSender<SessionEvent>);

impl SessionEvents {
    /// A channel pair; the core keeps the receiver.
    pub fn channel() -> (SessionEvents, mpsc::UnboundedReceiver<SessionEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (SessionEvents(tx), rx)
    }

    /// Report that the grant `token` of `election` is gone.
    pub fn election_lost(&self, election: &ElectionName, token: FencingToken, reason: &str) {
        let _ = self.0.send(SessionEvent::ElectionLost {
            election: election.clone(),
            token,
            reason: reason.to_string(),
        });
    }

    /// Report that a candidate with a higher priority waits for the seat of
    /// `election` this session holds with `token` (or a handover was asked for); the
    /// core asks the holder to step down and releases the seat once it has.
    pub fn preempted(&self, election: &ElectionName, token: FencingToken) {
        let _ = self.0.send(SessionEvent::Preempted {
            election: election.clone(),
            token,
        });
    }

    /// Report that the session expired.
    pub fn expired(&self, reason: &str) {
        let _ = self.0.send(SessionEvent::Expired {
            reason: reason.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_priority_gives_the_declared_reason_or_not_yet() {
        let kept = Capabilities::full().prioritized();
        assert_eq!(kept.priority_refusal(), Ok(()));
        assert_eq!(kept.supports(Clause::Priority), Ok(()));
        let not_yet = Capabilities::full();
        assert_eq!(not_yet.priority_refusal(), Err(None));
        assert_eq!(not_yet.supports(Clause::Priority), Err(PRIORITY_NOT_YET));
        let why = "the foreign recipe has no priority";
        let declared = Capabilities::full().except(Clause::Priority, why);
        assert_eq!(declared.priority_refusal(), Err(Some(why)));
        assert_eq!(declared.supports(Clause::Priority), Err(why));
        let text = handover_refused("etcd", Some(why)).to_string();
        assert!(text.contains(why) && !text.contains("yet"), "{text}");
        let text = handover_unsupported("etcd").to_string();
        assert!(text.contains("etcd backend yet"), "{text}");
    }

    #[test]
    fn whole_units_round_up_and_saturate() {
        let (second, ms) = (Duration::from_secs(1), Duration::from_millis(1));
        assert_eq!(whole_units(Duration::from_secs(2), second), 2);
        assert_eq!(whole_units(Duration::from_millis(2001), second), 3);
        assert_eq!(whole_units(Duration::from_millis(1500), ms), 1500);
        assert_eq!(whole_units(Duration::from_micros(1_500_001), ms), 1501);
        assert_eq!(whole_units(Duration::from_micros(10), ms), 1);
        assert_eq!(whole_units(Duration::ZERO, ms), 0);
        assert_eq!(whole_units(Duration::MAX, ms), u64::MAX);
        assert_eq!(whole_units(Duration::MAX, second), Duration::MAX.as_secs());
    }
}
