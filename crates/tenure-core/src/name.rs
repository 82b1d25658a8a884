//! Election names, candidates, fencing tokens and leader records.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The longest election name accepted, in bytes.
pub const MAX_ELECTION_NAME_LEN: usize = 200;
/// The longest candidate id accepted, in bytes.
pub const MAX_CANDIDATE_ID_LEN: usize = 128;
/// The largest candidate value accepted, in bytes.
pub const MAX_CANDIDATE_VALUE_LEN: usize = 1024;
/// The longest member id accepted, in bytes.
pub const MAX_MEMBER_ID_LEN: usize = 128;
/// The largest member value accepted, in bytes.
pub const MAX_MEMBER_VALUE_LEN: usize = 512 * 1024;
/// The lowest candidate priority accepted.
pub const MIN_PRIORITY: i32 = -1000;
/// The highest candidate priority accepted. The range is small so that every store can
/// keep a priority and the queue order in one sortable number (a Redis sorted-set
/// score is a double, exact to 2^53).
pub const MAX_PRIORITY: i32 = 1000;

/// A validated election name, e.g. `billing/shard-0042`.
///
/// Rules (checked by [`ElectionName::new`]):
/// - 1 to [`MAX_ELECTION_NAME_LEN`] bytes;
/// - ASCII letters, digits, `-`, `_`, `.` and `/` only;
/// - `/` separates segments: no leading or trailing `/`, no empty segment (`//`),
///   and no segment that is `.` or `..`.
///
/// These rules make every name a valid etcd key suffix, ZooKeeper path, Redis key and
/// Azure blob name, so a name that works on one backend works on all.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElectionName(Arc<str>);

impl ElectionName {
    /// Validate `name`; a bad name gives [`ErrorKind::InvalidArgument`](crate::ErrorKind)
    /// with the name and the rule it breaks.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        validate_election_name(name)?;
        Ok(ElectionName(Arc::from(name)))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate_election_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("election name {name:?}: {why}")));
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.len() > MAX_ELECTION_NAME_LEN {
        return bad(&format!(
            "is {} bytes long, the limit is {MAX_ELECTION_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
    {
        return bad(&format!(
            "character {c:?} is not allowed (use ASCII letters, digits, '-', '_', '.', '/')"
        ));
    }
    for segment in name.split('/') {
        if segment.is_empty() {
            return bad("must not start or end with '/' nor contain '//'");
        }
        if segment == "." || segment == ".." {
            return bad("segments '.' and '..' are not allowed");
        }
    }
    Ok(())
}

impl fmt::Display for ElectionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ElectionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ElectionName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ElectionName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ElectionName::new(s)
    }
}

impl TryFrom<&str> for ElectionName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        ElectionName::new(s)
    }
}

impl TryFrom<String> for ElectionName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        ElectionName::new(s)
    }
}

/// Who campaigns: an id unique per process, an optional small value (an address,
/// say) that observers see next to the id, and a priority (contract clause 14).
///
/// Among waiters, the highest priority is granted next (ties: queue order); a
/// candidate that joins with a higher priority than the holder preempts it, unless
/// the holder campaigned [`never_preempted`](Self::never_preempted). The default
/// priority is 0, and a backend that does not keep priorities
/// ([`Capabilities::priority`](crate::backend::Capabilities::priority)) refuses any
/// other with `Unsupported`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    id: Arc<str>,
    value: Arc<str>,
    priority: i32,
    preemptible: bool,
}

impl Candidate {
    /// A candidate with an empty value. The id must be 1 to [`MAX_CANDIDATE_ID_LEN`]
    /// bytes of printable ASCII without spaces.
    pub fn new(id: impl AsRef<str>) -> Result<Self> {
        Candidate::with_value(id, "")
    }

    /// A candidate with a value of at most [`MAX_CANDIDATE_VALUE_LEN`] bytes of UTF-8
    /// without control characters.
    pub fn with_value(id: impl AsRef<str>, value: impl AsRef<str>) -> Result<Self> {
        let (id, value) = (id.as_ref(), value.as_ref());
        check_printable("candidate id", id, MAX_CANDIDATE_ID_LEN)?;
        check_value("candidate value", value, MAX_CANDIDATE_VALUE_LEN)?;
        Ok(Candidate {
            id: Arc::from(id),
            value: Arc::from(value),
            priority: 0,
            preemptible: true,
        })
    }

    /// This candidate with `priority`, from [`MIN_PRIORITY`] to [`MAX_PRIORITY`]
    /// (higher is preferred; the default is 0). Outside that range:
    /// `InvalidArgument` naming the range.
    pub fn with_priority(mut self, priority: i32) -> Result<Self> {
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&priority) {
            return Err(Error::invalid(format!(
                "candidate priority {priority}: must be from {MIN_PRIORITY} to {MAX_PRIORITY}"
            )));
        }
        self.priority = priority;
        Ok(self)
    }

    /// This candidate, never preempted while it holds a seat: a candidate with a
    /// higher priority that joins waits until this one resigns or loses the seat (it
    /// is still granted first then).
    pub fn never_preempted(mut self) -> Self {
        self.preemptible = false;
        self
    }

    /// The candidate's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The candidate's value (empty if none was given).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The candidate's priority (0 unless [`with_priority`](Self::with_priority) set
    /// one).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// False if the candidate campaigned [`never_preempted`](Self::never_preempted).
    pub fn preemptible(&self) -> bool {
        self.preemptible
    }
}

/// `value` (the field `what`) is at most `limit` bytes without control characters.
/// `text`, named `what` in the error, is 1 to `max` bytes of printable ASCII without
/// spaces, as candidate ids are (backends check their key prefixes and ids alike).
pub fn check_printable(what: &str, text: &str, max: usize) -> Result<()> {
    check_chars(
        what,
        text,
        max,
        |c| c.is_ascii_graphic(),
        "printable ASCII, no spaces",
    )
}

/// `text`, named `what` in the error, is 1 to `max` bytes of characters that pass
/// `allowed`, which `hint` describes.
fn check_chars(
    what: &str,
    text: &str,
    max: usize,
    allowed: fn(char) -> bool,
    hint: &str,
) -> Result<()> {
    if text.is_empty() || text.len() > max {
        return Err(Error::invalid(format!(
            "{what} {text:?}: must be 1 to {max} bytes"
        )));
    }
    if let Some(c) = text.chars().find(|c| !allowed(*c)) {
        return Err(Error::invalid(format!(
            "{what} {text:?}: character {c:?} is not allowed ({hint})"
        )));
    }
    Ok(())
}

fn check_value(what: &str, value: &str, limit: usize) -> Result<()> {
    if value.len() > limit {
        return Err(Error::invalid(format!(
            "{what}: {} bytes, the limit is {limit}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "{what}: control characters are not allowed"
        )));
    }
    Ok(())
}

impl fmt::Debug for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Candidate")
            .field("id", &&*self.id)
            .field("value", &&*self.value)
            .field("priority", &self.priority)
            .field("preemptible", &self.preemptible)
            .finish()
    }
}

/// A member of a namespace, as the shard manager registers nodes: an id and a value
/// (the node's published state) that every watcher of the namespace sees.
///
/// The id is 1 to [`MAX_MEMBER_ID_LEN`] bytes of ASCII letters, digits, `-`, `_` and `.`
/// (not `.` or `..`), so it is one path segment on every store; the value is at most
/// [`MAX_MEMBER_VALUE_LEN`] bytes of UTF-8 without control characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Member {
    id: Arc<str>,
    value: Arc<str>,
}

impl Member {
    /// Validate `id` and `value`; bad input is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind) naming the field.
    pub fn new(id: impl AsRef<str>, value: impl AsRef<str>) -> Result<Self> {
        let (id, value) = (id.as_ref(), value.as_ref());
        Member::check_id(id)?;
        check_value("member value", value, MAX_MEMBER_VALUE_LEN)?;
        Ok(Member {
            id: Arc::from(id),
            value: Arc::from(value),
        })
    }

    /// Check a member id without building a member.
    pub fn check_id(id: &str) -> Result<()> {
        check_chars(
            "member id",
            id,
            MAX_MEMBER_ID_LEN,
            |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
            "ASCII letters, digits, '-', '_', '.'",
        )?;
        if id == "." || id == ".." {
            return Err(Error::invalid(format!(
                "member id {id:?}: not a valid path segment"
            )));
        }
        Ok(())
    }

    /// The member's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The member's value.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("id", &&*self.id)
            .field("value_len", &self.value.len())
            .finish()
    }
}

/// A number that strictly increases with every grant of the same election, across
/// processes, sessions and store restarts that keep data. Pass it with every write to a
/// guarded resource, which refuses writes carrying a token lower than the highest it has
/// seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The current holder of an election, as anyone can read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The holder's candidate id.
    pub id: String,
    /// The holder's candidate value.
    pub value: String,
    /// The fencing token of the current grant.
    pub token: FencingToken,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn good_names() {
        for n in [
            "a",
            "billing/shard-0042",
            "x.y_z-1",
            "a/b/c",
            &"n".repeat(MAX_ELECTION_NAME_LEN),
        ] {
            assert_eq!(ElectionName::new(n).unwrap().as_str(), n);
        }
    }

    #[test]
    fn bad_names_are_invalid_argument_naming_the_name() {
        let long = "n".repeat(MAX_ELECTION_NAME_LEN + 1);
        for n in [
            "",
            "/a",
            "a/",
            "a//b",
            "a/../b",
            ".",
            "a b",
            "ä",
            "a\0b",
            "a:b",
            long.as_str(),
        ] {
            let e = ElectionName::new(n).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{n:?}");
            assert!(e.message().contains("election name"), "{e}");
        }
    }

    #[test]
    fn candidates() {
        let c = Candidate::with_value("node-1", "10.0.0.1:80").unwrap();
        assert_eq!((c.id(), c.value()), ("node-1", "10.0.0.1:80"));
        assert!(Candidate::new("").is_err());
        assert!(Candidate::new("a b").is_err());
        assert!(Candidate::new("x".repeat(MAX_CANDIDATE_ID_LEN + 1)).is_err());
        assert!(Candidate::with_value("a", "x".repeat(MAX_CANDIDATE_VALUE_LEN + 1)).is_err());
        assert!(Candidate::with_value("a", "line\nbreak").is_err());
    }

    #[test]
    fn priorities() {
        let c = Candidate::new("a").unwrap();
        assert_eq!((c.priority(), c.preemptible()), (0, true));
        let c = c.with_priority(MAX_PRIORITY).unwrap().never_preempted();
        assert_eq!((c.priority(), c.preemptible()), (MAX_PRIORITY, false));
        let low = Candidate::new("a").unwrap().with_priority(MIN_PRIORITY);
        assert_eq!(low.unwrap().priority(), MIN_PRIORITY);
        for bad in [MAX_PRIORITY + 1, MIN_PRIORITY - 1, i32::MAX, i32::MIN] {
            let e = Candidate::new("a").unwrap().with_priority(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains("candidate priority"), "{e}");
            assert!(e.message().contains("-1000 to 1000"), "{e}");
        }
    }

    #[test]
    fn members() {
        let m = Member::new("node-1.a_b", "state").unwrap();
        assert_eq!((m.id(), m.value()), ("node-1.a_b", "state"));
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "ä",
            &"x".repeat(MAX_MEMBER_ID_LEN + 1),
        ] {
            let e = Member::new(bad, "").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message().contains("member id"), "{e}");
        }
        assert!(Member::new("a", "x".repeat(MAX_MEMBER_VALUE_LEN + 1)).is_err());
        assert!(Member::new("a", "tab\there").is_err());
        assert!(!format!("{m:?}").contains("state"));
    }
}
