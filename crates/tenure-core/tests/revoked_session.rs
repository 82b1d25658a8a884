//! A session the store revoked while the process was fine (etcd's lessor revoking a
//! lease; here the in-memory store's `revoke_session`, which deletes the seats and
//! members and tells the holder of each seat, but not of the session): it is re-opened
//! at once when something tells the session so (`Session::renew_now`, or a request
//! that finds the session gone), not at its next renewal. Paused time.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{Candidate, ElectionName, LossReason, Member, MemoryBackend, Session, Timing};

fn timing() -> Timing {
    // Renewals far apart, so that "at once" cannot be a renewal that came due.
    let mut t = Timing::from_ttl(Duration::from_secs(10));
    t.renew_interval = Duration::from_secs(4);
    t.renew_deadline = Duration::from_secs(8);
    t
}

async fn open(mem: &MemoryBackend) -> Session {
    Session::open(Arc::new(mem.clone()), timing())
        .await
        .expect("session")
}

#[tokio::test(start_paused = true)]
async fn renew_now_reopens_a_revoked_session_and_registers_again() {
    let mem = MemoryBackend::new();
    let s = open(&mem).await;
    let ns = ElectionName::new("revoked-ns").expect("namespace");
    s.register(&ns, &Member::new("me", "v").expect("member"))
        .await
        .expect("register");
    let e = ElectionName::new("revoked-seat").expect("name");
    let l = s
        .campaign(&e, &Candidate::new("me").expect("candidate"))
        .await
        .expect("campaign");
    let old = s.id();
    assert!(mem.revoke_session(&old));
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The seat's deletion is reported at once; the session does not know yet.
    assert!(matches!(l.loss_reason(), Some(LossReason::Revoked(_))));
    assert_eq!(s.generation(), 0);
    assert!(s.members(&ns).await.expect("members").is_empty());
    s.renew_now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(s.generation(), 1, "not re-opened at once");
    assert_ne!(s.id(), old);
    let members = s.members(&ns).await.expect("members");
    assert_eq!(members.len(), 1, "not registered again: {members:?}");
    s.close().await.expect("close");
}

#[tokio::test(start_paused = true)]
async fn a_campaign_that_finds_the_session_gone_has_it_reopened_at_once() {
    let mem = MemoryBackend::new();
    let s = open(&mem).await;
    let e = ElectionName::new("revoked-seat").expect("name");
    let me = Candidate::new("me").expect("candidate");
    let l = s.campaign(&e, &me).await.expect("campaign");
    assert!(mem.revoke_session(&s.id()));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!l.is_leader());
    let t0 = tokio::time::Instant::now();
    let again = s.campaign(&e, &me).await.expect("campaign again");
    assert!(
        t0.elapsed() < timing().renew_interval / 2,
        "granted again {:?} after the campaign began",
        t0.elapsed()
    );
    assert!(again.token() > l.token());
    assert_eq!(s.generation(), 1);
    s.close().await.expect("close");
}
