//! Membership on a real etcd, beyond the shared suite's clause 13 (one server per test,
//! or the one named by `TENURE_TEST_ETCD`): a crashed member goes when etcd expires its
//! lease, the latest registration of an id wins and only its lease removes it, a
//! session etcd no longer has cannot register, large values are listed and watched
//! (answers above the client's default 4 MiB), and a watcher converges after its link
//! was cut.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tenure_core::backend::{BackendSession, SessionEvents};
use tenure_core::{Backend, ElectionName, ErrorKind, Member, MemberStream};
use tenure_etcd::EtcdBackend;
use tenure_integration::{EtcdServer, TcpProxy};

fn prefix() -> &'static str {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PREFIX.get_or_init(tenure_core::testing::random_prefix)
}

async fn backend(addr: std::net::SocketAddr) -> EtcdBackend {
    let url = format!(
        "etcd://{addr}?prefix={}&connect_timeout_ms=1000&request_timeout_ms=1000",
        prefix()
    );
    match EtcdBackend::from_url(&url).await {
        Ok(b) => b,
        Err(e) => panic!("connect to {addr}: {e}"),
    }
}

fn name(s: &str) -> ElectionName {
    ElectionName::new(s).expect("name")
}

fn member(id: &str, value: &str) -> Member {
    Member::new(id, value).expect("member")
}

async fn open(b: &EtcdBackend, ttl: Duration) -> Arc<dyn BackendSession> {
    let (events, _) = SessionEvents::channel();
    b.open_session(ttl, events).await.expect("open session")
}

fn pairs(members: &[Member]) -> Vec<(String, String)> {
    members
        .iter()
        .map(|m| (m.id().to_string(), m.value().to_string()))
        .collect()
}

fn want(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect()
}

/// Read the stream until `ok` accepts what it shows; fails after `within`.
async fn until_list(
    w: &mut MemberStream,
    ok: impl Fn(&[Member]) -> bool,
    within: Duration,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = None;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Ok(members))) => {
                if ok(&members) {
                    return;
                }
                seen = Some(format!("{} members: {:?}", members.len(), members.first()));
            }
            Ok(Some(Err(e))) => seen = Some(e.to_string()),
            Ok(None) => panic!("{what}: the member stream ended"),
            Err(_) => panic!("{what}: not within {within:?}; last seen {seen:?}"),
        }
    }
}

async fn until(w: &mut MemberStream, list: &[(&str, &str)], within: Duration) {
    let wanted = want(list);
    let what = format!("{wanted:?}");
    until_list(w, |m| pairs(m) == wanted, within, &what).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_member_goes_when_etcd_expires_its_lease() {
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(server.addr()).await;
    let ttl = Duration::from_secs(2);
    let ns = name("crash/ns");
    let alive = open(&b, Duration::from_secs(30)).await;
    alive
        .register_member(&ns, &member("alive", "1"))
        .await
        .expect("register alive");
    let crashed = open(&b, ttl).await;
    crashed
        .register_member(&ns, &member("crashed", "1"))
        .await
        .expect("register crashed");
    let mut w = b.watch_members(&ns).await.expect("watch");
    until(
        &mut w,
        &[("alive", "1"), ("crashed", "1")],
        Duration::from_secs(1),
    )
    .await;
    crashed.keep_alive().await.expect("keep-alive");
    let t0 = Instant::now();
    drop(crashed);
    // etcd 3.4 looks for expired leases every 500 ms.
    until(&mut w, &[("alive", "1")], ttl + Duration::from_millis(1500)).await;
    let gone = t0.elapsed();
    eprintln!("crashed member gone {gone:?} after its last keep-alive (TTL {ttl:?})");
    assert!(gone >= ttl - Duration::from_millis(100), "{gone:?}");
    assert!(gone <= ttl + Duration::from_millis(800), "{gone:?}");
    alive.close().await.expect("close");
    until(&mut w, &[], Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_registration_wins_and_only_its_lease_removes_it() {
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(server.addr()).await;
    let ttl = Duration::from_secs(10);
    let ns = name("latest/ns");
    let (sa, sb) = (open(&b, ttl).await, open(&b, ttl).await);
    let mut w = b.watch_members(&ns).await.expect("watch");
    until(&mut w, &[], Duration::from_secs(1)).await;
    sa.register_member(&ns, &member("x", "from a"))
        .await
        .expect("a");
    until(&mut w, &[("x", "from a")], Duration::from_secs(1)).await;
    sb.register_member(&ns, &member("x", "from b"))
        .await
        .expect("b");
    until(&mut w, &[("x", "from b")], Duration::from_secs(1)).await;
    sa.unregister_member(&ns, "x").await.expect("unregister a");
    sa.close().await.expect("close a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        pairs(&b.members(&ns).await.expect("members")),
        want(&[("x", "from b")])
    );
    sb.register_member(&ns, &member("y", "1")).await.expect("y");
    until(
        &mut w,
        &[("x", "from b"), ("y", "1")],
        Duration::from_secs(1),
    )
    .await;
    sb.unregister_member(&ns, "x").await.expect("unregister b");
    sb.unregister_member(&ns, "x")
        .await
        .expect("unregister is idempotent");
    until(&mut w, &[("y", "1")], Duration::from_secs(1)).await;
    let bad = sb.unregister_member(&ns, "a/b").await.expect_err("bad id");
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument);
    sb.close().await.expect("close b");
    until(&mut w, &[], Duration::from_secs(1)).await;
    let closed = sb
        .register_member(&ns, &member("z", ""))
        .await
        .expect_err("closed session");
    assert_eq!(closed.kind(), ErrorKind::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_its_members_at_once_and_cannot_register() {
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(server.addr()).await;
    let ns = name("revoked/ns");
    let s = open(&b, Duration::from_secs(30)).await;
    s.register_member(&ns, &member("m", "1"))
        .await
        .expect("register");
    let mut w = b.watch_members(&ns).await.expect("watch");
    until(&mut w, &[("m", "1")], Duration::from_secs(1)).await;
    b.revoke_session(s.id()).await.expect("revoke");
    until(&mut w, &[], Duration::from_secs(1)).await;
    let e = s
        .register_member(&ns, &member("m", "2"))
        .await
        .expect_err("lease gone");
    assert_eq!(e.kind(), ErrorKind::SessionExpired, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_listed_and_watched() {
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(server.addr()).await;
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
    until_list(
        &mut w,
        |m| m.len() == n && m.iter().enumerate().all(|(i, m)| m.value() == value(i)),
        Duration::from_secs(10),
        "70 large members",
    )
    .await;
    // A watcher that starts now gets them all in its first list.
    let mut late = b.watch_members(&ns).await.expect("watch");
    until_list(
        &mut late,
        |m| m.len() == n,
        Duration::from_secs(1),
        "first list",
    )
    .await;
    s.close().await.expect("close");
    until(&mut w, &[], Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_converges_after_its_link_was_cut() {
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(server.addr()).await;
    let proxy = TcpProxy::start(server.addr()).await.expect("proxy");
    let watcher = backend(proxy.addr()).await;
    let ns = name("cut/ns");
    let s = open(&b, Duration::from_secs(30)).await;
    s.register_member(&ns, &member("a", "1"))
        .await
        .expect("register");
    let mut w = watcher.watch_members(&ns).await.expect("watch");
    until(&mut w, &[("a", "1")], Duration::from_secs(1)).await;
    proxy.cut().await.expect("cut");
    s.register_member(&ns, &member("a", "2"))
        .await
        .expect("change");
    s.register_member(&ns, &member("b", "1"))
        .await
        .expect("join");
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal().await.expect("heal");
    until(&mut w, &[("a", "2"), ("b", "1")], Duration::from_secs(10)).await;
    s.close().await.expect("close");
    until(&mut w, &[], Duration::from_secs(2)).await;
}
