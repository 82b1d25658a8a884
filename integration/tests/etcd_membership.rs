//! Membership on a real etcd, beyond the shared suite's clause 13 (one server per test,
//! or the one named by `TENURE_TEST_ETCD`): a crashed member goes when etcd expires its
//! lease, the latest registration of an id wins and only its lease removes it, a
//! session etcd no longer has cannot register, and large values are listed and watched
//! (answers above the client's default 4 MiB).

use std::time::Duration;

use tenure_core::Backend;
use tenure_etcd::EtcdBackend;
use tenure_integration::membership::{
    crashed_member_goes, ended_session_loses_its_members, etcd_backend, member, name, open, until,
    until_where,
};
use tenure_integration::EtcdServer;

/// A server of the test's own and a backend on it, keys under the run's prefix.
async fn backend() -> (EtcdServer, EtcdBackend) {
    etcd_backend("connect_timeout_ms=1000&request_timeout_ms=1000").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_member_goes_when_etcd_expires_its_lease() {
    let (_server, b) = backend().await;
    let ttl = Duration::from_secs(2);
    let ns = name("crash/ns");
    let alive = open(&b, Duration::from_secs(30)).await;
    // etcd 3.4 looks for expired leases every 500 ms.
    let within = ttl + Duration::from_millis(1500);
    let (mut w, gone) = crashed_member_goes(&b, &ns, &*alive, ttl, within, async {}).await;
    assert!(gone >= ttl - Duration::from_millis(100), "{gone:?}");
    assert!(gone <= ttl + Duration::from_millis(800), "{gone:?}");
    alive.close().await.expect("close");
    until(&mut w, &[], Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_its_members_at_once_and_cannot_register() {
    let (_server, b) = backend().await;
    let ns = name("revoked/ns");
    let s = open(&b, Duration::from_secs(30)).await;
    ended_session_loses_its_members(&b, &ns, &*s, b.revoke_session(s.id())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_listed_and_watched() {
    let (_server, b) = backend().await;
    let ns = name("large/ns");
    let s = open(&b, Duration::from_secs(60)).await;
    let mut w = b.watch_members(&ns).await.expect("watch");
    until(&mut w, &[], Duration::from_secs(1)).await;
    // 70 values of 100 KiB: 7 MB, above the client's default answer size of 4 MiB and
    // more than one page.
    let n = 70;
    let value = |i: usize| format!("{i:03}{}", "v".repeat(100 * 1024 - 3));
    for i in 0..n {
        s.register_member(&ns, &member(&format!("m-{i:03}"), &value(i)))
            .await
            .expect("register");
    }
    let listed = b.members(&ns).await.expect("members");
    assert_eq!(listed.len(), n);
    for (i, m) in listed.iter().enumerate() {
        assert_eq!(m.id(), format!("m-{i:03}"));
        assert_eq!(m.value(), value(i));
    }
    until_where(&mut w, "70 large members", Duration::from_secs(10), |m| {
        m.len() == n && m.iter().enumerate().all(|(i, m)| m.value() == value(i))
    })
    .await;
    // A watcher that starts now gets them all in its first list.
    let mut late = b.watch_members(&ns).await.expect("watch");
    until_where(&mut late, "first list", Duration::from_secs(1), |m| {
        m.len() == n
    })
    .await;
    s.close().await.expect("close");
    until(&mut w, &[], Duration::from_secs(2)).await;
}
