//! A backend may report a grant lost before the core has registered the grant: the
//! peer backend hands a seat to a waiter and, a moment later, loses the quorum
//! leadership behind it, while the campaign's answer is still on its way to the
//! caller. The loss must not be dropped for arriving first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{Backend, BackendSession, DynSession, SessionEvents};
use tenure_core::{
    Candidate, ElectionName, FencingToken, LeaderInfo, LeaderStream, LossReason, MemoryBackend,
    Result, Session, Timing,
};

/// The in-memory store, except that while `lose` is set a campaign reports its grant
/// lost and lets the core's other tasks run before it returns the grant.
#[derive(Debug)]
struct LostAtOnce {
    inner: MemoryBackend,
    lose: Arc<AtomicBool>,
}

#[derive(Debug)]
struct LostAtOnceSession {
    inner: DynSession,
    events: SessionEvents,
    lose: Arc<AtomicBool>,
}

const REASON: &str = "taken over right after the grant";

#[async_trait]
impl Backend for LostAtOnce {
    fn scheme(&self) -> &'static str {
        "lost-at-once"
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let inner = self.inner.open_session(ttl, events.clone()).await?;
        Ok(Arc::new(LostAtOnceSession {
            inner,
            events,
            lose: self.lose.clone(),
        }))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.inner.leader(election).await
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.inner.observe(election).await
    }
}

impl LostAtOnceSession {
    /// Reports `token` lost, then gives the core's renewal task time to read the report
    /// before the grant reaches the caller.
    async fn lose(&self, election: &ElectionName, token: FencingToken) {
        if self.lose.load(Ordering::SeqCst) {
            self.events.election_lost(election, token, REASON);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[async_trait]
impl BackendSession for LostAtOnceSession {
    fn id(&self) -> &str {
        self.inner.id()
    }

    async fn keep_alive(&self) -> Result<()> {
        self.inner.keep_alive().await
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let token = self.inner.campaign(election, candidate).await?;
        self.lose(election, token).await;
        Ok(token)
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let token = self.inner.try_campaign(election, candidate).await?;
        if let Some(t) = token {
            self.lose(election, t).await;
        }
        Ok(token)
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.inner.resign(election, token).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

async fn session() -> (Session, MemoryBackend, Arc<AtomicBool>) {
    let inner = MemoryBackend::new();
    let lose = Arc::new(AtomicBool::new(true));
    let backend = Arc::new(LostAtOnce {
        inner: inner.clone(),
        lose: lose.clone(),
    });
    let session = Session::open(backend, Timing::from_ttl(Duration::from_secs(10)))
        .await
        .unwrap();
    (session, inner, lose)
}

/// The grant is lost at once, and its seat is released in the store.
async fn assert_lost_and_released(
    leadership: &tenure_core::Leadership,
    store: &MemoryBackend,
    election: &ElectionName,
) {
    // Renewals keep succeeding (the session is fine): only the reported loss can end
    // the grant within a second.
    let reason = tokio::time::timeout(Duration::from_secs(1), leadership.lost_wait())
        .await
        .expect("a loss reported before the grant was registered was dropped");
    assert_eq!(reason, LossReason::Revoked(REASON.to_owned()));
    assert!(!leadership.is_leader());
    tokio::time::timeout(Duration::from_secs(1), async {
        while store.leader(election).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the lost seat is released in the store");
}

#[tokio::test(start_paused = true)]
async fn a_loss_reported_before_the_campaign_returns_ends_the_grant() {
    let (session, store, lose) = session().await;
    let election = ElectionName::new("raced").unwrap();
    let candidate = Candidate::new("a").unwrap();
    let leadership = session.campaign(&election, &candidate).await.unwrap();
    assert_lost_and_released(&leadership, &store, &election).await;
    // The next grant of the same election is not ended by the report of the last one.
    lose.store(false, Ordering::SeqCst);
    let again = session.campaign(&election, &candidate).await.unwrap();
    assert!(again.token() > leadership.token());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(again.is_leader(), "lost: {:?}", again.loss_reason());
}

#[tokio::test(start_paused = true)]
async fn a_loss_reported_before_try_campaign_returns_ends_the_grant() {
    let (session, store, _) = session().await;
    let election = ElectionName::new("raced-try").unwrap();
    let leadership = session
        .try_campaign(&election, &Candidate::new("a").unwrap())
        .await
        .unwrap()
        .expect("the seat is free");
    assert_lost_and_released(&leadership, &store, &election).await;
}

/// A backend that does not declare priorities (this one keeps the default
/// capabilities, though the store under it could) gets a priority refused by the core
/// with `Unsupported` on every way to campaign, never passed on and ignored: the check
/// the conformance suite runs on such backends.
#[tokio::test]
async fn a_backend_without_priorities_refuses_a_priority() {
    let backend = Arc::new(LostAtOnce {
        inner: MemoryBackend::new(),
        lose: Arc::new(AtomicBool::new(false)),
    });
    let env = tenure_core::testing::Env::new(backend, tenure_core::testing::memory_timing());
    tenure_core::testing::check_priority(&env).await;
}
