//! A [`Backend`] made of a store's [`Primitives`] and the [election engine](crate::engine):
//! everything an election decides comes from the engine, everything it stores goes
//! through the primitives. A store that supplies the primitives gets the whole contract
//! from this one file (membership from the store's own [`MemberStore`], if it keeps
//! member lists).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::follow::{Follower, Held};
use super::inflight::Inflight;
use super::primitive::{self, MemberStore, Primitives, Release, Wake};
use super::{
    lock, membership_unsupported, Backend, BackendSession, Capabilities, Clause, DynSession,
    LeaderStream, MemberStream, Published, SessionEvents,
};
use crate::engine::{self, Candidacy, Inherited, Snapshot, WaitFor};
use crate::error::{Error, ErrorKind, Result};
use crate::name::{Candidate, ElectionName, FencingToken, LeaderInfo, Member};
use crate::timing::Timing;

/// A backend that runs the engine over `Primitives`.
#[derive(Clone, Debug)]
pub struct DrivenBackend {
    store: Arc<dyn Primitives>,
    scheme: &'static str,
    requests: Arc<AtomicU64>,
    /// Each session's gate, for fault injection: closed, its requests wait.
    gates: Arc<Mutex<HashMap<String, watch::Sender<bool>>>>,
    /// The endpoint errors name, if the store has one to name.
    endpoint: Option<Arc<str>>,
}

impl DrivenBackend {
    /// The engine over `store`, answering to `scheme` in errors and metrics.
    pub fn new(store: Arc<dyn Primitives>, scheme: &'static str) -> Self {
        DrivenBackend {
            store,
            scheme,
            requests: Arc::new(AtomicU64::new(0)),
            gates: Arc::default(),
            endpoint: None,
        }
    }

    /// Name `endpoint` in the errors this backend returns.
    pub fn with_endpoint(mut self, endpoint: impl AsRef<str>) -> Self {
        self.endpoint = Some(Arc::from(endpoint.as_ref()));
        self
    }

    /// `e` naming this backend (and its endpoint), unless it names one already.
    fn tag(&self, e: Error) -> Error {
        let e = match e.backend() {
            None => e.with_backend(self.scheme),
            Some(_) => e,
        };
        match (&self.endpoint, e.endpoint()) {
            (Some(at), None) => e.with_endpoint(at.as_ref()),
            _ => e,
        }
    }

    /// Stop (`false`) or let through (`true`) the requests of session `id`, as a
    /// partition would; false if there is no such session.
    pub fn set_gate(&self, id: &str, open: bool) -> bool {
        lock(&self.gates)
            .get(id)
            .map(|g| g.send_replace(open))
            .is_some()
    }

    /// End session `id` in the store now, as an operator revoking it would.
    pub async fn revoke(&self, id: &str) -> Result<()> {
        self.store.revoke(id).await
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        self.count();
        self.store.read(election).await
    }

    fn member_store(&self) -> Result<&dyn MemberStore> {
        self.store
            .members()
            .ok_or_else(|| membership_unsupported(self.scheme))
    }
}

fn leader_of(snap: &Snapshot) -> Option<LeaderInfo> {
    engine::holder(snap).and_then(|r| {
        Some(LeaderInfo {
            id: r.candidacy.candidate.clone(),
            value: r.candidacy.value.clone(),
            token: FencingToken(r.token?),
        })
    })
}

#[async_trait]
impl Backend for DrivenBackend {
    fn scheme(&self) -> &'static str {
        self.scheme
    }

    fn capabilities(&self) -> Capabilities {
        let mut offered = Capabilities::full().prioritized().inheriting();
        if let Some(n) = self.store.batch() {
            offered = offered.batched(n);
        }
        let offered = match self.store.members() {
            Some(_) => offered,
            None => offered.except(Clause::Membership, "the store keeps no member lists"),
        };
        self.store.capabilities(offered)
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        self.store.check_timing(timing)
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let id = self.store.open(ttl).await?;
        let (gate, _) = watch::channel(true);
        lock(&self.gates).insert(id.clone(), gate.clone());
        let (wake, woken) = Wake::channel();
        let session = DrivenSession {
            id,
            backend: self.clone(),
            events,
            gate,
            held: Arc::default(),
            wake,
            inherited: Mutex::default(),
            ended: Arc::default(),
            inflight: Inflight::default(),
            closed: CancellationToken::new(),
        };
        tokio::spawn(session.follower().run(woken, session.gate.subscribe()));
        Ok(Arc::new(session))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        let snap = self.read(election).await.map_err(|e| self.tag(e))?;
        Ok(leader_of(&snap))
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        let snap = self.read(election).await?;
        let (mut published, stream) = Published::new(leader_of(&snap));
        let (me, election) = (self.clone(), election.clone());
        tokio::spawn(async move {
            let mut snap = snap;
            loop {
                let holder = engine::holder(&snap).map(|r| r.session().to_string());
                me.count();
                let what = WaitFor {
                    me: None,
                    on: holder,
                    seen: snap.revision,
                };
                let wait = me.store.changed(&election, &what);
                tokio::select! {
                    () = published.closed() => return,
                    r = wait => if let Err(e) = r {
                        published.publish(Err(e));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    },
                }
                match me.read(&election).await {
                    Ok(s) => {
                        published.publish(Ok(leader_of(&s)));
                        snap = s;
                    }
                    Err(e) => published.publish(Err(e)),
                }
            }
        });
        Ok(stream)
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        let r = async {
            let asked =
                primitive::handover(&Counted(self.clone(), Inflight::default()), election, to)
                    .await?;
            leader_of(&asked).ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    "handover: the asked holder has no token",
                )
            })
        };
        r.await.map_err(|e| self.tag(e))
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.requests.load(Ordering::Relaxed))
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.member_store()?.list(namespace).await
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.member_store()?.watch(namespace).await
    }
}

/// A session of a [`DrivenBackend`].
#[derive(Debug)]
struct DrivenSession {
    id: String,
    backend: DrivenBackend,
    events: SessionEvents,
    gate: watch::Sender<bool>,
    /// The seats held and followed, by election.
    held: Arc<Mutex<HashMap<ElectionName, Held>>>,
    /// Wakes the session's follower for an election (pushed by the store, or by a
    /// seat's waiting task where the store does not push).
    wake: Wake,
    /// What each grant held inherited, by election: the grant's token and the state.
    inherited: Mutex<HashMap<ElectionName, (u64, Inherited)>>,
    /// Set once the follower told the core that the store ended the session.
    ended: Arc<AtomicBool>,
    /// This session's writes on their way to the store, which a withdrawal waits for.
    inflight: Inflight,
    closed: CancellationToken,
}

impl DrivenSession {
    /// Wait while the session is cut off (fault injection).
    async fn pass(&self) -> Result<()> {
        let mut rx = self.gate.subscribe();
        tokio::select! {
            r = rx.wait_for(|open| *open) => r.map(|_| ()).map_err(|_| Error::closed()),
            () = self.closed.cancelled() => Err(Error::closed()),
        }
    }

    fn follower(&self) -> Follower {
        Follower {
            id: self.id.clone(),
            store: self.backend.store.clone(),
            requests: self.backend.requests.clone(),
            events: self.events.clone(),
            held: self.held.clone(),
            wake: self.wake.clone(),
            ended: self.ended.clone(),
            closed: self.closed.clone(),
        }
    }

    /// Stop following `election`; the election as the follower last read it.
    fn unfollow(&self, election: &ElectionName) -> Option<Snapshot> {
        lock(&self.held).remove(election).map(|mut h| {
            h.stop();
            h.snap
        })
    }

    /// The primitives, counted, with this session's writes run to their answers.
    fn store(&self) -> Counted {
        Counted(self.backend.clone(), self.inflight.clone())
    }

    fn candidacy(&self, candidate: &Candidate) -> Candidacy {
        Candidacy {
            session: self.id.clone(),
            candidate: candidate.id().to_string(),
            value: candidate.value().to_string(),
            priority: candidate.priority(),
            preemptible: candidate.preemptible(),
        }
    }

    /// Follow the seat granted with `token`. Keeps what the grant inherited.
    fn follow(&self, election: &ElectionName, token: u64, snap: Snapshot) {
        let inherited = snap.record(&self.id).and_then(|r| r.inherited.clone());
        let mut kept = lock(&self.inherited);
        match inherited {
            Some(i) => kept.insert(election.clone(), (token, i)),
            None => kept.remove(election),
        };
        drop(kept);
        self.follower().start(election, token, snap);
    }
}

#[async_trait]
impl BackendSession for DrivenSession {
    fn id(&self) -> &str {
        &self.id
    }

    async fn keep_alive(&self) -> Result<()> {
        let r = async {
            self.pass().await?;
            match self
                .backend
                .store
                .renew(std::slice::from_ref(&self.id))
                .await?[..]
            {
                [true] => Ok(()),
                _ => Err(Error::new(
                    ErrorKind::SessionExpired,
                    "the session has expired",
                )),
            }
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let r = async {
            self.pass().await?;
            let me = self.candidacy(candidate);
            let store = self.store();
            let (token, snap) = primitive::campaign(&store, election, &me).await?;
            self.follow(election, token, snap);
            Ok(FencingToken(token))
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let r = async {
            self.pass().await?;
            let me = self.candidacy(candidate);
            let store = self.store();
            let taken = primitive::try_take(&store, election, &me).await?;
            Ok(taken.map(|(token, snap)| {
                self.follow(election, token, snap);
                FencingToken(token)
            }))
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let r = async {
            let last = self.unfollow(election);
            self.pass().await?;
            self.inflight.settled(std::slice::from_ref(election)).await;
            let release = Release {
                session: &self.id,
                token: token.map(|t| t.0),
                state: None,
            };
            primitive::resign(&self.store(), election, release, last).await
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let r = async {
            self.pass().await?;
            let asks: Vec<(ElectionName, Candidacy)> = seats
                .iter()
                .map(|(e, c)| (e.clone(), self.candidacy(c)))
                .collect();
            let store = self.store();
            let taken = primitive::try_take_many(&store, &asks).await?;
            Ok(taken
                .into_iter()
                .zip(seats)
                .map(|(t, (election, _))| {
                    t.map(|(token, snap)| {
                        self.follow(election, token, snap);
                        FencingToken(token)
                    })
                })
                .collect())
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let r = async {
            let last = grants.iter().map(|(e, _)| self.unfollow(e)).collect();
            self.pass().await?;
            let elections: Vec<ElectionName> = grants.iter().map(|(e, _)| e.clone()).collect();
            self.inflight.settled(&elections).await;
            let releases: Vec<(ElectionName, Release<'_>)> = grants
                .iter()
                .map(|(e, t)| {
                    let release = Release {
                        session: &self.id,
                        token: t.map(|t| t.0),
                        state: None,
                    };
                    (e.clone(), release)
                })
                .collect();
            primitive::resign_many(&self.store(), &releases, last).await
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn resign_with(
        &self,
        election: &ElectionName,
        token: FencingToken,
        state: &[u8],
    ) -> Result<()> {
        let r = async {
            engine::check_state("resign_with", state)?;
            let last = self.unfollow(election);
            self.pass().await?;
            self.inflight.settled(std::slice::from_ref(election)).await;
            let release = Release {
                session: &self.id,
                token: Some(token.0),
                state: Some(state),
            };
            primitive::resign(&self.store(), election, release, last).await
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    fn inherited(
        &self,
        election: &ElectionName,
        token: FencingToken,
    ) -> Option<(FencingToken, Vec<u8>)> {
        lock(&self.inherited)
            .get(election)
            .filter(|(held, _)| *held == token.0)
            .map(|(_, i)| (FencingToken(i.token), i.state.clone()))
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let r = async {
            self.pass().await?;
            let store = self.backend.member_store()?;
            store.register(&self.id, namespace, member).await
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        let r = async {
            self.pass().await?;
            let store = self.backend.member_store()?;
            store.unregister(&self.id, namespace, id).await
        };
        r.await.map_err(|e| self.backend.tag(e))
    }

    /// The process gives the session up (a crash): its follow loops stop with it, as
    /// they would with the process; the store ends the session after its TTL.
    fn abandon(&self) {
        self.closed.cancel();
    }

    async fn close(&self) -> Result<()> {
        self.closed.cancel();
        lock(&self.backend.gates).remove(&self.id);
        self.backend.store.revoke(&self.id).await
    }
}

impl Drop for DrivenSession {
    fn drop(&mut self) {
        self.closed.cancel();
        lock(&self.backend.gates).remove(&self.id);
    }
}

/// The backend's primitives with every election request counted (clause 7's check), and
/// every write run to its answer in a task of its own, counted in flight by election
/// ([`Inflight`]): a campaign dropped while its write is on its way does not leave the
/// write to land after the withdrawal.
#[derive(Debug)]
struct Counted(DrivenBackend, Inflight);

/// Run `write` in a task of its own: it reaches its answer even if the caller stops
/// waiting for it.
async fn to_answer<T: Send + 'static>(
    write: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(write).await {
        Ok(answer) => answer,
        Err(e) => Err(Error::new(
            ErrorKind::Backend,
            format!("a write's task ended without an answer: {e}"),
        )),
    }
}

#[async_trait]
impl Primitives for Counted {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.0.store.open(ttl).await
    }
    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.0.store.renew(sessions).await
    }
    async fn revoke(&self, session: &str) -> Result<()> {
        self.0.store.revoke(session).await
    }
    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        self.0.read(election).await
    }
    async fn commit(
        &self,
        election: &ElectionName,
        write: &engine::Write,
    ) -> Result<(bool, Snapshot)> {
        self.0.count();
        let entered = self.1.enter([election.clone()]);
        let (store, election, write) = (self.0.store.clone(), election.clone(), write.clone());
        to_answer(async move {
            let answer = store.commit(&election, &write).await;
            drop(entered);
            answer
        })
        .await
    }
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        self.0.count();
        self.0.store.changed(election, what).await
    }
    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        self.0.count();
        self.0.store.read_many(elections).await
    }
    async fn commit_many(
        &self,
        writes: &[(ElectionName, engine::Write)],
    ) -> Result<Vec<(bool, Snapshot)>> {
        self.0.count();
        let entered = self.1.enter(writes.iter().map(|(e, _)| e.clone()));
        let (store, writes) = (self.0.store.clone(), writes.to_vec());
        to_answer(async move {
            let answers = store.commit_many(&writes).await;
            drop(entered);
            answers
        })
        .await
    }
    fn batch(&self) -> Option<usize> {
        self.0.store.batch()
    }
    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        self.0.store.notify(election, what, to)
    }
}

/// `impl Backend for $ty` by handing every call to the [`DrivenBackend`] at the field
/// path `$field` (`driven`, `inner.driven`): a store's backend type that is the engine over its primitives (plus its
/// own constructors and hooks) writes nothing else.
#[macro_export]
macro_rules! driven_backend {
    ($ty:ty, $($field:ident).+) => {
        #[$crate::async_trait]
        impl $crate::backend::Backend for $ty {
            fn scheme(&self) -> &'static str {
                $crate::backend::Backend::scheme(&self.$($field).+)
            }
            fn capabilities(&self) -> $crate::backend::Capabilities {
                $crate::backend::Backend::capabilities(&self.$($field).+)
            }
            fn check_timing(&self, timing: &$crate::Timing) -> $crate::Result<()> {
                $crate::backend::Backend::check_timing(&self.$($field).+, timing)
            }
            async fn open_session(
                &self,
                ttl: ::std::time::Duration,
                events: $crate::backend::SessionEvents,
            ) -> $crate::Result<$crate::backend::DynSession> {
                $crate::backend::Backend::open_session(&self.$($field).+, ttl, events).await
            }
            async fn leader(
                &self,
                election: &$crate::ElectionName,
            ) -> $crate::Result<Option<$crate::LeaderInfo>> {
                $crate::backend::Backend::leader(&self.$($field).+, election).await
            }
            async fn observe(
                &self,
                election: &$crate::ElectionName,
            ) -> $crate::Result<$crate::backend::LeaderStream> {
                $crate::backend::Backend::observe(&self.$($field).+, election).await
            }
            async fn handover(
                &self,
                election: &$crate::ElectionName,
                to: Option<&str>,
            ) -> $crate::Result<$crate::LeaderInfo> {
                $crate::backend::Backend::handover(&self.$($field).+, election, to).await
            }
            fn election_requests(&self) -> Option<u64> {
                $crate::backend::Backend::election_requests(&self.$($field).+)
            }
            async fn members(
                &self,
                namespace: &$crate::ElectionName,
            ) -> $crate::Result<Vec<$crate::Member>> {
                $crate::backend::Backend::members(&self.$($field).+, namespace).await
            }
            async fn watch_members(
                &self,
                namespace: &$crate::ElectionName,
            ) -> $crate::Result<$crate::backend::MemberStream> {
                $crate::backend::Backend::watch_members(&self.$($field).+, namespace).await
            }
        }
    };
}
