//! A backend may report a grant lost before the core has registered the grant: the
//! peer backend hands a seat to a waiter and, a moment later, loses the quorum
//! leadership behind it, while the campaign's answer is still on its way to the
//! caller. The loss must not be dropped for arriving first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::{Backend, Capabilities};
use tenure_core::testing::{LostAtGrant, LOST_AT_GRANT as REASON};
use tenure_core::{Candidate, ElectionName, LossReason, MemoryBackend, Session, Timing};

/// The in-memory store, except that while the flag is set a campaign reports its grant
/// lost and lets the core's other tasks run before it returns the grant.
fn lost_at_once(inner: &MemoryBackend, lose: &Arc<AtomicBool>) -> LostAtGrant {
    let lose = lose.clone();
    LostAtGrant::new(
        Arc::new(inner.clone()),
        Arc::new(move |_: &ElectionName| lose.load(Ordering::SeqCst)),
    )
}

async fn session() -> (Session, MemoryBackend, Arc<AtomicBool>) {
    let inner = MemoryBackend::new();
    let lose = Arc::new(AtomicBool::new(true));
    let backend = Arc::new(lost_at_once(&inner, &lose));
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

/// A backend that does not declare priorities (this one declares the default
/// capabilities, though the store under it could) gets a priority refused by the core
/// with `Unsupported` on every way to campaign, never passed on and ignored: the check
/// the conformance suite runs on such backends.
#[tokio::test]
async fn a_backend_without_priorities_refuses_a_priority() {
    let never = Arc::new(AtomicBool::new(false));
    let backend = Arc::new(
        lost_at_once(&MemoryBackend::new(), &never).with_capabilities(Capabilities::full()),
    );
    let env = tenure_core::testing::Env::new(backend, tenure_core::testing::memory_timing());
    tenure_core::testing::check_priority(&env).await;
}
