//! Small helpers for the membership tests that go beyond the conformance suite's
//! clause 13 on one store: sessions opened on a backend directly, members and
//! namespaces from literals, and reading a member stream until it shows a list.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::{BackendSession, SessionEvents};
use tenure_core::{Backend, ElectionName, Member, MemberStream};

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
