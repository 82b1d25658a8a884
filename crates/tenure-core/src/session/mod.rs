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

/// Losses the backend reported for grants the session has not registered (yet): by
/// election, the token, the reason and when the report came (see
/// [`SessionCore::grant_lost`]). Reports older than a TTL are swept once the map has
/// doubled since the last sweep, as [`ElectionLocks`] does: they are of grants the
/// session gave up before the report came.
#[derive(Default)]
struct EarlyLosses {
    map: HashMap<ElectionName, (FencingToken, Early, Instant)>,
    sweep_at: usize,
}

/// What the backend reported of a grant before it was registered: its loss, or a
/// request to step down (a preemption or handover that reached the holder's session
/// before the campaign's answer was read).
#[derive(Clone, Debug, PartialEq)]
enum Early {
    Lost(LossReason),
    StepDown(StepDownReason),
}

impl EarlyLosses {
    fn insert(
        &mut self,
        election: ElectionName,
        token: FencingToken,
        report: Early,
        ttl: Duration,
    ) {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, (_, _, at)| at.elapsed() < ttl);
            self.sweep_at = (self.map.len() * 2).max(1024);
        }
        // A loss outranks a step-down request of the same grant.
        if let Some((t, Early::Lost(_), _)) = self.map.get(&election) {
            if *t == token && matches!(report, Early::StepDown(_)) {
                return;
            }
        }
        self.map.insert(election, (token, report, Instant::now()));
    }

    /// The report for `election`, if any: it is used up by the grant registered now.
    fn take(&mut self, election: &ElectionName) -> Option<(FencingToken, Early)> {
        self.map.remove(election).map(|(t, r, _)| (t, r))
    }
}

/// The per-election locks of a session's campaigns. Locks nobody holds are dropped
/// once the map has doubled since the last sweep, so the map does not grow with every
/// election ever seen and a sweep's cost is paid for by the entries added since: with
/// thousands of campaigns in flight, taking a lock stays O(1) (a sweep on every call
/// above a fixed size made a batch of n seats cost O(n²)).
#[derive(Default)]
struct ElectionLocks {
    map: HashMap<ElectionName, Arc<tokio::sync::Mutex<()>>>,
    sweep_above: usize,
    sweeps: usize,
}

impl ElectionLocks {
    fn get(&mut self, election: &ElectionName) -> Arc<tokio::sync::Mutex<()>> {
        if self.map.len() > self.sweep_above.max(64) {
            self.map.retain(|_, l| Arc::strong_count(l) > 1);
            self.sweep_above = self.map.len() * 2;
            self.sweeps += 1;
        }
        self.map.entry(election.clone()).or_default().clone()
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

    /// [`try_campaign_many`](Self::try_campaign_many): the grants, registered.
    pub(crate) async fn try_many_inner(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<Arc<GrantState>>>> {
        let core = self.core();
        core.check_open()?;
        core.check_priority(seats.iter().map(|(_, c)| c))?;
        if seats.is_empty() {
            return Ok(Vec::new());
        }
        let mut locks = Vec::with_capacity(seats.len());
        let mut seen = std::collections::HashSet::with_capacity(seats.len());
        for (election, _) in seats {
            if !seen.insert(election) {
                return Err(Error::invalid(format!(
                    "election {election}: twice in one batch"
                )));
            }
            core.settle_held(election, Some(core.batch_timeout(1)))
                .await?;
            match core.election_lock(election).try_lock_owned() {
                Ok(guard) => locks.push(guard),
                Err(_) => {
                    return Err(Error::invalid(format!(
                        "election {election}: this session is already campaigning for it"
                    )))
                }
            }
        }
        let started = Instant::now();
        let bs = core.current();
        let gen = *core.generation.borrow();
        let mut pending = PendingCandidacy {
            core: core.clone(),
            elections: seats.iter().map(|(e, _)| e.clone()).collect(),
            session: Some(bs.clone()),
            locks,
        };
        let limit = core.batch_timeout(seats.len());
        let tokens = match with_timeout_of(limit, bs.try_campaign_many(seats)).await {
            Ok(tokens) => tokens,
            Err(e) => {
                if e.kind() == ErrorKind::SessionExpired {
                    // The store ended the session, and any candidacy of it: nothing to
                    // withdraw. Withdrawing through it held the elections' locks for
                    // a round trip to a store that had just come back, and the same
                    // seats asked for again through the re-opened session were refused
                    // as "already campaigning" (then retried at a back-off, 0.5-0.9 s
                    // later, when etcd's resuming raft leader revoked the leases).
                    pending.session = None;
                }
                return Err(core.tag(core.check_expired(e)));
            }
        };
        if tokens.len() != seats.len() {
            return Err(core.tag(Error::new(
                ErrorKind::Backend,
                format!(
                    "try_campaign_many: {} answers for {} seats",
                    tokens.len(),
                    seats.len()
                ),
            )));
        }
        pending.session = None;
        let won: Vec<(ElectionName, Option<FencingToken>)> = seats
            .iter()
            .zip(&tokens)
            .filter_map(|((e, _), t)| t.map(|t| (e.clone(), Some(t))))
            .collect();
        core.check_open_after_grant(&bs, &won).await?;
        let granted = seats.iter().zip(&tokens);
        if *core.generation.borrow() != gen || Instant::now() >= core.deadline() {
            // As for one seat: granted through a session whose renewal is overdue or that
            // was replaced, so not safe to hold. Give them back.
            let back: Vec<(ElectionName, Option<FencingToken>)> = granted
                .filter_map(|((e, _), t)| t.map(|t| (e.clone(), Some(t))))
                .collect();
            tracing::warn!(
                seats = back.len(),
                "grants arrived after the local deadline; releasing them"
            );
            let _ = with_timeout_of(limit, bs.resign_many(&back)).await;
            return Err(core.tag(Error::new(
                ErrorKind::Unavailable,
                "session renewal is overdue; grants released",
            )));
        }
        let leaderships = granted
            .map(|((election, candidate), token)| {
                token.map(|t| core.register(election, candidate, t))
            })
            .collect();
        crate::metrics::campaign_finished(core.scheme, started.elapsed());
        drop(pending);
        Ok(leaderships)
    }

    /// A campaign (`mode`): the grant, registered.
    pub(crate) async fn campaign_inner(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<Arc<GrantState>>> {
        let core = self.core();
        core.check_open()?;
        core.check_priority([candidate])?;
        let limit = (mode == CampaignMode::TryOnce).then(|| core.batch_timeout(1));
        core.settle_held(election, limit).await?;
        let lock = core.election_lock(election);
        let guard = match lock.try_lock_owned() {
            Ok(g) => g,
            Err(_) if mode == CampaignMode::Wait => {
                // A release of the same election is finishing, or another campaign of
                // this session is waiting; mode == CampaignMode::Wait for it.
                core.election_lock(election).lock_owned().await
            }
            Err(_) => {
                return Err(Error::invalid(format!(
                    "election {election}: this session is already campaigning for it"
                )))
            }
        };
        let started = Instant::now();
        let mut pending = PendingCandidacy {
            core: core.clone(),
            elections: vec![election.clone()],
            session: None,
            locks: vec![guard],
        };
        let mut generation = core.generation.subscribe();
        let mut attempt = 0u32;
        loop {
            core.check_open()?;
            let bs = core.current();
            let gen = *generation.borrow_and_update();
            pending.session = Some(bs.clone());
            let outcome = match mode {
                CampaignMode::Wait => tokio::select! {
                    r = bs.campaign(election, candidate) => r.map(Some),
                    _ = core.stop_all.cancelled() => Err(closed_error()),
                },
                CampaignMode::TryOnce => {
                    with_timeout(&core.timing, bs.try_campaign(election, candidate)).await
                }
            };
            match outcome {
                Ok(Some(token)) => {
                    pending.session = None;
                    core.check_open_after_grant(&bs, &[(election.clone(), Some(token))])
                        .await?;
                    if *core.generation.borrow() != gen || Instant::now() >= core.deadline() {
                        // Granted through a session whose renewal is overdue or that was
                        // replaced: not safe to hold. Give it back and try again.
                        tracing::warn!(election = %election, token = token.0, "grant arrived after the local deadline; releasing it");
                        let _ = with_timeout(&core.timing, bs.resign(election, Some(token))).await;
                        if mode == CampaignMode::TryOnce {
                            return Err(Error::new(
                                ErrorKind::Unavailable,
                                "session renewal is overdue; grant released",
                            )
                            .with_backend(core.scheme));
                        }
                        // Give the renewal a chance before asking again, or a store
                        // that grants at once would be asked in a tight loop.
                        let delay = core.timing.retry.delay(attempt);
                        attempt = attempt.saturating_add(1);
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = core.stop_all.cancelled() => return Err(closed_error()),
                        }
                        continue;
                    }
                    let leadership = core.register(election, candidate, token);
                    crate::metrics::campaign_finished(core.scheme, started.elapsed());
                    drop(pending);
                    return Ok(Some(leadership));
                }
                Ok(None) => {
                    pending.session = None;
                    return Ok(None);
                }
                Err(e) if e.kind() == ErrorKind::SessionExpired => {
                    pending.session = None;
                    // The store no longer has the session: re-open it now, not at the
                    // next renewal.
                    core.renew_soon.notify_one();
                    if mode == CampaignMode::TryOnce {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "session expired while campaigning; waiting for a new session");
                    tokio::select! {
                        r = generation.changed() => { if r.is_err() { return Err(closed_error()); } }
                        _ = core.stop_all.cancelled() => return Err(closed_error()),
                    }
                }
                Err(e) if e.is_retryable() && mode == CampaignMode::Wait => {
                    let delay = core.timing.retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::debug!(error = %e, ?delay, "campaign failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = core.stop_all.cancelled() => return Err(closed_error()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
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

/// Withdraws a candidacy whose campaign future was dropped, then frees the election lock.
struct PendingCandidacy {
    core: Arc<SessionCore>,
    elections: Vec<ElectionName>,
    session: Option<DynSession>,
    locks: Vec<OwnedMutexGuard<()>>,
}

impl Drop for PendingCandidacy {
    fn drop(&mut self) {
        let Some(bs) = self.session.take() else {
            return;
        };
        let locks = std::mem::take(&mut self.locks);
        if self.core.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let timing = self.core.timing.clone();
        let grants: Vec<(ElectionName, Option<FencingToken>)> =
            self.elections.drain(..).map(|e| (e, None)).collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = with_timeout(&timing, bs.resign_many(&grants)).await {
                    tracing::warn!(elections = grants.len(), error = %e, "could not withdraw a cancelled candidacy");
                }
                drop(locks);
            });
        }
    }
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

    /// Refuse candidates whose priority the backend would not keep (clause 14): a
    /// priority other than 0 on a backend that does not declare
    /// [`Capabilities::priority`](crate::backend::Capabilities::priority) is
    /// `Unsupported`, before anything reaches the store, never ignored.
    fn check_priority<'a>(
        &self,
        candidates: impl IntoIterator<Item = &'a Candidate>,
    ) -> Result<()> {
        let Some(c) = candidates.into_iter().find(|c| c.priority() != 0) else {
            return Ok(());
        };
        let Err(why) = self.backend.capabilities().priority_refusal() else {
            return Ok(());
        };
        let (id, priority, scheme) = (c.id(), c.priority(), self.scheme);
        let text = match why {
            Some(why) => format!(
                "candidate {id:?}: priority {priority} is not supported by the {scheme} backend \
                 (only 0 is): {why}"
            ),
            None => format!(
                "candidate {id:?}: priority {priority} is not supported by the {scheme} backend \
                 yet (only 0 is)"
            ),
        };
        Err(Error::new(ErrorKind::Unsupported, text).with_backend(self.scheme))
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

    /// Keep the grant of `election` with `token` and fire or ask what was reported of it
    /// before it was registered.
    fn register(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        token: FencingToken,
    ) -> Arc<GrantState> {
        let state = GrantState::new(
            self.scheme,
            election.clone(),
            candidate.clone(),
            token,
            Instant::now(),
            self.timing.step_down_grace,
            self.lost_tx.clone(),
        );
        if let Some(inherited) = self.current().inherited(election, token) {
            let _ = state.inherited.set(inherited);
        }
        let state = Arc::new(state);
        let early = {
            let mut held = self.lock_held();
            held.insert(election.clone(), state.clone());
            // A report for this election from before the grant is about this grant or
            // an older one (tokens only grow): either way it is used up now.
            crate::backend::lock(&self.early_losses).take(election)
        };
        tracing::info!(election = %election, token = token.0, candidate = candidate.id(), "elected");
        crate::metrics::elected(self.scheme, election);
        // A grant whose deadline passed between the check and now fires at once.
        is_valid(&state, self.deadline());
        match early.filter(|(t, _)| *t == token) {
            Some((_, Early::Lost(reason))) => {
                tracing::debug!(election = %election, token = token.0, "the grant was reported lost before it was registered");
                state.fire(reason, self.loss_instant());
            }
            Some((_, Early::StepDown(reason))) => {
                tracing::debug!(election = %election, token = token.0, "the holder was asked to step down before the grant was registered");
                state.ask_step_down(reason);
            }
            None => {}
        }
        state
    }

    /// The backend reports the grant `token` of `election` lost, or asks its holder to
    /// step down (a preemption or handover, clause 14). The report may come
    /// before the grant is registered: the backend answers the campaign and then learns
    /// of the loss, and this task reads the report before the campaign's caller
    /// registers the grant (the peer backend, whose quorum leadership can end a moment
    /// after it granted the seat, did this under load; the report was dropped, and the
    /// session went on renewing a grant that no longer existed). Such a report is kept
    /// until the election's next grant is registered, which it ends (or asks to step
    /// down) if the tokens match.
    fn grant_report(&self, election: ElectionName, token: FencingToken, report: Early) {
        let grant = {
            let held = self.lock_held();
            match held.get(&election) {
                Some(g) if g.token == token => Some(g.clone()),
                // An older grant's report: that grant is gone already.
                Some(g) if g.token > token => None,
                _ => {
                    crate::backend::lock(&self.early_losses).insert(
                        election,
                        token,
                        report.clone(),
                        self.timing.ttl,
                    );
                    None
                }
            }
        };
        match (grant, report) {
            (Some(g), Early::Lost(reason)) => {
                g.fire(reason, self.loss_instant());
            }
            (Some(g), Early::StepDown(reason)) => {
                g.ask_step_down(reason);
            }
            (None, _) => {}
        }
    }

    /// Release a grant in the store (after its lost signal fired), then forget it.
    async fn release(self: &Arc<Self>, state: &Arc<GrantState>, left: Option<&[u8]>) -> Result<()> {
        self.release_leaving(std::slice::from_ref(state), left)
            .await
    }

    /// Release grants in the store (after their lost signals fired) in the backend's
    /// batches, then forget them. Grants that ended with their session (the store
    /// expired or revoked it) are forgotten at once: the store ended their seats with
    /// the session, and a resign through the session it no longer has is a round trip
    /// for nothing, to a store that has just come back and may answer slowly. A
    /// campaign of the re-opened session for the same election waits for this (see
    /// `settle_held`): with etcd's resuming raft leader revoking the leases, releasing
    /// 128 such seats through the revoked lease took 3.7 s, and every shard's
    /// re-campaign waited for it.
    pub(crate) async fn release_many(self: &Arc<Self>, states: &[Arc<GrantState>]) -> Result<()> {
        self.release_leaving(states, None).await
    }

    /// [`release_many`](Self::release_many), a single release leaving `left` to its
    /// successor (clause 16).
    ///
    /// A release the store did not answer in time (an error worth another try) is
    /// reported to the caller and goes on in the background ([`release_later`](Self::release_later)).
    /// Its grants stay held, as lost, until it is done, so a campaign of this session
    /// for one of their elections waits for it (`settle_held`). Forgetting them at once
    /// left their records in the store under a session that lives on: the session's
    /// next campaign was handed the resigned grant back, with its old token (a chaos
    /// run on Azure: a resign during a store restart failed, and the candidate's next
    /// campaign 8 s later held token 5 again), and a waiter was kept out for as long as
    /// the session lived.
    async fn release_leaving(
        self: &Arc<Self>,
        states: &[Arc<GrantState>],
        left: Option<&[u8]>,
    ) -> Result<()> {
        let (ended, live): (Vec<Arc<GrantState>>, Vec<Arc<GrantState>>) =
            states.iter().cloned().partition(|s| ended_with_session(s));
        for state in &ended {
            self.forget(state);
        }
        let grants: Vec<(ElectionName, Option<FencingToken>)> = live
            .iter()
            .map(|s| (s.election.clone(), Some(s.token)))
            .collect();
        let result = self.release_in_store(&grants, left).await;
        match &result {
            Err(e) if e.is_retryable() && !live.is_empty() => {
                let core = self.clone();
                let left = left.map(<[u8]>::to_vec);
                tokio::spawn(async move { core.release_later(live, grants, left).await });
            }
            _ => {
                for state in &live {
                    self.forget(state);
                }
            }
        }
        result
    }

    /// Go on with a release that failed in time, with the retry policy's delays, until
    /// the store answers, the session ends (the store frees the seats with it) or it is
    /// closed; then forget the grants.
    async fn release_later(
        self: Arc<Self>,
        states: Vec<Arc<GrantState>>,
        grants: Vec<(ElectionName, Option<FencingToken>)>,
        left: Option<Vec<u8>>,
    ) {
        let mut attempt = 0;
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry.delay(attempt)) => {}
                () = self.stop_all.cancelled() => break,
            }
            attempt = attempt.saturating_add(1);
            match self.release_in_store(&grants, left.as_deref()).await {
                Ok(()) => {
                    tracing::info!(
                        seats = grants.len(),
                        attempt,
                        "released in the store after all"
                    );
                    break;
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(seats = grants.len(), error = %e, "release still not answered");
                }
                Err(e) => {
                    tracing::warn!(seats = grants.len(), error = %e, "could not release; the seats are freed when the session ends");
                    break;
                }
            }
        }
        for state in &states {
            self.forget(state);
        }
    }

    /// Drop a released grant from the held map (unless the seat was granted again
    /// since) and say it is released.
    fn forget(&self, state: &GrantState) {
        {
            let mut held = self.lock_held();
            if held
                .get(&state.election)
                .is_some_and(|s| s.token == state.token)
            {
                held.remove(&state.election);
            }
        }
        state.released.set();
    }

    /// Resign `grants` in the store, retrying what may pass on a second try for up to
    /// twice the connect timeout in all.
    /// `left`: the state a single release leaves its successor (clause 16).
    async fn release_in_store(
        &self,
        grants: &[(ElectionName, Option<FencingToken>)],
        left: Option<&[u8]>,
    ) -> Result<()> {
        if grants.is_empty()
            || self.abandoned.load(Ordering::SeqCst)
            || self.stop_all.is_cancelled()
        {
            return Ok(());
        }
        let bs = self.current();
        let mut attempt = 0;
        // One round trip may take connect_timeout; retries stop after twice that in all.
        let give_up = Instant::now() + self.batch_timeout(grants.len()) * 2;
        loop {
            let time_left = give_up.saturating_duration_since(Instant::now());
            let release = async {
                match (grants, left) {
                    ([(election, Some(token))], Some(state)) => {
                        bs.resign_with(election, *token, state).await
                    }
                    _ => bs.resign_many(grants).await,
                }
            };
            let attempt_result = match tokio::time::timeout(time_left, release).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    "could not release the seat in time; the release goes on until the store \
                     answers or the session ends",
                )
                .with_backend(self.scheme)),
            };
            match attempt_result {
                Ok(()) => return Ok(()),
                // Gone with the session, or the session was closed: nothing to release.
                Err(e) if matches!(e.kind(), ErrorKind::SessionExpired | ErrorKind::Closed) => {
                    return Ok(())
                }
                Err(e)
                    if e.is_retryable()
                        && Instant::now() < give_up
                        && !self.stop_all.is_cancelled() =>
                {
                    tokio::time::sleep(self.timing.retry.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases in the store the seats whose lost signal fired for any reason other
    /// than an explicit resign (which releases its seat itself): one task per session,
    /// taking every loss that is waiting in one batch (a deadline or an expiry ends
    /// every grant at once).
    async fn release_task(self: Arc<Self>, mut lost: mpsc::UnboundedReceiver<Loss>) {
        loop {
            let first = tokio::select! {
                m = lost.recv() => match m {
                    Some(m) => m,
                    None => return,
                },
                _ = self.stop_all.cancelled() => {
                    // Nothing is released once stopped, but listeners hear of every loss.
                    let mut rest = Vec::new();
                    while let Ok(m) = lost.try_recv() {
                        rest.push(m);
                    }
                    self.tell_listeners(&rest);
                    self.lock_listeners().clear();
                    return;
                }
            };
            let mut losses = vec![first];
            while let Ok(m) = lost.try_recv() {
                losses.push(m);
            }
            let states: Vec<Arc<GrantState>> = {
                let held = self.lock_held();
                losses
                    .iter()
                    .filter_map(|l| held.get(&l.election).filter(|g| g.token == l.token))
                    .filter(|g| !g.release_claimed.swap(true, Ordering::SeqCst))
                    .cloned()
                    .collect()
            };
            self.tell_listeners(&losses);
            if let Err(e) = self.release_many(&states).await {
                tracing::warn!(seats = states.len(), error = %e, "could not release lost seats");
            }
        }
    }

    fn lock_listeners(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::UnboundedSender<Loss>>> {
        crate::backend::lock(&self.listeners)
    }

    /// How long a batch of `seats` may take: the connect timeout for each round trip the
    /// backend needs for it ([`Capabilities::batch`](crate::backend::Capabilities::batch)
    /// seats per round trip; one where it asks seat by seat).
    fn batch_timeout(&self, seats: usize) -> Duration {
        let per_trip = self.backend.capabilities().batch.unwrap_or(1).max(1);
        let trips = u32::try_from(seats.div_ceil(per_trip).max(1)).unwrap_or(u32::MAX);
        self.timing.connect_timeout.saturating_mul(trips)
    }

    fn tell_listeners(&self, losses: &[Loss]) {
        self.lock_listeners()
            .retain(|l| losses.iter().all(|loss| l.send(loss.clone()).is_ok()));
    }

    /// When a loss noticed now took effect: now, or the deadline if that passed first
    /// (a process that was paused learns of its loss late, but its grant was never
    /// valid past the deadline).
    pub(crate) fn loss_instant(&self) -> Instant {
        Instant::now().min(self.deadline())
    }

    fn fire_all(&self, reason: LossReason, at: Instant) {
        // Entries leave `held` once released in the store.
        let grants: Vec<_> = self.lock_held().values().cloned().collect();
        for g in grants {
            g.fire(reason.clone(), at);
        }
    }

    fn stop_tasks(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.stop_renewal.cancel();
        self.stop_all.cancel();
    }

    async fn close(&self) -> Result<()> {
        let first = !self.closed.swap(true, Ordering::SeqCst);
        let abandoned = self.abandoned.load(Ordering::SeqCst);
        self.fire_all(LossReason::SessionClosed, self.loss_instant());
        self.stop_tasks();
        if first && !abandoned {
            let bs = self.current();
            tracing::debug!(parent: &self.span, "closing session");
            return with_timeout(&self.timing, bs.close()).await;
        }
        Ok(())
    }

    async fn renewal_task(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<SessionEvent>) {
        let timing = self.timing.clone();
        let mut next = Instant::now() + timing.renew_interval;
        let mut attempt = 0u32;
        // How long one renewal may go unanswered before it is sent again: half the room
        // a failover has (`renew_deadline − renew_interval`), not the interval, so a
        // store that answers slowly (a loaded ZooKeeper ensemble's write, an etcd
        // member forwarding to a new raft leader) still renews with frequent renewals.
        let request_limit = timing.connect_timeout.min(
            timing
                .renew_interval
                .max(timing.renew_deadline.saturating_sub(timing.renew_interval) / 2),
        );
        let mut events_open = true;
        loop {
            let mut expired = false;
            // Whether the last attempt went unanswered for the whole request limit.
            let mut unanswered = false;
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = self.renew_soon.notified() => {}
                ev = recv_event(&mut events, &mut events_open) => match ev {
                    Some(SessionEvent::ElectionLost { election, token, reason }) => {
                        self.grant_report(election, token, Early::Lost(LossReason::Revoked(reason)));
                        continue;
                    }
                    Some(SessionEvent::Preempted { election, token }) => {
                        self.grant_report(election, token, Early::StepDown(StepDownReason::Preempted));
                        continue;
                    }
                    Some(SessionEvent::Expired { reason }) => {
                        tracing::warn!(%reason, "store reports the session expired");
                        expired = true;
                    }
                    None => {
                        // The backend dropped its sender; renewals alone tell us now.
                        events_open = false;
                        continue;
                    }
                },
                _ = self.stop_renewal.cancelled() => return,
            }
            if !expired {
                let bs = self.current();
                let sent = Instant::now();
                match tokio::time::timeout(request_limit, bs.keep_alive()).await {
                    Ok(Ok(())) => {
                        let took = sent.elapsed();
                        self.extend_deadline(sent + timing.renew_deadline);
                        crate::metrics::renewed(
                            self.scheme,
                            took,
                            self.deadline().saturating_duration_since(Instant::now()),
                        );
                        attempt = 0;
                        next = sent + timing.renew_interval;
                        continue;
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::SessionExpired => {
                        tracing::warn!(error = %e, "session expired");
                        expired = true;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "renewal failed");
                    }
                    Err(_) => {
                        tracing::warn!(limit = ?request_limit, "renewal timed out");
                        unanswered = true;
                    }
                }
            }
            if expired {
                self.fire_all(LossReason::SessionExpired, self.loss_instant());
                match self.reopen(&mut events).await {
                    Some(()) => {
                        if !self.lock_registrations().is_empty() {
                            tokio::spawn(self.clone().reregister().instrument(self.span.clone()));
                        }
                        events_open = true;
                        attempt = 0;
                        next = Instant::now() + timing.renew_interval;
                    }
                    None => return,
                }
            } else if unanswered {
                // The attempt already waited its limit: send the next one at once, so
                // that one is always in flight while the store does not answer and the
                // first renewal after it answers again goes out then, not a back-off
                // later (the deadline counts from the send time of the one answered).
                next = Instant::now();
            } else {
                // A refusal comes back at once: back off, but by at most a quarter of
                // the interval, so a renewal still goes out within that of the store
                // answering again.
                let delay = timing.retry.delay(attempt).min(timing.renew_interval / 4);
                attempt = attempt.saturating_add(1);
                next = Instant::now() + delay;
            }
        }
    }

    /// Open a fresh backend session after expiry, retrying until it works or the
    /// session is closed. Replaces `events` with the new session's channel.
    async fn reopen(&self, events: &mut mpsc::UnboundedReceiver<SessionEvent>) -> Option<()> {
        let mut attempt = 0u32;
        loop {
            if self.stop_renewal.is_cancelled() {
                return None;
            }
            let (tx, rx) = SessionEvents::channel();
            let sent = Instant::now();
            match open_backend_session(&self.backend, &self.timing, tx).await {
                Ok(bs) => {
                    tracing::info!(new_session = %bs.id(), "session re-opened after expiry");
                    let old = self.current();
                    self.deadline_ns.store(
                        duration_ns(
                            (sent + self.timing.renew_deadline)
                                .saturating_duration_since(self.base),
                        ),
                        Ordering::SeqCst,
                    );
                    // The new session and the generation change together: whoever sees
                    // the new session (a campaign that got through on it) reads the new
                    // generation too.
                    self.generation.send_modify(|g| {
                        self.set_current(bs);
                        *g += 1;
                    });
                    *events = rx;
                    self.deadline_moved.notify_one();
                    // Make sure the store forgets the old session even if it is only
                    // half gone.
                    let timing = self.timing.clone();
                    tokio::spawn(async move {
                        let _ = with_timeout(&timing, old.close()).await;
                    });
                    return Some(());
                }
                Err(e) => {
                    let delay = self.timing.retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(error = %e, ?delay, "could not re-open the session");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.stop_renewal.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// Fires every grant's lost signal when the deadline passes without a renewal.
    async fn deadline_task(self: Arc<Self>) {
        loop {
            let deadline = self.deadline();
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.deadline_moved.notified() => continue,
                _ = self.stop_all.cancelled() => return,
            }
            if Instant::now() >= self.deadline() {
                let n = self.lock_held().values().filter(|g| !g.is_lost()).count();
                if n > 0 {
                    tracing::warn!(grants = n, "renew deadline passed; leadership lost");
                }
                self.fire_all(LossReason::DeadlineExceeded, deadline);
                tokio::select! {
                    _ = self.deadline_moved.notified() => {}
                    _ = self.stop_all.cancelled() => return,
                }
            }
        }
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
