//! Where elections and members live in the etcd key space, and what a candidate key
//! holds, in either layout ([`EtcdLayout`]).
//!
//! Sans-IO: only strings and bytes, so the layout is tested without a server.

use std::fmt;
use std::str::FromStr;

use tenure_core::{ElectionName, Error, Member, Result};

/// Separates an election's name from its candidates' lease ids. It cannot appear in an
/// election name, so no election's candidate range contains another election's keys
/// (with a plain `/`, the range of `a` would contain the candidates of `a/b`).
const CANDIDATE_MARK: &str = "@";

/// Where member namespaces live under the prefix: `<prefix>/@members/`. Election names
/// cannot start with `@`, so no election key starts with it and no election range
/// contains a member key.
const MEMBERS_MARK: &str = "@members";

/// Where the sessions' keys live under the prefix: `<prefix>/@sessions/<lease id>`,
/// beside the member namespaces and, like them, outside every election range.
const SESSIONS_MARK: &str = "@sessions";

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "tenure";

/// The longest key prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 200;

/// Which keys and values elections use in etcd. Members and sessions are the same in
/// both.
///
/// | | [`Tenure`](Self::Tenure) (`layout=tenure`, the default) | [`GoElection`](Self::GoElection) (`layout=go`) |
/// |---|---|---|
/// | candidate key | `<prefix>/<election>/@r/<lease id, 16 hex digits>` beside the election's revision key `@rev` (the election engine's records, see the crate docs) | `<prefix>/<election>/<lease id in lower-case hex>`, the key Go's `concurrency.Election` writes for the election `<prefix>/<election>` |
/// | key value | the token and the engine's record (`{"id":…,"value":…`, priority, marks) | the candidate's value as is (Go's proposal) |
/// | leader | the record holding a token, granted by the engine (priority, then arrival) | the key with the lowest create revision |
/// | priority (clause 14) | kept | refused (`Unsupported`): Go's recipe has none |
/// | leader's id as read | the candidate id | the lease id in the leader's key (Go stores no id) |
/// | prefix | ASCII letters, digits, `-`, `_`, `.`, `/`; no leading `/` | the same, and it may start with `/` or be `/` alone |
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub enum EtcdLayout {
    /// tenure's own keys and values.
    #[default]
    Tenure,
    /// The keys and values of Go's `concurrency.Election` (`etcdctl elect`), so that
    /// tenure candidates and Go services share one election.
    GoElection,
}

impl EtcdLayout {
    /// The layout's name in URLs and the environment: `tenure` or `go`.
    pub fn name(self) -> &'static str {
        match self {
            EtcdLayout::Tenure => "tenure",
            EtcdLayout::GoElection => "go",
        }
    }
}

impl fmt::Display for EtcdLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parse a layout name (`tenure` or `go`); anything else is `InvalidArgument` naming
/// `layout` and the valid values.
impl FromStr for EtcdLayout {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value {
            "tenure" => Ok(EtcdLayout::Tenure),
            "go" => Ok(EtcdLayout::GoElection),
            _ => Err(Error::invalid(format!(
                "layout: {value:?} is not a layout; use tenure (tenure's own keys) or go \
                 (the keys of Go's concurrency.Election and etcdctl elect)"
            ))),
        }
    }
}

/// Check a key prefix for `layout`: the characters of an election name (ASCII letters,
/// digits, `-`, `_`, `.`, `/`), no leading, trailing or doubled `/`; with the Go layout
/// a leading `/` (Go services often name elections `/service/leader`) or `/` alone.
pub(crate) fn validate_prefix(prefix: &str, layout: EtcdLayout) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("prefix {prefix:?}: {why}")));
    if prefix.is_empty() {
        return bad("must not be empty");
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return bad(&format!("longer than {MAX_PREFIX_LEN} bytes"));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
    {
        return bad(&format!(
            "character {c:?} is not allowed (use ASCII letters, digits, '-', '_', '.', '/')"
        ));
    }
    let segments = match layout {
        EtcdLayout::GoElection if prefix == "/" => return Ok(()),
        EtcdLayout::GoElection => prefix.strip_prefix('/').unwrap_or(prefix),
        EtcdLayout::Tenure => prefix,
    };
    if segments.split('/').any(str::is_empty) {
        return bad(match layout {
            EtcdLayout::GoElection => "must not end with '/' nor contain '//'",
            EtcdLayout::Tenure => {
                "must not start or end with '/' nor contain '//' (a leading '/' is allowed \
                 with layout=go)"
            }
        });
    }
    Ok(())
}

/// The keys of one backend: its prefix and layout.
#[derive(Clone, Debug)]
pub(crate) struct KeySpace {
    /// Every key of the backend starts with it: `<prefix>/`, or `/` for the prefix `/`.
    root: String,
    layout: EtcdLayout,
}

impl KeySpace {
    /// The keys under `prefix` (checked by [`validate_prefix`]) in `layout`.
    pub(crate) fn new(prefix: &str, layout: EtcdLayout) -> Self {
        let root = if prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        KeySpace { root, layout }
    }

    /// The layout of elections.
    pub(crate) fn layout(&self) -> EtcdLayout {
        self.layout
    }

    /// The range every key of the backend lies in (a prefix).
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// The key range of one election; every candidate key of the election starts with
    /// it. Tenure layout: `<prefix>/<election>/@`. Go layout: `<prefix>/<election>/`,
    /// the prefix Go's `NewElection(session, "<prefix>/<election>")` uses.
    pub(crate) fn election_range(&self, election: &ElectionName) -> String {
        match self.layout {
            EtcdLayout::Tenure => format!("{}{election}/{CANDIDATE_MARK}", self.root),
            EtcdLayout::GoElection => format!("{}{election}/", self.root),
        }
    }

    /// The Go layout's key of a session's candidacy in an election: the election range
    /// followed by the lease id as Go's `%x` writes it. (The default layout's keys are
    /// the engine's records, [`crate::primitives`].) Its value is the candidate's value,
    /// Go's proposal.
    pub(crate) fn candidate_key(&self, election: &ElectionName, lease: i64) -> String {
        format!("{}{}", self.election_range(election), go_lease_hex(lease))
    }

    /// The key range of one membership namespace: `<prefix>/@members/<namespace>/@`.
    /// Every member key of the namespace starts with it, and no other namespace's keys
    /// do (member ids cannot contain `/`, namespaces cannot contain `@`); no election's
    /// range in either layout contains it (election names cannot start with `@`).
    pub(crate) fn member_range(&self, namespace: &ElectionName) -> String {
        format!("{}{MEMBERS_MARK}/{namespace}/{CANDIDATE_MARK}", self.root)
    }

    /// The key that lives as long as the lease of session `lease` (it is put on the
    /// lease when the session opens, and etcd deletes it with the lease):
    /// `<prefix>/@sessions/<lease id, 16 hex digits>`.
    pub(crate) fn session_key(&self, lease: i64) -> String {
        format!("{}{SESSIONS_MARK}/{}", self.root, lease_hex(lease))
    }

    /// The key of member `id` in `namespace`: the namespace range followed by the id.
    pub(crate) fn member_key(&self, namespace: &ElectionName, id: &str) -> String {
        format!("{}{id}", self.member_range(namespace))
    }
}

/// The member stored under `key` (in the namespace `range`) with `value`; `None` for a
/// key or value tenure did not write (not a valid member id, or not a valid value).
pub(crate) fn decode_member(range: &str, key: &[u8], value: &[u8]) -> Option<Member> {
    let id = std::str::from_utf8(key).ok()?.strip_prefix(range)?;
    let value = std::str::from_utf8(value).ok()?;
    Member::new(id, value).ok()
}

/// A lease id as 16 lowercase hex digits (the session id).
pub(crate) fn lease_hex(lease: i64) -> String {
    format!("{:016x}", lease as u64)
}

/// A lease id as Go's `fmt` writes an `int64` with `%x`: lower-case hex without
/// leading zeros (etcd's lease ids are positive; a negative one gets a `-`, as in Go).
pub(crate) fn go_lease_hex(lease: i64) -> String {
    if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    }
}

/// Parse a session id back into a lease id.
pub(crate) fn parse_lease_hex(id: &str) -> Result<i64> {
    match u64::from_str_radix(id, 16) {
        Ok(v) if id.len() == 16 => Ok(v as i64),
        _ => Err(Error::invalid(format!(
            "session id {id:?}: expected the 16 hex digits of an etcd lease id"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ElectionName {
        ElectionName::new(s).unwrap()
    }

    fn tenure() -> KeySpace {
        KeySpace::new("tenure", EtcdLayout::Tenure)
    }

    #[test]
    fn election_ranges_do_not_nest() {
        let keys = tenure();
        let a = keys.election_range(&name("a"));
        let ab = keys.election_range(&name("a/b"));
        assert_eq!(a, "tenure/a/@");
        assert_eq!(ab, "tenure/a/b/@");
        assert!(!ab.starts_with(&a));
        assert_eq!(keys.root(), "tenure/");
    }

    #[test]
    fn go_keys_are_the_ones_go_writes() {
        // Go: NewElection(s, "svc/billing") keeps "svc/billing/" and Campaign writes
        // fmt.Sprintf("%s%x", prefix, lease).
        let keys = KeySpace::new("svc", EtcdLayout::GoElection);
        let e = name("billing");
        assert_eq!(keys.election_range(&e), "svc/billing/");
        assert_eq!(
            keys.candidate_key(&e, 0x694d_a216_892f_af05),
            "svc/billing/694da216892faf05"
        );
        assert_eq!(keys.candidate_key(&e, 0x1f), "svc/billing/1f");
        assert_eq!(go_lease_hex(-0x1f), "-1f");
        // A prefix that starts with '/' (Go's habit), or is '/' alone.
        let slash = KeySpace::new("/services", EtcdLayout::GoElection);
        assert_eq!(slash.election_range(&e), "/services/billing/");
        let root = KeySpace::new("/", EtcdLayout::GoElection);
        assert_eq!(root.root(), "/");
        assert_eq!(root.election_range(&e), "/billing/");
        assert_eq!(root.member_range(&e), "/@members/billing/@");
        // Members are where the tenure layout keeps them.
        assert_eq!(keys.member_key(&e, "n1"), "svc/@members/billing/@n1");
    }

    #[test]
    fn layout_names_parse_and_bad_ones_name_the_valid_values() {
        for layout in [EtcdLayout::Tenure, EtcdLayout::GoElection] {
            assert_eq!(layout.name().parse::<EtcdLayout>().unwrap(), layout);
            assert_eq!(layout.to_string(), layout.name());
        }
        assert_eq!(EtcdLayout::default(), EtcdLayout::Tenure);
        for bad in ["", "Go", "golang", "curator", " go"] {
            let e = bad.parse::<EtcdLayout>().unwrap_err();
            let message = e.message();
            assert!(message.starts_with("layout: "), "{e}");
            assert!(
                message.contains("tenure") && message.contains(" go "),
                "{e}"
            );
        }
    }

    #[test]
    fn member_keys_are_apart_from_elections_and_other_namespaces() {
        for layout in [EtcdLayout::Tenure, EtcdLayout::GoElection] {
            let keys = KeySpace::new("tenure", layout);
            let ns = keys.member_range(&name("a"));
            assert_eq!(ns, "tenure/@members/a/@");
            let key = keys.member_key(&name("a"), "node-1");
            assert_eq!(key, "tenure/@members/a/@node-1");
            assert!(key.starts_with(&ns));
            // A nested namespace is not in the range of its parent.
            assert!(!keys.member_key(&name("a/b"), "x").starts_with(&ns));
            // No election range contains a member key, nor a member range an election
            // key (election names cannot contain '@', so they never start with it).
            for election in ["a", "@members", "members", "a/@", "x/y"] {
                let Ok(e) = ElectionName::new(election) else {
                    continue;
                };
                let range = keys.election_range(&e);
                assert!(!key.starts_with(&range), "{election}");
                assert!(!keys.candidate_key(&e, 1).starts_with(&ns), "{election}");
            }
        }
        assert!(ElectionName::new("@members/a").is_err());
    }

    #[test]
    fn member_records_decode_and_skip_foreign_keys() {
        let ns = tenure().member_range(&name("ns"));
        let m = decode_member(&ns, format!("{ns}node-1").as_bytes(), b"state 1").unwrap();
        assert_eq!((m.id(), m.value()), ("node-1", "state 1"));
        assert!(decode_member(&ns, format!("{ns}a/b").as_bytes(), b"").is_none());
        assert!(decode_member(&ns, ns.as_bytes(), b"").is_none());
        assert!(decode_member(&ns, b"other/key", b"").is_none());
        assert!(decode_member(&ns, format!("{ns}x").as_bytes(), b"\xff").is_none());
        assert!(decode_member(&ns, format!("{ns}x").as_bytes(), b"bell\x07").is_none());
    }

    #[test]
    fn lease_ids_round_trip() {
        for lease in [1i64, 0x7fff_ffff_ffff_ffff, 0x694d_8a1b_2c3d_4e5f] {
            assert_eq!(parse_lease_hex(&lease_hex(lease)).ok(), Some(lease));
        }
        assert!(parse_lease_hex("xyz").is_err());
        assert!(parse_lease_hex("mem-1").is_err());
        assert!(parse_lease_hex("zzzzzzzzzzzzzzzz").is_err());
    }

    #[test]
    fn prefixes_are_checked() {
        for ok in ["tenure", "app/prod", "a.b-c_d"] {
            validate_prefix(ok, EtcdLayout::Tenure).unwrap();
            validate_prefix(ok, EtcdLayout::GoElection).unwrap();
        }
        for bad in ["", "/x", "x/", "a//b", "a b", "a@b", "ü", "/"] {
            let e = validate_prefix(bad, EtcdLayout::Tenure).unwrap_err();
            assert!(e.message().starts_with("prefix"), "{e}");
        }
        // Go names often start with '/'.
        for ok in ["/", "/x", "/services/billing"] {
            validate_prefix(ok, EtcdLayout::GoElection).unwrap();
        }
        for bad in ["", "//", "//x", "x/", "/x/", "a//b", "a b", "a@b"] {
            let e = validate_prefix(bad, EtcdLayout::GoElection).unwrap_err();
            assert!(e.message().starts_with("prefix"), "{bad:?}: {e}");
        }
    }
}
