//! Sessions: the core drives renewal, deadlines, retries and the lost signal once for
//! every backend.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify, OwnedMutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{
    CampaignMode, DynBackend, DynSession, LeaderStream, MemberStream, SessionEvent, SessionEvents,
};
use crate::error::{Error, ErrorKind, Result};
use crate::grant::{is_valid, GrantState, Loss, LossReason, StepDownReason};
use crate::name::{Candidate, ElectionName, FencingToken, LeaderInfo, Member};
use crate::observer::Observer;
use crate::timing::Timing;

mod campaign;
mod release;
mod renewal;
mod tables;

use tables::{Early, EarlyLosses, ElectionLocks};

/// A liveness scope in a store. Everything held through a session is lost when it
/// expires; one session can hold any number of elections.
///
/// The core renews the session every `renew_interval`, keeps the local deadline
/// (send time of the last confirmed renewal + `renew_deadline`), fires the lost signal of
/// every [`Leadership`](crate::Leadership) when that deadline passes or the store reports the session gone,
/// and re-opens an expired session by itself so campaigns go on.
///
/// `Session` is cheap to clone; the session closes when the last clone (and the last
/// [`Leadership`](crate::Leadership) obtained through it) is dropped, or on [`close`](Self::close).
#[derive(Clone)]
pub struct Session {
    handle: Arc<Handle>,
}

struct Handle {
    core: Arc<SessionCore>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let core = self.core.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { core.close().await });
        } else {
            core.stop_tasks();
        }
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.handle.core.scheme)
            .field("id", &self.id())
            .finish()
    }
}

pub(crate) struct SessionCore {
    backend: DynBackend,
    scheme: &'static str,
    timing: Timing,
    current: RwLock<DynSession>,
    generation: watch::Sender<u64>,
    base: Instant,
    /// Nanoseconds after `base` until which grants are valid.
    deadline_ns: AtomicU64,
    deadline_moved: Notify,
    /// Wakes the renewal task to renew at once ([`Session::renew_now`]).
    renew_soon: Notify,
    held: Mutex<HashMap<ElectionName, Arc<GrantState>>>,
    /// Losses reported for grants not in `held` (yet); locked only with `held` locked.
    early_losses: Mutex<EarlyLosses>,
    locks: Mutex<ElectionLocks>,
    /// Member registrations made through this session, by (namespace, id); re-made in
    /// the store when an expired session is re-opened.
    registrations: Mutex<HashMap<(ElectionName, String), Member>>,
    /// Stops the renewal task (cancelled on close and on abandon).
    stop_renewal: CancellationToken,
    /// Stops every background task (cancelled on close).
    stop_all: CancellationToken,
    closed: AtomicBool,
    abandoned: AtomicBool,
    span: tracing::Span,
    /// Every grant reports its loss here, to the release task.
    lost_tx: mpsc::UnboundedSender<Loss>,
    /// Receivers of [`Session::losses`].
    listeners: Mutex<Vec<mpsc::UnboundedSender<Loss>>>,
}

impl Session {
    /// Validate `timing` (and the backend's own limits), open a session in the store and
    /// start renewing it. Fails with `Unavailable`/`Timeout` within
    /// `timing.connect_timeout` if the store cannot be reached.
    pub async fn open(backend: DynBackend, timing: Timing) -> Result<Session> {
        timing.validate()?;
        backend.check_timing(&timing)?;
        let scheme = backend.scheme();
        let (events, events_rx) = SessionEvents::channel();
        let sent = Instant::now();
        let bs = open_backend_session(&backend, &timing, events).await?;
        let span = tracing::info_span!("tenure.session", backend = scheme, session = %bs.id());
        tracing::debug!(parent: &span, ttl = ?timing.ttl, "session opened");
        let (generation, _) = watch::channel(0);
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        let base = sent;
        let core = Arc::new(SessionCore {
            backend,
            scheme,
            current: RwLock::new(bs),
            generation,
            base,
            deadline_ns: AtomicU64::new(duration_ns(timing.renew_deadline)),
            deadline_moved: Notify::new(),
            renew_soon: Notify::new(),
            held: Mutex::new(HashMap::new()),
            early_losses: Mutex::new(EarlyLosses::default()),
            locks: Mutex::new(ElectionLocks::default()),
            registrations: Mutex::new(HashMap::new()),
            stop_renewal: CancellationToken::new(),
            stop_all: CancellationToken::new(),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            span,
            timing,
            lost_tx,
            listeners: Mutex::new(Vec::new()),
        });
        tokio::spawn(
            core.clone()
                .renewal_task(events_rx)
                .instrument(core.span.clone()),
        );
        tokio::spawn(core.clone().deadline_task().instrument(core.span.clone()));
        tokio::spawn(
            core.clone()
                .release_task(lost_rx)
                .instrument(core.span.clone()),
        );
        Ok(Session {
            handle: Arc::new(Handle { core }),
        })
    }

    pub(crate) fn core(&self) -> &Arc<SessionCore> {
        &self.handle.core
    }

    /// The store's id of the current session (changes when an expired session is
    /// re-opened).
    pub fn id(&self) -> String {
        self.core().current().id().to_string()
    }

    /// The backend this session lives in.
    pub fn backend(&self) -> &DynBackend {
        &self.core().backend
    }

    /// The timing this session was opened with.
    pub fn timing(&self) -> &Timing {
        &self.core().timing
    }

    /// The instant until which grants of this session are valid unless renewed.
    pub fn deadline(&self) -> Instant {
        self.core().deadline()
    }

    /// Renew now rather than at the next renew interval: for a caller that has a sign
    /// the store may have ended the session (a member of this session vanished from a
    /// watched list, seats were deleted), so that a session the store expired or
    /// revoked is found so, and re-opened (its registrations made again), at once. A
    /// request of this session that finds it gone does the same by itself. Cheap: one
    /// renewal; calls that come while one is due are folded into it.
    pub fn renew_now(&self) {
        self.core().renew_soon.notify_one();
    }

    /// How many times the session was re-opened after expiring.
    pub fn generation(&self) -> u64 {
        *self.core().generation.borrow()
    }

    /// Every loss of a grant of this session from now on, in the order the session
    /// notices them, with the reason ([`Loss`]): one receiver for many elections
    /// instead of a task per [`Leadership::lost`](crate::Leadership::lost) signal. A loss is reported after the
    /// grant's own lost signal fired. The receiver ends when the session is closed
    /// (after the losses the close caused).
    pub fn losses(&self) -> Losses {
        let (tx, rx) = mpsc::unbounded_channel();
        let core = self.core();
        let mut listeners = core.lock_listeners();
        // A closed session has no losses left to report: the receiver ends at once.
        if !core.stop_all.is_cancelled() {
            listeners.push(tx);
        }
        Losses(rx)
    }

    /// The reads this session makes (leaders, members), as an [`Observer`] on its
    /// backend bounded by its connect timeout.
    pub fn observer(&self) -> Observer {
        let core = self.core();
        Observer::new(core.backend.clone(), core.timing.connect_timeout)
    }

    /// The current holder of `election` (anyone may ask; see [`Observer::leader`]).
    pub async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.observer().leader(election).await
    }

    /// Leader changes of `election` (see [`Observer::observe`]).
    pub async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.observer().observe(election).await
    }

    /// Register `member` under `namespace` for as long as this session lives (the store
    /// drops it when the session ends or expires). Registering the same id again
    /// replaces its value. If the session expires and is re-opened, the registration is
    /// made again in the new session.
    pub async fn register(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let core = self.core();
        core.check_open()?;
        core.lock_registrations()
            .insert((namespace.clone(), member.id().to_string()), member.clone());
        with_timeout(
            &core.timing,
            core.current().register_member(namespace, member),
        )
        .await
        .map_err(|e| core.tag(core.check_expired(e)))
    }

    /// Remove this session's registration `id` under `namespace`. Idempotent.
    pub async fn unregister(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        let core = self.core();
        core.lock_registrations()
            .remove(&(namespace.clone(), id.to_string()));
        core.check_open()?;
        with_timeout(
            &core.timing,
            core.current().unregister_member(namespace, id),
        )
        .await
        .map_err(|e| core.tag(e))
    }

    /// The members of `namespace` right now (see [`Observer::members`]).
    pub async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let core = self.core();
        self.observer()
            .members(namespace)
            .await
            .map_err(|e| core.tag(e))
    }

    /// Member lists of `namespace` as they change (see [`Observer::watch_members`]).
    pub async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let core = self.core();
        self.observer()
            .watch_members(namespace)
            .await
            .map_err(|e| core.tag(e))
    }

    /// Close the session: every leadership fires its lost signal
    /// ([`LossReason::SessionClosed`]) and the store releases everything the session
    /// held. Idempotent.
    pub async fn close(&self) -> Result<()> {
        self.core().close().await
    }

    /// True once the session was closed or abandoned (it will not be re-opened).
    pub fn is_closed(&self) -> bool {
        self.core().closed.load(Ordering::SeqCst)
    }

    /// Stop renewing without releasing anything, as if this process had crashed: the
    /// store expires the session after its TTL. Local leaderships still fire their lost
    /// signal at the deadline. For fault tests and demos.
    pub fn abandon(&self) {
        let core = self.core();
        core.abandoned.store(true, Ordering::SeqCst);
        core.closed.store(true, Ordering::SeqCst);
        core.stop_renewal.cancel();
        core.current().abandon();
    }

    pub(crate) async fn release(&self, state: &Arc<GrantState>, left: Option<&[u8]>) -> Result<()> {
        self.core().release(state, left).await
    }
}

/// The losses of a session's grants ([`Session::losses`]).
#[derive(Debug)]
pub struct Losses(mpsc::UnboundedReceiver<Loss>);

impl Losses {
    /// The next loss; `None` once the session is closed and every loss was reported.
    pub async fn next(&mut self) -> Option<Loss> {
        self.0.recv().await
    }
}

/// The next backend event, or never once the backend dropped its sender.
async fn recv_event(
    events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    open: &mut bool,
) -> Option<SessionEvent> {
    if !*open {
        return std::future::pending().await;
    }
    events.recv().await
}

/// Whether `state`'s grant ended because the store ended its whole session (expired
/// or revoked it): its seat went with the session, nothing is left to release.
fn ended_with_session(state: &GrantState) -> bool {
    matches!(state.reason(), Some((LossReason::SessionExpired, _)))
}

fn closed_error() -> Error {
    Error::closed()
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn with_timeout<T>(
    timing: &Timing,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    with_timeout_of(timing.connect_timeout, fut).await
}

/// `fut`, or a `Timeout` error after `limit` (the connect timeout, or one per round
/// trip of a batch).
async fn with_timeout_of<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("no answer within {limit:?} (connect_timeout per round trip)"),
        )),
    }
}

async fn open_backend_session(
    backend: &DynBackend,
    timing: &Timing,
    events: SessionEvents,
) -> Result<DynSession> {
    with_timeout(timing, backend.open_session(timing.ttl, events))
        .await
        .map_err(|e| {
            if e.backend().is_none() {
                e.with_backend(backend.scheme())
            } else {
                e
            }
        })
}

impl SessionCore {
    fn lock_registrations(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(ElectionName, String), Member>> {
        match self.registrations.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// A request found the session gone from the store: have the renewal task see so
    /// and re-open it now, not at the next renewal.
    fn check_expired(&self, e: Error) -> Error {
        if e.kind() == ErrorKind::SessionExpired {
            self.renew_soon.notify_one();
        }
        e
    }

    /// Name the backend in an error that does not yet.
    fn tag(&self, e: Error) -> Error {
        if e.backend().is_none() {
            e.with_backend(self.scheme)
        } else {
            e
        }
    }

    /// Make every registration again in the current backend session (after a re-open),
    /// retrying until each is in or the session closes.
    async fn reregister(self: Arc<Self>) {
        let regs: Vec<_> = self
            .lock_registrations()
            .iter()
            .map(|((ns, _), m)| (ns.clone(), m.clone()))
            .collect();
        for (ns, member) in regs {
            let mut attempt = 0u32;
            loop {
                if self.stop_renewal.is_cancelled() {
                    return;
                }
                // Skip registrations withdrawn meanwhile.
                let wanted = self
                    .lock_registrations()
                    .get(&(ns.clone(), member.id().to_string()))
                    .cloned();
                let Some(member) = wanted else { break };
                let bs = self.current();
                match with_timeout(&self.timing, bs.register_member(&ns, &member)).await {
                    Ok(()) => break,
                    Err(e) => {
                        let delay = self.timing.retry.delay(attempt);
                        attempt = attempt.saturating_add(1);
                        tracing::warn!(namespace = %ns, member = member.id(), error = %e, ?delay, "could not register again after re-opening the session");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = self.stop_renewal.cancelled() => return,
                        }
                    }
                }
            }
        }
    }

    fn current(&self) -> DynSession {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_current(&self, bs: DynSession) {
        match self.current.write() {
            Ok(mut g) => *g = bs,
            Err(poisoned) => *poisoned.into_inner() = bs,
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.deadline_ns.load(Ordering::SeqCst))
    }

    fn extend_deadline(&self, to: Instant) {
        let ns = duration_ns(to.saturating_duration_since(self.base));
        let prev = self.deadline_ns.fetch_max(ns, Ordering::SeqCst);
        if ns > prev {
            self.deadline_moved.notify_one();
        }
    }

    /// Grants answered after the session was closed or abandoned are not handed out.
    /// After a close they are given back; after an abandon (a crash) they are left to
    /// the store, which frees them with the session's lease, as it would had the
    /// process died before the answer came.
    async fn check_open_after_grant(
        &self,
        bs: &DynSession,
        grants: &[(ElectionName, Option<FencingToken>)],
    ) -> Result<()> {
        if !self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !self.abandoned.load(Ordering::SeqCst) && !grants.is_empty() {
            let _ = with_timeout_of(self.batch_timeout(grants.len()), bs.resign_many(grants)).await;
        }
        Err(closed_error().with_backend(self.scheme))
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            Err(closed_error().with_backend(self.scheme))
        } else {
            Ok(())
        }
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<ElectionName, Arc<GrantState>>> {
        crate::backend::lock(&self.held)
    }

    /// Before a campaign for `election`: refuse if this session holds it; if it held it
    /// and lost it, wait until the seat is gone from the store, or the store could hand
    /// the old grant back. A release still going on in the background (the store did
    /// not answer it in time) is waited for `limit` at the most (`None`: until it is
    /// done), then this fails with `Timeout`.
    async fn settle_held(
        self: &Arc<Self>,
        election: &ElectionName,
        limit: Option<Duration>,
    ) -> Result<()> {
        let Some(grant) = self.held_grant(election) else {
            return Ok(());
        };
        if !grant.is_lost() {
            return Err(Error::invalid(format!(
                "election {election}: this session already holds it"
            )));
        }
        if !grant.release_claimed.swap(true, Ordering::SeqCst) {
            if let Err(e) = self.release(&grant, None).await {
                tracing::warn!(election = %election, error = %e, "could not release a lost seat");
            }
        }
        let released = grant.released.wait();
        match limit {
            None => released.await,
            Some(limit) => tokio::time::timeout(limit, released).await.map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "election {election}: the release of this session's last grant is \
                         still waiting for the store"
                    ),
                )
                .with_backend(self.scheme)
            })?,
        }
        Ok(())
    }

    fn held_grant(&self, election: &ElectionName) -> Option<Arc<GrantState>> {
        self.lock_held().get(election).cloned()
    }

    fn election_lock(&self, election: &ElectionName) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = match self.locks.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        locks.get(election)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn early_losses_are_kept_a_ttl_and_swept_at_doubling_sizes() {
        let ttl = Duration::from_secs(10);
        let name = |i: usize| ElectionName::new(format!("e/{i}")).expect("name");
        let gone = || Early::Lost(LossReason::Revoked("gone".into()));
        let asked = || Early::StepDown(StepDownReason::Preempted);
        let mut early = EarlyLosses::default();
        for i in 0..2000 {
            early.insert(name(i), FencingToken(i as u64), gone(), ttl);
        }
        // Nothing is old enough to go: every report is still there.
        assert_eq!(early.map.len(), 2000);
        assert_eq!(early.take(&name(7)), Some((FencingToken(7), gone())));
        assert_eq!(early.take(&name(7)), None);
        tokio::time::advance(ttl).await;
        early.insert(name(5000), FencingToken(1), asked(), ttl);
        // The next insert past the doubled size sweeps the reports older than a TTL.
        for i in 5001..5000 + early.sweep_at {
            early.insert(name(i), FencingToken(1), asked(), ttl);
        }
        assert!((0..2000).all(|i| !early.map.contains_key(&name(i))));
        assert_eq!(early.take(&name(5000)), Some((FencingToken(1), asked())));
        // A step-down request does not hide the same grant's loss.
        early.insert(name(9), FencingToken(3), gone(), ttl);
        early.insert(name(9), FencingToken(3), asked(), ttl);
        assert_eq!(early.take(&name(9)), Some((FencingToken(3), gone())));
    }

    #[test]
    fn election_locks_sweep_rarely_and_drop_unused_locks() {
        let mut locks = ElectionLocks::default();
        let name = |i: usize| ElectionName::new(format!("e/{i}")).expect("name");
        // 10,000 locks held at once (a node campaigning for 10,000 shards): each
        // sweep finds them all in use, so sweeps must come at doubling sizes, not at
        // every call past the threshold.
        let held: Vec<_> = (0..10_000).map(|i| locks.get(&name(i))).collect();
        assert!(
            locks.sweeps <= 10,
            "{} sweeps for 10,000 locks",
            locks.sweeps
        );
        assert_eq!(locks.map.len(), 10_000);
        // Once let go, they are dropped as new elections come.
        drop(held);
        for i in 10_000..30_000 {
            drop(locks.get(&name(i)));
        }
        assert!(locks.map.len() <= 129, "{} locks kept", locks.map.len());
        // The same election gets the same lock while it is held.
        let a = locks.get(&name(1));
        assert!(Arc::ptr_eq(&a, &locks.get(&name(1))));
    }

    /// A store that answers nothing for a while and then answers again: the renewal
    /// after it answers goes out then, not a back-off later. With the old schedule
    /// (each unanswered attempt followed by a doubling back-off) the attempt after
    /// six unanswered ones left at 8.05 s, past the 8 s deadline, and the seat was
    /// lost although the store answered again at 7.3 s.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_is_in_flight_when_the_store_answers_again() {
        let mem = crate::MemoryBackend::new();
        let mut timing = Timing::from_ttl(Duration::from_secs(10));
        timing.renew_interval = Duration::from_secs(2);
        timing.renew_deadline = Duration::from_secs(6);
        timing.connect_timeout = Duration::from_millis(500);
        timing.retry.jitter = 0.0;
        let s = Session::open(Arc::new(mem.clone()), timing)
            .await
            .expect("session");
        let e = ElectionName::new("answers-again").expect("name");
        let l = s
            .campaign(&e, &Candidate::new("a").expect("candidate"))
            .await
            .expect("campaign");
        // The renewal at 2 s is answered; the deadline is then 8 s.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert!(mem.stall_session(&s.id()));
        tokio::time::sleep(Duration::from_millis(5200)).await;
        assert!(mem.unstall_session(&s.id()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            l.is_leader(),
            "lost at {:?}: {:?}",
            l.lost_at(),
            l.loss_reason()
        );
        l.resign().await.expect("resign");
        s.close().await.expect("close");
    }

    /// A batch of tries that met a session the store had ended leaves no candidacy to
    /// withdraw: the same seats can be asked for again at once (through the re-opened
    /// session), not refused as "already campaigning" while a withdrawal goes through
    /// the ended session.
    #[tokio::test(start_paused = true)]
    async fn a_batch_that_met_the_ended_session_can_be_sent_again_at_once() {
        let mem = crate::MemoryBackend::new();
        let s = Session::open(
            Arc::new(mem.clone()),
            Timing::from_ttl(Duration::from_secs(10)),
        )
        .await
        .expect("session");
        let seats = vec![
            (
                ElectionName::new("ended-a").expect("name"),
                Candidate::new("a").expect("candidate"),
            ),
            (
                ElectionName::new("ended-b").expect("name"),
                Candidate::new("a").expect("candidate"),
            ),
        ];
        let old = s.id();
        assert!(mem.revoke_session(&old));
        let first = s.try_campaign_many(&seats).await;
        assert_eq!(
            first.as_ref().err().map(|e| e.kind()),
            Some(ErrorKind::SessionExpired),
            "{first:?}"
        );
        // Without yielding to other tasks: a withdrawal spawned through the ended
        // session would still hold the elections' locks.
        let again = s.try_campaign_many(&seats).await;
        assert!(
            again
                .as_ref()
                .err()
                .is_none_or(|e| e.kind() != ErrorKind::InvalidArgument),
            "{again:?}"
        );
        s.close().await.expect("close");
    }
    /// A crash is a crash whenever the store's answer comes: a grant answered after
    /// the session was abandoned is not handed out (the process would not be there to
    /// hold it); the store frees the seat when the session's lease runs out. Before,
    /// the waiting campaign returned a leadership of the abandoned session when the
    /// grant and the abandon crossed (seen on Azure in CI: "the crashed waiter was
    /// granted").
    #[tokio::test(start_paused = true)]
    async fn a_grant_answered_after_the_abandon_is_not_handed_out() {
        let mem = crate::MemoryBackend::new();
        let timing = Timing::from_ttl(Duration::from_secs(10));
        let holder = Session::open(Arc::new(mem.clone()), timing.clone())
            .await
            .expect("session");
        let crashed = Session::open(Arc::new(mem.clone()), timing)
            .await
            .expect("session");
        let e = ElectionName::new("crossed").expect("name");
        let h = holder
            .campaign(&e, &Candidate::new("h").expect("candidate"))
            .await
            .expect("holder");
        let waiter = {
            let (s, e) = (crashed.clone(), e.clone());
            tokio::spawn(async move { s.campaign(&e, &Candidate::new("w").expect("c")).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The process crashes; then the store grants the waiter in this release, and
        // the answer comes to a session that is gone. (Crashing after the resign
        // returned made the test depend on whether the waiter had run in between: the
        // release's write runs in a task of its own, and it had.)
        crashed.abandon();
        h.resign().await.expect("resign");
        let got = waiter.await.expect("join");
        assert!(got.is_err(), "the abandoned session was handed a grant");
        holder.close().await.expect("close");
    }
}
