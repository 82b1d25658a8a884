//! A session of the engine's backend: its campaigns, releases and handovers through the
//! driver, and the seats its follower keeps.

use super::*;

/// A session of a [`DrivenBackend`].
#[derive(Debug)]
pub(super) struct DrivenSession {
    pub(super) id: String,
    pub(super) backend: DrivenBackend,
    pub(super) events: SessionEvents,
    pub(super) gate: watch::Sender<bool>,
    /// The seats held and followed, by election.
    pub(super) held: Arc<Mutex<HashMap<ElectionName, Held>>>,
    /// Wakes the session's follower for an election (pushed by the store, or by a
    /// seat's waiting task where the store does not push).
    pub(super) wake: Wake,
    /// What each grant held inherited, by election: the grant's token and the state.
    pub(super) inherited: Mutex<HashMap<ElectionName, (u64, Inherited)>>,
    /// Set once the follower told the core that the store ended the session.
    pub(super) ended: Arc<AtomicBool>,
    /// This session's writes on their way to the store, which a withdrawal waits for.
    pub(super) inflight: Inflight,
    pub(super) closed: CancellationToken,
}

impl DrivenSession {
    /// Wait while the session is cut off (fault injection).
    pub(super) async fn pass(&self) -> Result<()> {
        let mut rx = self.gate.subscribe();
        tokio::select! {
            r = rx.wait_for(|open| *open) => r.map(|_| ()).map_err(|_| Error::closed()),
            () = self.closed.cancelled() => Err(Error::closed()),
        }
    }

    pub(super) fn follower(&self) -> Follower {
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
    pub(super) fn unfollow(&self, election: &ElectionName) -> Option<Snapshot> {
        lock(&self.held).remove(election).map(|mut h| {
            h.stop();
            h.snap
        })
    }

    /// The primitives, counted, with this session's writes run to their answers.
    pub(super) fn store(&self) -> Counted {
        Counted(self.backend.clone(), self.inflight.clone())
    }

    pub(super) fn candidacy(&self, candidate: &Candidate) -> Candidacy {
        Candidacy {
            session: self.id.clone(),
            candidate: candidate.id().to_string(),
            value: candidate.value().to_string(),
            priority: candidate.priority(),
            preemptible: candidate.preemptible(),
        }
    }

    /// Follow the seat granted with `token`. Keeps what the grant inherited.
    pub(super) fn follow(&self, election: &ElectionName, token: u64, snap: Snapshot) {
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
            let start = self.backend.start(election, &self.id);
            let (token, snap) = primitive::campaign_from(&store, election, &me, start).await?;
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
