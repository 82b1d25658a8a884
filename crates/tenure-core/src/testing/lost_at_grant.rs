//! A backend for tests of the race where a store reports a grant lost before the
//! campaign's answer reaches the caller (the peer backend's quorum can end a moment
//! after it granted a seat; a store can take a seat away as it answers).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Backend, BackendSession, Capabilities, DynSession, SessionEvents};
use crate::{
    Candidate, DynBackend, ElectionName, FencingToken, LeaderInfo, LeaderStream, Member,
    MemberStream, Result,
};

/// Which grants to report lost: asked once per grant, with its election.
pub type LoseIf = Arc<dyn Fn(&ElectionName) -> bool + Send + Sync>;

/// The reason the reports carry (`LossReason::Revoked` of it).
pub const LOST_AT_GRANT: &str = "taken over right after the grant";

/// `inner`, except that every grant for which `lose` answers true is reported lost
/// (`SessionEvents::election_lost`) as the campaign answers, and the session is given
/// time to read the report before the answer goes back: the loss then reaches the
/// core before the grant does. The seat itself stays in `inner` until the core
/// releases it.
#[derive(Clone)]
pub struct LostAtGrant {
    inner: DynBackend,
    lose: LoseIf,
    capabilities: Option<Capabilities>,
    delay: Duration,
}

impl fmt::Debug for LostAtGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostAtGrant")
            .field("inner", &self.inner)
            .finish()
    }
}

impl LostAtGrant {
    /// Wrap `inner`; `lose` picks the grants to report lost.
    pub fn new(inner: DynBackend, lose: LoseIf) -> Self {
        LostAtGrant {
            inner,
            lose,
            capabilities: None,
            delay: Duration::from_millis(10),
        }
    }

    /// How long the answer waits after the report (10 ms unless set).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Declare `capabilities` instead of those of `inner`.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = Some(capabilities);
        self
    }
}

#[derive(Debug)]
struct LostAtGrantSession {
    inner: DynSession,
    events: SessionEvents,
    lose: LoseIfDebug,
    delay: Duration,
}

struct LoseIfDebug(LoseIf);

impl fmt::Debug for LoseIfDebug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LoseIf")
    }
}

impl LostAtGrantSession {
    async fn answer(&self, election: &ElectionName, token: FencingToken) {
        if (self.lose.0)(election) {
            self.events.election_lost(election, token, LOST_AT_GRANT);
            tokio::time::sleep(self.delay).await;
        }
    }
}

#[async_trait]
impl Backend for LostAtGrant {
    fn scheme(&self) -> &'static str {
        self.inner.scheme()
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(|| self.inner.capabilities())
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let inner = self.inner.open_session(ttl, events.clone()).await?;
        Ok(Arc::new(LostAtGrantSession {
            inner,
            events,
            lose: LoseIfDebug(self.lose.clone()),
            delay: self.delay,
        }))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.inner.leader(election).await
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.inner.observe(election).await
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.inner.members(namespace).await
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.inner.watch_members(namespace).await
    }
}

#[async_trait]
impl BackendSession for LostAtGrantSession {
    fn id(&self) -> &str {
        self.inner.id()
    }

    async fn keep_alive(&self) -> Result<()> {
        self.inner.keep_alive().await
    }

    async fn campaign(&self, e: &ElectionName, c: &Candidate) -> Result<FencingToken> {
        let token = self.inner.campaign(e, c).await?;
        self.answer(e, token).await;
        Ok(token)
    }

    async fn try_campaign(&self, e: &ElectionName, c: &Candidate) -> Result<Option<FencingToken>> {
        let token = self.inner.try_campaign(e, c).await?;
        if let Some(t) = token {
            self.answer(e, t).await;
        }
        Ok(token)
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let tokens = self.inner.try_campaign_many(seats).await?;
        for ((e, _), t) in seats.iter().zip(&tokens) {
            if let Some(t) = t {
                self.answer(e, *t).await;
            }
        }
        Ok(tokens)
    }

    async fn resign(&self, e: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.inner.resign(e, token).await
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        self.inner.resign_many(grants).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.inner.register_member(namespace, member).await
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.inner.unregister_member(namespace, id).await
    }
}
