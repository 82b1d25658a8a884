//! Key and channel names (their layout is in the crate README), session ids and
//! jitter. Election and namespace names cannot contain `:`, so no two share a key, and
//! channels (not per database in Redis) carry the database number.

use std::time::Duration;

use tenure_core::backend::{random_id, random_unit, whole_units};
use tenure_core::ElectionName;

/// The hash and channel of one election or membership namespace.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    pub(crate) hash: String,
    pub(crate) channel: String,
}

impl Keys {
    pub(crate) fn election(prefix: &str, db: i64, election: &ElectionName) -> Self {
        Keys {
            hash: format!("{prefix}:e:{election}"),
            channel: format!("{prefix}:chan:{db}:{election}"),
        }
    }

    pub(crate) fn members(prefix: &str, db: i64, namespace: &ElectionName) -> Self {
        Keys {
            hash: format!("{}{namespace}", members_key_prefix(prefix)),
            channel: format!("{prefix}:mchan:{db}:{namespace}"),
        }
    }
}

/// What every membership hash starts with (the namespace follows).
pub(crate) fn members_key_prefix(prefix: &str) -> String {
    format!("{prefix}:members:")
}

/// The store-wide token counter.
pub(crate) fn token_key(prefix: &str) -> String {
    format!("{prefix}:tokens")
}

/// What every session key starts with (the id follows).
pub(crate) fn session_key_prefix(prefix: &str) -> String {
    format!("{prefix}:session:")
}

/// What the pub/sub channel of every session starts with (the id follows).
pub(crate) fn session_channel_prefix(prefix: &str, db: i64) -> String {
    format!("{prefix}:schan:{db}:")
}

/// The channel of every session revoked.
pub(crate) fn ended_channel(prefix: &str, db: i64) -> String {
    format!("{prefix}:ended:{db}")
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
        let k = Keys::election("app", 2, &e);
        assert_eq!(k.hash, "app:e:billing/shard-1");
        assert_eq!(k.channel, "app:chan:2:billing/shard-1");
        assert_eq!(session_channel_prefix("app", 2), "app:schan:2:");
        assert_eq!(ended_channel("app", 2), "app:ended:2");
        assert_eq!(session_key_prefix("app"), "app:session:");
        assert_eq!(token_key("app"), "app:tokens");
        assert_eq!(
            scan_pattern(&members_key_prefix("a?\\")),
            "a\\?\\\\:members:*"
        );
        assert_eq!(scan_pattern("a*[b]:"), "a\\*\\[b\\]:*");
        let m = Keys::members("app", 2, &e);
        assert_eq!(m.hash, "app:members:billing/shard-1");
        assert_eq!(m.channel, "app:mchan:2:billing/shard-1");
        assert_ne!(m.channel, k.channel);
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
