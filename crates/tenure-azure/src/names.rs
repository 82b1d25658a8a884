//! Blob names and ids.

use std::time::Duration;

use tenure_core::ElectionName;

/// Where the blobs of elections, sessions and members live under an optional prefix.
/// Election and namespace names cannot start with `/` or contain `//`, and session ids
/// are UUIDs, so the three never meet.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    base: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        let base = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        Layout { base }
    }

    /// `[prefix/]elections/<election>`: the election's records (the engine's).
    pub(crate) fn election(&self, election: &ElectionName) -> String {
        format!("{}elections/{election}", self.base)
    }

    /// `[prefix/]sessions/`: the listing prefix of every session.
    pub(crate) fn sessions(&self) -> String {
        format!("{}sessions/", self.base)
    }

    /// `[prefix/]sessions/<id>`: a session, rewritten by every renewal.
    pub(crate) fn session(&self, id: &str) -> String {
        format!("{}{id}", self.sessions())
    }

    /// `[prefix/]members/<namespace>/` (the namespace's listing prefix).
    pub(crate) fn members(&self, namespace: &ElectionName) -> String {
        format!("{}members/{namespace}/", self.base)
    }

    /// `[prefix/]members/<namespace>/<id>`.
    pub(crate) fn member(&self, namespace: &ElectionName, id: &str) -> String {
        format!("{}{id}", self.members(namespace))
    }
}

/// A fresh session id (a random version-4 UUID).
pub(crate) fn new_id() -> String {
    azure_core::Uuid::new_v4().to_string()
}

/// A random 80–100 % of `d`, so pollers do not line up.
pub(crate) fn jittered(d: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let r = RandomState::new().hash_one(std::time::Instant::now()) % 1000;
    d.mul_f64(0.8 + 0.2 * (r as f64 / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_keeps_elections_sessions_and_members_apart() {
        let l = Layout::new("svc/a");
        let e = ElectionName::new("members/x").unwrap();
        assert_eq!(l.election(&e), "svc/a/elections/members/x");
        assert_eq!(l.member(&e, "n1"), "svc/a/members/members/x/n1");
        assert_eq!(l.session("s-1"), "svc/a/sessions/s-1");
        assert_eq!(Layout::new("").election(&e), "elections/members/x");
        assert_eq!(new_id().len(), 36);
        let j = jittered(Duration::from_millis(100));
        assert!(j >= Duration::from_millis(80) && j <= Duration::from_millis(100));
    }
}
