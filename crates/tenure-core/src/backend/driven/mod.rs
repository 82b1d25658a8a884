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

mod counted;
mod session;

use super::{
    lock, membership_unsupported, Backend, BackendSession, Capabilities, Clause, DynSession,
    LeaderStream, MemberStream, Published, SessionEvents,
};
use crate::backend::follow::{Follower, Held};
use crate::backend::inflight::Inflight;
use crate::backend::primitive::{self, MemberStore, Primitives, Release, Wake};
use crate::engine::{self, Candidacy, Inherited, Snapshot, WaitFor};
use crate::error::{Error, ErrorKind, Result};
use crate::name::{Candidate, ElectionName, FencingToken, LeaderInfo, Member};
use crate::timing::Timing;
use counted::Counted;
use session::DrivenSession;

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
    /// Each election as this backend last learnt it from one write's answer or one
    /// read, for a campaign's first write (the batched tries, which never start from
    /// it, do not pay for remembering).
    seen: Arc<Mutex<HashMap<ElectionName, Snapshot>>>,
}

/// How many elections [`DrivenBackend`] remembers as last seen; past it, it forgets them
/// all and starts again (a forgotten election costs a campaign one failed write).
const SEEN: usize = 1024;

impl DrivenBackend {
    /// The engine over `store`, answering to `scheme` in errors and metrics.
    pub fn new(store: Arc<dyn Primitives>, scheme: &'static str) -> Self {
        DrivenBackend {
            store,
            scheme,
            requests: Arc::new(AtomicU64::new(0)),
            gates: Arc::default(),
            endpoint: None,
            seen: Arc::default(),
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
        let snap = self.store.read(election).await?;
        self.saw(election, &snap);
        Ok(snap)
    }

    /// Remember `snap` as the last seen of `election`. An election holding a state left
    /// for the next grant (up to 64 KiB) is forgotten instead: the cache stays small,
    /// and such a campaign costs the failed write.
    fn saw(&self, election: &ElectionName, snap: &Snapshot) {
        let mut seen = lock(&self.seen);
        if snap.left.is_some() {
            seen.remove(election);
            return;
        }
        if seen.len() >= SEEN && !seen.contains_key(election) {
            seen.clear();
        }
        seen.insert(election.clone(), snap.clone());
    }

    /// Where a campaign of `session` in `election` decides its first write: the election
    /// as last seen, unless it holds a record of `session` (which may have gone since,
    /// and must be read, not assumed), else empty. Either way the write is conditional
    /// on the revision it was decided at, so a stale view costs one failed write, whose
    /// answer brings the election back.
    fn start(&self, election: &ElectionName, session: &str) -> Snapshot {
        lock(&self.seen)
            .get(election)
            .filter(|s| s.record(session).is_none())
            .cloned()
            .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemPrimitives;

    /// A release the store committed but whose answer never reached the backend leaves
    /// the backend's view of the election with the released seat in it. A campaign of
    /// the same session must not take that view for a grant: it decides from the store,
    /// and queues behind the holder granted since. (Checked to fail, granting token 1
    /// again, when the view is used although it holds the session's record.)
    #[tokio::test(start_paused = true)]
    async fn a_view_holding_the_campaigners_own_record_is_not_trusted() -> Result<()> {
        let store = MemPrimitives::new();
        let backend = DrivenBackend::new(Arc::new(store.clone()), "mem");
        let ttl = Duration::from_secs(60);
        let a = backend
            .open_session(ttl, SessionEvents::channel().0)
            .await?;
        let e = ElectionName::new("view")?;
        let cand = Candidate::new("a")?;
        let first = a.campaign(&e, &cand).await?;

        // Behind the backend's back: a's release commits, and b is granted.
        let snap = store.read(&e).await?;
        let release = engine::resign(&snap, a.id(), None, None);
        let Some(release) = release else {
            return Err(Error::invalid("a holds no seat to release"));
        };
        assert!(store.commit(&e, &release).await?.0);
        let b = Candidacy {
            session: store.open(ttl).await?,
            candidate: "b".into(),
            value: String::new(),
            priority: 0,
            preemptible: true,
        };
        let (b_token, _) = primitive::campaign(&store, &e, &b).await?;
        assert!(b_token > first.0);

        let again = tokio::time::timeout(Duration::from_secs(5), a.campaign(&e, &cand)).await;
        assert!(again.is_err(), "granted while b holds the seat: {again:?}");
        Ok(())
    }
}
