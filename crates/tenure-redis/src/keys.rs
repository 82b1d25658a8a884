//! Key and channel names, the seat value, session ids and jitter.
//!
//! For an election `E` under prefix `P` in database `D`:
//!
//! | name | what |
//! |---|---|
//! | `P:seat:E` | the seat: a string `<session id>\n<token>\n<candidate id>\n<value>` with the holder session's TTL |
//! | `P:token:E` | the fencing counter (no TTL) |
//! | `P:queue:E` | waiting sessions, a sorted set by arrival |
//! | `P:wait:E:<id>` | session `<id>` is still waiting for `E` (renewed by each of its attempts) |
//! | `P:chan:D:E` | the pub/sub channel (channels are not per database, so `D` is in it) |
//! | `P:session:<id>` | a session, with the session TTL |
//!
//! For a membership namespace `N`:
//!
//! | name | what |
//! |---|---|
//! | `P:members:N` | a hash: member id → `<session id>\n<value>` (live while that session's key lives) |
//! | `P:mchan:D:N` | the pub/sub channel of the namespace's changes |
//!
//! Election and namespace names cannot contain `:`, so no two elections or namespaces
//! share a key.

use std::time::Duration;

use tenure_core::backend::{random_id, random_unit, whole_units};
use tenure_core::{ElectionName, FencingToken, LeaderInfo};

/// The keys and channel of one election.
#[derive(Clone, Debug)]
pub(crate) struct ElectionKeys {
    pub(crate) seat: String,
    pub(crate) counter: String,
    pub(crate) queue: String,
    /// What the liveness key of each waiting session starts with (the id follows).
    pub(crate) waits: String,
    pub(crate) channel: String,
}

impl ElectionKeys {
    pub(crate) fn new(prefix: &str, db: i64, election: &ElectionName) -> Self {
        ElectionKeys {
            seat: format!("{prefix}:seat:{election}"),
            counter: format!("{prefix}:token:{election}"),
            queue: format!("{prefix}:queue:{election}"),
            waits: format!("{prefix}:wait:{election}:"),
            channel: format!("{prefix}:chan:{db}:{election}"),
        }
    }
}

/// The keys and channel of one membership namespace.
#[derive(Clone, Debug)]
pub(crate) struct MemberKeys {
    pub(crate) hash: String,
    pub(crate) channel: String,
}

impl MemberKeys {
    pub(crate) fn new(prefix: &str, db: i64, namespace: &ElectionName) -> Self {
        MemberKeys {
            hash: format!("{}{namespace}", members_key_prefix(prefix)),
            channel: format!("{prefix}:mchan:{db}:{namespace}"),
        }
    }
}

/// What every membership hash starts with (the namespace follows).
pub(crate) fn members_key_prefix(prefix: &str) -> String {
    format!("{prefix}:members:")
}

/// The key of session `id`.
pub(crate) fn session_key(prefix: &str, id: &str) -> String {
    format!("{}{id}", session_key_prefix(prefix))
}

/// What every session key starts with (the scripts append the id).
pub(crate) fn session_key_prefix(prefix: &str) -> String {
    format!("{prefix}:session:")
}

/// What every seat key starts with (the election follows).
pub(crate) fn seat_key_prefix(prefix: &str) -> String {
    format!("{prefix}:seat:")
}

/// A `SCAN MATCH` pattern for every key that starts with `start`, with glob
/// characters escaped.
pub(crate) fn scan_pattern(start: &str) -> String {
    let mut out = String::with_capacity(start.len() + 4);
    for c in start.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// A seat value as stored: who holds it, with which token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seat {
    pub(crate) session: String,
    pub(crate) info: LeaderInfo,
}

/// Parse a seat value; `None` if it is not one of ours.
pub(crate) fn parse_seat(raw: &[u8]) -> Option<Seat> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut parts = text.splitn(4, '\n');
    let session = parts.next()?;
    let token = parts.next()?.parse::<u64>().ok()?;
    let id = parts.next()?;
    let value = parts.next()?;
    if session.is_empty() || id.is_empty() {
        return None;
    }
    Some(Seat {
        session: session.to_string(),
        info: LeaderInfo {
            id: id.to_string(),
            value: value.to_string(),
            token: FencingToken(token),
        },
    })
}

/// A new session id: 32 hex digits (see [`random_id`]).
pub(crate) fn new_session_id() -> String {
    format!("{:032x}", random_id())
}

/// A random duration between 80 % and 100 % of `d`: waiters spread out and never wait
/// longer than `d`.
pub(crate) fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.8 + 0.2 * random_unit())
}

/// Milliseconds for Redis, rounded up so the store never keeps something shorter than
/// asked, at least 1.
pub(crate) fn millis_up(d: Duration) -> u64 {
    whole_units(d, Duration::from_millis(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_an_election() {
        let e = ElectionName::new("billing/shard-1").unwrap();
        let k = ElectionKeys::new("app", 2, &e);
        assert_eq!(k.seat, "app:seat:billing/shard-1");
        assert_eq!(k.counter, "app:token:billing/shard-1");
        assert_eq!(k.queue, "app:queue:billing/shard-1");
        assert_eq!(k.waits, "app:wait:billing/shard-1:");
        assert_eq!(k.channel, "app:chan:2:billing/shard-1");
        assert_eq!(session_key("app", "ab"), "app:session:ab");
        assert_eq!(
            scan_pattern(&seat_key_prefix("a*[b]")),
            "a\\*\\[b\\]:seat:*"
        );
        assert_eq!(
            scan_pattern(&members_key_prefix("a?\\")),
            "a\\?\\\\:members:*"
        );
        let m = MemberKeys::new("app", 2, &e);
        assert_eq!(m.hash, "app:members:billing/shard-1");
        assert_eq!(m.channel, "app:mchan:2:billing/shard-1");
        assert_ne!(m.channel, k.channel);
    }

    #[test]
    fn seat_values() {
        let s = parse_seat(b"0123\n42\nnode-1\n10.0.0.1:80 with\nno newline").unwrap();
        assert_eq!(s.session, "0123");
        assert_eq!(s.info.token, FencingToken(42));
        assert_eq!(s.info.id, "node-1");
        assert_eq!(s.info.value, "10.0.0.1:80 with\nno newline");
        assert_eq!(parse_seat(b"s\n1\nid\n").unwrap().info.value, "");
        for bad in [
            &b""[..],
            b"s",
            b"s\n1",
            b"s\nx\nid\nv",
            b"\n1\nid\nv",
            b"s\n1\n\nv",
            b"\xff\n1\nid\nv",
        ] {
            assert!(parse_seat(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn ids_are_distinct_and_hex() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_session_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit())));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let d = Duration::from_millis(1000);
        for _ in 0..1000 {
            let j = jittered(d);
            assert!(j >= Duration::from_millis(800) && j <= d, "{j:?}");
        }
    }

    #[test]
    fn milliseconds_round_up_to_at_least_one() {
        assert_eq!(millis_up(Duration::from_micros(1_500_001)), 1501);
        assert_eq!(millis_up(Duration::ZERO), 1);
    }
}
