//! A campaign dropped while its write is on its way to the store leaves nothing behind:
//! the write runs to its answer, and the withdrawal comes after it. (Found on Azure's
//! shard test: a cancelled campaign's grant landed after its withdrawal had read the
//! election, and the shard's preferred node waited behind a grant nobody knew it held.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::Primitives;
use tenure_core::backend::{DrivenBackend, MemPrimitives};
use tenure_core::engine::{Snapshot, WaitFor, Write};
use tenure_core::{Candidate, DynBackend, ElectionName, Result, Session, Timing};

/// The in-memory primitives with every write taking `delay` to reach the store.
#[derive(Debug)]
struct Slow {
    mem: Arc<MemPrimitives>,
    delay: Duration,
}

#[async_trait]
impl Primitives for Slow {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.mem.open(ttl).await
    }
    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.mem.renew(sessions).await
    }
    async fn revoke(&self, session: &str) -> Result<()> {
        self.mem.revoke(session).await
    }
    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        self.mem.read(election).await
    }
    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        // The store applies the write whether or not anyone waits for its answer.
        let (mem, election, write) = (self.mem.clone(), election.clone(), write.clone());
        let delay = self.delay;
        let landed = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            mem.commit(&election, &write).await
        });
        landed.await.expect("the store's task")
    }
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        self.mem.changed(election, what).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_campaign_dropped_mid_write_leaves_no_record() {
    let mem = Arc::new(MemPrimitives::new());
    let slow = Slow {
        mem: mem.clone(),
        delay: Duration::from_millis(300),
    };
    let backend: DynBackend = Arc::new(DrivenBackend::new(Arc::new(slow), "slow"));
    let timing = Timing::from_ttl(Duration::from_secs(10));
    let (a, b) = (
        Session::open(backend.clone(), timing.clone())
            .await
            .expect("open"),
        Session::open(backend.clone(), timing).await.expect("open"),
    );
    let election = ElectionName::new("seat").expect("name");
    let cand = |id: &str| Candidate::new(id).expect("candidate");

    // The caller gives up 100 ms into a write that takes 300 ms.
    let ca = cand("a");
    let given_up = tokio::time::timeout(Duration::from_millis(100), a.campaign(&election, &ca));
    assert!(given_up.await.is_err(), "the campaign was not cut short");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snap = mem.read(&election).await.expect("read");
    assert!(
        snap.record(&a.id()).is_none(),
        "a cancelled campaign left its record: {snap:?}"
    );

    // The seat is free for the next candidate at once, with the first session alive.
    let cb = cand("b");
    let granted = tokio::time::timeout(Duration::from_secs(2), b.campaign(&election, &cb))
        .await
        .expect("b was kept waiting")
        .expect("campaign");
    assert!(!a.is_closed());
    granted.resign().await.expect("resign");
}
