//! [`CountingBackend`]: a backend wrapper that counts every request a backend and its
//! sessions make, and gauges the seats of batches of tries in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{BackendSession, Capabilities, SessionEvents};
use tenure_core::{
    Backend, Candidate, DynBackend, ElectionName, FencingToken, LeaderInfo, LeaderStream, Member,
    MemberStream, Result, Timing,
};

/// Counts every request a backend and its sessions make (each is at least one round
/// trip to the store; streams count once when opened).
#[derive(Debug)]
pub struct CountingBackend {
    inner: DynBackend,
    count: Arc<AtomicU64>,
    batches: Arc<BatchGauge>,
}

/// Seats in `try_campaign_many` calls in flight, over all sessions of a
/// [`CountingBackend`], and the most seen at once; each call can be slowed down so
/// that calls meet.
#[derive(Debug, Default)]
pub struct BatchGauge {
    in_flight: AtomicU64,
    peak: AtomicU64,
    delay: std::sync::Mutex<Duration>,
}

impl BatchGauge {
    /// The most seats that were in flight at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Hold every later batch call this long before it goes to the store.
    pub fn slow_down(&self, delay: Duration) {
        *self.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }
}

impl CountingBackend {
    /// Wrap `inner`, adding to `count`.
    pub fn new(inner: DynBackend, count: Arc<AtomicU64>) -> Self {
        CountingBackend {
            inner,
            count,
            batches: Arc::default(),
        }
    }

    /// The gauge of the batch calls in flight.
    pub fn batches(&self) -> Arc<BatchGauge> {
        self.batches.clone()
    }

    fn tick(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn scheme(&self) -> &'static str {
        self.inner.scheme()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn check_timing(&self, timing: &Timing) -> Result<()> {
        self.inner.check_timing(timing)
    }
    async fn open_session(
        &self,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Arc<dyn BackendSession>> {
        self.tick();
        let inner = self.inner.open_session(ttl, events).await?;
        Ok(Arc::new(CountingSession {
            inner,
            count: self.count.clone(),
            batches: self.batches.clone(),
            batch: self.inner.capabilities().batch.unwrap_or(1).max(1),
        }))
    }
    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.tick();
        self.inner.leader(election).await
    }
    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.tick();
        self.inner.observe(election).await
    }
    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.tick();
        self.inner.members(namespace).await
    }
    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.tick();
        self.inner.watch_members(namespace).await
    }
}

#[derive(Debug)]
struct CountingSession {
    inner: Arc<dyn BackendSession>,
    count: Arc<AtomicU64>,
    batches: Arc<BatchGauge>,
    /// Seats per round trip of the batch calls (1 where the store asks seat by seat).
    batch: usize,
}

impl CountingSession {
    fn tick(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch of `seats` costs one request per `batch` of them.
    fn tick_batch(&self, seats: usize) {
        let requests = seats.div_ceil(self.batch) as u64;
        self.count.fetch_add(requests, Ordering::Relaxed);
    }
}

#[async_trait]
impl BackendSession for CountingSession {
    fn id(&self) -> &str {
        self.inner.id()
    }
    async fn keep_alive(&self) -> Result<()> {
        self.tick();
        self.inner.keep_alive().await
    }
    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        self.tick();
        self.inner.campaign(election, candidate).await
    }
    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        self.tick();
        self.inner.try_campaign(election, candidate).await
    }
    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.tick();
        self.inner.resign(election, token).await
    }
    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        self.tick_batch(seats.len());
        let g = &self.batches;
        let n = seats.len() as u64;
        let now = g.in_flight.fetch_add(n, Ordering::Relaxed) + n;
        g.peak.fetch_max(now, Ordering::Relaxed);
        let delay = *g.delay.lock().unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let answers = self.inner.try_campaign_many(seats).await;
        g.in_flight.fetch_sub(n, Ordering::Relaxed);
        answers
    }
    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        self.tick_batch(grants.len());
        self.inner.resign_many(grants).await
    }
    async fn close(&self) -> Result<()> {
        self.tick();
        self.inner.close().await
    }
    fn abandon(&self) {
        self.inner.abandon();
    }
    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.tick();
        self.inner.register_member(namespace, member).await
    }
    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.tick();
        self.inner.unregister_member(namespace, id).await
    }
}
