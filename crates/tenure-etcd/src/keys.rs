//! Where elections and members live in the etcd key space, and what a candidate key
//! holds.
//!
//! Sans-IO: only strings and bytes, so the layout is tested without a server.

use tenure_core::{ElectionName, Error, Member, Result};

/// Separates an election's name from its candidates' lease ids. It cannot appear in an
/// election name, so no election's candidate range contains another election's keys
/// (with a plain `/`, the range of `a` would contain the candidates of `a/b`).
const CANDIDATE_MARK: &str = "@";

/// Where member namespaces live under the prefix: `<prefix>/@members/`. Election names
/// cannot start with `@`, so no election key starts with it and no election range
/// contains a member key.
const MEMBERS_MARK: &str = "@members";

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "tenure";

/// The longest key prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 200;

/// Check a key prefix: the characters of an election name (ASCII letters, digits, `-`,
/// `_`, `.`, `/`), no leading, trailing or doubled `/`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
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
    if prefix.split('/').any(str::is_empty) {
        return bad("must not start or end with '/' nor contain '//'");
    }
    Ok(())
}

/// The key range of one election: `<prefix>/<election>/@`. Every candidate key of the
/// election starts with it.
pub(crate) fn election_range(prefix: &str, election: &ElectionName) -> String {
    format!("{prefix}/{election}/{CANDIDATE_MARK}")
}

/// The key of a session's candidacy in an election: the election range followed by the
/// lease id in 16 hex digits.
pub(crate) fn candidate_key(prefix: &str, election: &ElectionName, lease: i64) -> String {
    format!("{}{}", election_range(prefix, election), lease_hex(lease))
}

/// The key range of one membership namespace: `<prefix>/@members/<namespace>/@`. Every
/// member key of the namespace starts with it, and no other namespace's keys do (member
/// ids cannot contain `/`, namespaces cannot contain `@`).
pub(crate) fn member_range(prefix: &str, namespace: &ElectionName) -> String {
    format!("{prefix}/{MEMBERS_MARK}/{namespace}/{CANDIDATE_MARK}")
}

/// The key of member `id` in `namespace`: the namespace range followed by the id.
pub(crate) fn member_key(prefix: &str, namespace: &ElectionName, id: &str) -> String {
    format!("{}{id}", member_range(prefix, namespace))
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

/// Parse a session id back into a lease id.
pub(crate) fn parse_lease_hex(id: &str) -> Option<i64> {
    if id.len() != 16 {
        return None;
    }
    u64::from_str_radix(id, 16).ok().map(|v| v as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ElectionName {
        ElectionName::new(s).unwrap()
    }

    #[test]
    fn election_ranges_do_not_nest() {
        let a = election_range("tenure", &name("a"));
        let ab = candidate_key("tenure", &name("a/b"), 7);
        assert_eq!(a, "tenure/a/@");
        assert_eq!(ab, "tenure/a/b/@0000000000000007");
        assert!(!ab.starts_with(&a));
        let own = candidate_key("tenure", &name("a"), 0x1234);
        assert!(own.starts_with(&a));
    }

    #[test]
    fn member_keys_are_apart_from_elections_and_other_namespaces() {
        let ns = member_range("tenure", &name("a"));
        assert_eq!(ns, "tenure/@members/a/@");
        let key = member_key("tenure", &name("a"), "node-1");
        assert_eq!(key, "tenure/@members/a/@node-1");
        assert!(key.starts_with(&ns));
        // A nested namespace is not in the range of its parent.
        assert!(!member_key("tenure", &name("a/b"), "x").starts_with(&ns));
        // No election range contains a member key, nor a member range an election key
        // (election names cannot contain '@', so they never start with it).
        for election in ["a", "@members", "members", "a/@", "x/y"] {
            let Ok(e) = ElectionName::new(election) else {
                continue;
            };
            let range = election_range("tenure", &e);
            assert!(!key.starts_with(&range), "{election}");
            assert!(
                !candidate_key("tenure", &e, 1).starts_with(&ns),
                "{election}"
            );
        }
        assert!(ElectionName::new("@members/a").is_err());
    }

    #[test]
    fn member_records_decode_and_skip_foreign_keys() {
        let ns = member_range("p", &name("ns"));
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
            assert_eq!(parse_lease_hex(&lease_hex(lease)), Some(lease));
        }
        assert_eq!(parse_lease_hex("xyz"), None);
        assert_eq!(parse_lease_hex("mem-1"), None);
        assert_eq!(parse_lease_hex("zzzzzzzzzzzzzzzz"), None);
    }

    #[test]
    fn prefixes_are_checked() {
        for ok in ["tenure", "app/prod", "a.b-c_d"] {
            validate_prefix(ok).unwrap();
        }
        for bad in ["", "/x", "x/", "a//b", "a b", "a@b", "ü"] {
            let e = validate_prefix(bad).unwrap_err();
            assert!(e.message().starts_with("prefix"), "{e}");
        }
    }
}
