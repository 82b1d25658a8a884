//! The lease-id rule that keeps a late release from freeing a later grant: once a
//! release was sent with a lease id, no acquire of that blob proposes it again. Read
//! from the Azure backend's TRACE events of every acquire and release (their own test
//! binary, so the subscriber can be the process's global one and sees every event).

use std::sync::Arc;
use std::time::Duration;

use tenure_azure::AzureConfig;
use tenure_core::testing::random_prefix;
use tenure_core::{Candidate, ElectionName, Session, Timing};
use tenure_integration::AzuriteServer;

#[path = "support/capture.rs"]
mod capture;
use capture::Captured;

const TTL: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(100);

/// Over grants, resigns, a `Held` try and a campaign withdrawn by a timeout, no acquire
/// proposes a lease id a release was sent with (on that blob).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_id_is_never_proposed_again_after_a_release() {
    let captured = Captured::install_global();
    let azurite = AzuriteServer::start().await.expect("azurite");
    let config = AzureConfig::development(azurite.endpoint(), random_prefix().to_ascii_lowercase())
        .poll_interval(POLL);
    let backend = Arc::new(config.connect().await.expect("connect"));
    let a = Session::open(backend.clone(), Timing::from_ttl(TTL))
        .await
        .expect("session a");
    let b = Session::open(backend, Timing::from_ttl(TTL))
        .await
        .expect("session b");
    let ca = Candidate::new("a").unwrap();
    let cb = Candidate::new("b").unwrap();

    // Grant, resign, grant again, resign.
    let e1 = ElectionName::new("ids/one").unwrap();
    for _ in 0..2 {
        let l = a.campaign(&e1, &ca).await.expect("campaign e1");
        l.resign().await.expect("resign e1");
    }
    // Held by b: a's try fails without a release, then succeeds once b resigns.
    let e2 = ElectionName::new("ids/two").unwrap();
    let lb = b.campaign(&e2, &cb).await.expect("b campaigns e2");
    assert!(a.try_campaign(&e2, &ca).await.expect("try").is_none());
    lb.resign().await.expect("b resigns e2");
    let l = a
        .try_campaign(&e2, &ca)
        .await
        .expect("try")
        .expect("granted after b resigned");
    l.resign().await.expect("resign e2");
    // A campaign withdrawn while b holds the seat, then a grant after b resigns.
    let e3 = ElectionName::new("ids/three").unwrap();
    let lb = b.campaign(&e3, &cb).await.expect("b campaigns e3");
    let withdrawn = tokio::time::timeout(Duration::from_millis(400), a.campaign(&e3, &ca)).await;
    assert!(withdrawn.is_err(), "a must still be waiting");
    tokio::time::sleep(Duration::from_millis(300)).await;
    lb.resign().await.expect("b resigns e3");
    let l = a.campaign(&e3, &ca).await.expect("campaign e3");
    l.resign().await.expect("resign e3");
    a.close().await.expect("close a");
    b.close().await.expect("close b");

    let text = captured.text();
    let field = |line: &str, key: &str| -> Option<String> {
        let at = line.find(&format!(" {key}="))? + key.len() + 2;
        Some(line[at..].split_whitespace().next()?.to_string())
    };
    let mut released: Vec<(String, String)> = Vec::new();
    let (mut acquires, mut releases) = (0, 0);
    let mut ids = std::collections::HashSet::new();
    for line in text.lines() {
        let is_acquire = line.contains("acquire lease");
        if !is_acquire && !line.contains("release lease") {
            continue;
        }
        let (Some(blob), Some(lease)) = (field(line, "blob"), field(line, "lease")) else {
            panic!("an acquire/release event without blob and lease: {line}");
        };
        ids.insert(lease.clone());
        if is_acquire {
            acquires += 1;
            assert!(
                !released.contains(&(blob.clone(), lease.clone())),
                "lease id {lease} proposed again for {blob} after a release with it:\n{text}"
            );
        } else {
            releases += 1;
            released.push((blob, lease));
        }
    }
    assert!(
        acquires >= 8 && releases >= 6,
        "too few events: {acquires} acquires, {releases} releases:\n{text}"
    );
    // Two grants of e1 and the grant of e3 after the withdrawn campaign each need a
    // new id; b's leases have their own.
    assert!(ids.len() >= 5, "only {} lease ids: {ids:?}", ids.len());
}
