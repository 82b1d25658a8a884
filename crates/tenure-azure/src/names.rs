//! Blob names, metadata fields and lease ids.

use std::collections::HashMap;
use std::time::Duration;

use tenure_core::{Candidate, ElectionName, FencingToken, LeaderInfo};

/// Metadata field holding the fencing counter.
pub(crate) const META_TOKEN: &str = "tenuretoken";
/// Metadata field holding the holder's candidate id (percent-encoded).
pub(crate) const META_HOLDER: &str = "tenureholder";
/// Metadata field holding the holder's candidate value (percent-encoded).
pub(crate) const META_VALUE: &str = "tenurevalue";
/// Metadata field holding the id of the holder's session, which names its notice
/// prefix ([`Layout::notices`]).
pub(crate) const META_SESSION: &str = "tenuresession";

/// Where the blobs of elections and members live under an optional prefix.
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

    /// `[prefix/]elections/<election>`.
    pub(crate) fn election(&self, election: &ElectionName) -> String {
        format!("{}elections/{election}", self.base)
    }

    /// `[prefix/]members/<namespace>/` (the namespace's listing prefix).
    pub(crate) fn members(&self, namespace: &ElectionName) -> String {
        format!("{}members/{namespace}/", self.base)
    }

    /// `[prefix/]queues/<election>~/`: the listing prefix of the election's waiting
    /// queue (see `queue.rs`; `~` is never part of an election name).
    pub(crate) fn queue(&self, election: &ElectionName) -> String {
        format!("{}queues/{election}~/", self.base)
    }

    /// `[prefix/]notices/<session>/`: the listing prefix of the notices to the session
    /// `session` (a lease id: a UUID) that a seat it holds is asked for.
    pub(crate) fn notices(&self, session: &str) -> String {
        format!("{}notices/{session}/", self.base)
    }

    /// `[prefix/]notices/<session>/<election>~<token>`: the notice that the grant
    /// `token` of `election`, held by `session`, is asked to step down (`~` is never
    /// part of an election name).
    pub(crate) fn notice(&self, session: &str, election: &ElectionName, token: u64) -> String {
        format!("{}{election}~{token}", self.notices(session))
    }

    /// `[prefix/]members/<namespace>/<id>`.
    pub(crate) fn member(&self, namespace: &ElectionName, id: &str) -> String {
        format!("{}{id}", self.members(namespace))
    }
}

/// A fresh lease id (a random version-4 UUID, the form Azure requires).
pub(crate) fn new_lease_id() -> String {
    azure_core::Uuid::new_v4().to_string()
}

/// Percent-encode everything but unreserved ASCII (metadata values are HTTP header
/// values; candidate values may be any UTF-8).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Undo [`encode`]; `None` for text tenure did not write.
pub(crate) fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let h = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The fencing counter in `metadata` (0 if none yet); `None` if the field holds
/// something else.
pub(crate) fn token_of(metadata: &HashMap<String, String>) -> Option<u64> {
    match metadata.get(META_TOKEN) {
        None => Some(0),
        Some(t) => t.parse().ok(),
    }
}

/// The election and token a notice's name (below its session's notice prefix) stands
/// for; `None` for a name tenure did not write.
pub(crate) fn parse_notice(rel: &str) -> Option<(ElectionName, u64)> {
    let (election, token) = rel.rsplit_once('~')?;
    Some((ElectionName::new(election).ok()?, token.parse().ok()?))
}

/// The session id a grant's metadata names (written since notices exist).
pub(crate) fn session_of(metadata: &HashMap<String, String>) -> Option<&str> {
    metadata
        .get(META_SESSION)
        .map(String::as_str)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// Metadata field of an entry and of a grant: the candidate's priority (−1000..=1000).
pub(crate) const META_PRIORITY: &str = "tenurepriority";
/// Metadata field of an entry and of a grant: `1` if the candidate opted out of
/// preemption.
pub(crate) const META_NO_PREEMPT: &str = "tenurenopreempt";

/// The priority and opt-out of `candidate`, as entries and grants carry them.
pub(crate) fn candidacy_metadata(candidate: &Candidate) -> HashMap<String, String> {
    let mut m = HashMap::from([(META_PRIORITY.to_string(), candidate.priority().to_string())]);
    if !candidate.preemptible() {
        m.insert(META_NO_PREEMPT.to_string(), "1".to_string());
    }
    m
}

/// The metadata of a grant: the token, the holder's id and value, its session (whose
/// notice prefix a preempting waiter or a handover writes to), and its priority and
/// opt-out (which a waiter reads to decide whether it preempts the holder).
pub(crate) fn grant_metadata(
    token: u64,
    candidate: &Candidate,
    session: &str,
) -> HashMap<String, String> {
    let mut m = candidacy_metadata(candidate);
    m.extend([
        (META_SESSION.to_string(), session.to_string()),
        (META_TOKEN.to_string(), token.to_string()),
        (META_HOLDER.to_string(), encode(candidate.id())),
        (META_VALUE.to_string(), encode(candidate.value())),
    ]);
    m
}

/// The leader described by a leased blob's metadata; `None` until a holder wrote it.
pub(crate) fn leader_of(metadata: &HashMap<String, String>) -> Option<LeaderInfo> {
    let token = metadata.get(META_TOKEN)?.parse().ok()?;
    let id = decode(metadata.get(META_HOLDER)?)?;
    let value = decode(metadata.get(META_VALUE).map_or("", String::as_str))?;
    Some(LeaderInfo {
        id,
        value,
        token: FencingToken(token),
    })
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
    fn layout_keeps_elections_and_members_apart() {
        let l = Layout::new("svc/a");
        let e = ElectionName::new("members/x").unwrap();
        assert_eq!(l.election(&e), "svc/a/elections/members/x");
        assert_eq!(l.member(&e, "n1"), "svc/a/members/members/x/n1");
        assert_eq!(Layout::new("").election(&e), "elections/members/x");
        // One election's queue prefix is never a prefix of another's.
        let [a, ab, a_b] = ["a", "ab", "a/b"].map(|n| l.queue(&ElectionName::new(n).unwrap()));
        assert_eq!(a, "svc/a/queues/a~/");
        assert!(!ab.starts_with(&a) && !a_b.starts_with(&a));
        // A notice names its election and token; one session's prefix never lists
        // another's.
        let n = l.notice("s-1", &e, 42);
        assert_eq!(n, "svc/a/notices/s-1/members/x~42");
        let rel = n.strip_prefix(&l.notices("s-1")).unwrap();
        assert_eq!(parse_notice(rel), Some((e, 42)));
        assert!(!l
            .notice("s-10", &ElectionName::new("a").unwrap(), 1)
            .starts_with(&l.notices("s-1")));
        assert_eq!(parse_notice("a~x"), None);
        assert_eq!(parse_notice("a"), None);
        assert_eq!(parse_notice("~1"), None);
    }

    #[test]
    fn metadata_round_trips() {
        let c = Candidate::with_value("node-1", "10.0.0.1:80 ü").unwrap();
        let m = grant_metadata(7, &c, "0f4c6c1e-9a52-4b7e-8d0e-2f1c3b5a7d90");
        assert_eq!(session_of(&m), Some("0f4c6c1e-9a52-4b7e-8d0e-2f1c3b5a7d90"));
        assert_eq!(session_of(&HashMap::new()), None);
        assert!(m.values().all(|v| v.is_ascii() && !v.contains(' ')));
        let l = leader_of(&m).unwrap();
        assert_eq!(
            (l.id.as_str(), l.value.as_str(), l.token),
            ("node-1", "10.0.0.1:80 ü", FencingToken(7))
        );
        assert_eq!(token_of(&m), Some(7));
        assert_eq!(token_of(&HashMap::new()), Some(0));
        assert_eq!(leader_of(&HashMap::new()), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(new_lease_id().len(), 36);
        let j = jittered(Duration::from_millis(100));
        assert!(j >= Duration::from_millis(80) && j <= Duration::from_millis(100));
    }
}
