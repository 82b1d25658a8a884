//! Small helpers for the membership tests that go beyond the conformance suite's
//! clause 13 on one store (and etcd's batching tests): a local etcd with a backend,
//! sessions opened on a backend directly, members and namespaces from literals, and
//! reading a member stream until it shows a list.

use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use tenure_core::backend::{BackendSession, SessionEvents};
use tenure_core::{Backend, ElectionName, ErrorKind, Member, MemberStream};

/// A local etcd of the test's own and a backend on it, keys under
/// [`run_prefix`](crate::run_prefix), with the URL query `timeouts`.
pub async fn etcd_backend(timeouts: &str) -> (crate::EtcdServer, tenure_etcd::EtcdBackend) {
    let server = crate::EtcdServer::start().await.expect("etcd");
    let (addr, prefix) = (server.addr(), crate::run_prefix());
    let url = format!("etcd://{addr}?prefix={prefix}&{timeouts}");
    match tenure_etcd::EtcdBackend::from_url(&url).await {
        Ok(b) => (server, b),
        Err(e) => panic!("connect to {addr}: {e}"),
    }
}

/// A backend session with `ttl` (its events are dropped).
pub async fn open(b: &dyn Backend, ttl: Duration) -> Arc<dyn BackendSession> {
    let (events, _) = SessionEvents::channel();
    match b.open_session(ttl, events).await {
        Ok(s) => s,
        Err(e) => panic!("open session: {e}"),
    }
}

/// A namespace name from a literal.
pub fn name(s: &str) -> ElectionName {
    match ElectionName::new(s) {
        Ok(n) => n,
        Err(e) => panic!("name {s:?}: {e}"),
    }
}

/// A member from literals.
pub fn member(id: &str, value: &str) -> Member {
    match Member::new(id, value) {
        Ok(m) => m,
        Err(e) => panic!("member {id:?}: {e}"),
    }
}

/// The (id, value) pairs of a member list.
pub fn pairs(members: &[Member]) -> Vec<(String, String)> {
    members
        .iter()
        .map(|m| (m.id().to_string(), m.value().to_string()))
        .collect()
}

/// Read `w` until it shows exactly `list`; panics after `within`.
pub async fn until(w: &mut MemberStream, list: &[(&str, &str)], within: Duration) {
    let what = format!("{list:?}");
    tenure_core::testing::watch_until(w, list, within, &what).await;
}

/// Read `w` until `ok` accepts a list; panics, saying `what` and the last list seen,
/// after `within`, or at once when the stream ends or yields an error.
pub async fn until_where(
    w: &mut MemberStream,
    what: &str,
    within: Duration,
    ok: impl Fn(&[Member]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = None;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Ok(members))) if ok(&members) => return,
            Ok(Some(Ok(members))) => {
                seen = Some(format!("{} members: {:?}", members.len(), members.first()))
            }
            Ok(Some(Err(e))) => panic!("{what}: member stream error: {e}"),
            Ok(None) => panic!("{what}: the member stream ended"),
            Err(_) => panic!("{what}: not within {within:?}; last seen {seen:?}"),
        }
    }
}

/// A crashed member goes by itself: `alive` (a session kept alive by the caller)
/// registers `alive` and a session of `ttl` registers `crashed` in `ns`; once a watch
/// shows both, `before_crash` runs, the crashed session renews one last time and is
/// dropped. Returns the watch, once it shows `alive` alone (within `within`), and how
/// long after that last renewal it did.
pub async fn crashed_member_goes(
    b: &dyn Backend,
    ns: &ElectionName,
    alive: &dyn BackendSession,
    ttl: Duration,
    within: Duration,
    before_crash: impl Future<Output = ()>,
) -> (MemberStream, Duration) {
    alive
        .register_member(ns, &member("alive", "1"))
        .await
        .expect("register alive");
    let crashed = open(b, ttl).await;
    let registered = crashed.register_member(ns, &member("crashed", "1")).await;
    registered.expect("register crashed");
    let mut w = b.watch_members(ns).await.expect("watch");
    until(
        &mut w,
        &[("alive", "1"), ("crashed", "1")],
        Duration::from_secs(1),
    )
    .await;
    before_crash.await;
    crashed.keep_alive().await.expect("keep-alive");
    let t0 = std::time::Instant::now();
    drop(crashed);
    until(&mut w, &[("alive", "1")], within).await;
    let gone = t0.elapsed();
    eprintln!("crashed member gone {gone:?} after its last renewal (TTL {ttl:?})");
    (w, gone)
}

/// An ended session's members go at once: `s` (with a TTL far longer than a second)
/// registers `m` in `ns`; once a watch shows it, `end` ends the session the store's
/// way; the watch shows no member within a second, and `s` can register no more.
pub async fn ended_session_loses_its_members<T>(
    b: &dyn Backend,
    ns: &ElectionName,
    s: &dyn BackendSession,
    end: impl Future<Output = tenure_core::Result<T>>,
) {
    s.register_member(ns, &member("m", "1"))
        .await
        .expect("register");
    let mut w = b.watch_members(ns).await.expect("watch");
    until(&mut w, &[("m", "1")], Duration::from_secs(1)).await;
    let t0 = std::time::Instant::now();
    end.await.expect("end the session");
    until(&mut w, &[], Duration::from_secs(1)).await;
    eprintln!("ended session's member gone after {:?}", t0.elapsed());
    let e = s.register_member(ns, &member("m", "2")).await;
    let e = e.expect_err("session gone");
    assert_eq!(e.kind(), ErrorKind::SessionExpired, "{e}");
}
