//! Key and channel names, the seat value, session ids and jitter.
//!
//! For an election `E` under prefix `P` in database `D`:
//!
//! | name | what |
//! |---|---|
//! | `P:seat:E` | the seat: a string `<session id>\n<token>\n<terms>\n<candidate id>\n<value>` with the holder session's TTL; `<terms>` is `prio <priority> <preemptible 1/0> <told 1/0>` (see [`SeatTerms`]) |
//! | `P:token:E` | the fencing counter (no TTL) |
//! | `P:queue:E` | waiting sessions, a sorted set by priority, then arrival (see [`queue_band`]) |
//! | `P:wait:E:<id>` | session `<id>` is still waiting for `E` (renewed by each of its attempts); its value is the waiter's tag (see [`waiter_tag`]) |
//! | `P:next:E` | the waiter a free seat is kept for: `<session id> <deadline in µs>` (the waiter woken last) |
//! | `P:chan:D:E` | the pub/sub channel (channels are not per database, so `D` is in it) |
//! | `P:session:<id>` | a session, with the session TTL |
//! | `P:schan:D:<id>` | the pub/sub channel of session `<id>`: `preempt <token> <election>` tells it to give up a seat |
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
use tenure_core::{Candidate, ElectionName, FencingToken, LeaderInfo, MAX_PRIORITY, MIN_PRIORITY};

/// The keys and channel of one election.
#[derive(Clone, Debug)]
pub(crate) struct ElectionKeys {
    /// The election's name, as the scripts put it in messages.
    pub(crate) election: String,
    pub(crate) seat: String,
    pub(crate) counter: String,
    pub(crate) queue: String,
    /// What the liveness key of each waiting session starts with (the id follows).
    pub(crate) waits: String,
    /// The waiter a free seat is kept for.
    pub(crate) next: String,
    pub(crate) channel: String,
    /// The election's hash (its revision, what is left, its records).
    pub(crate) hash: String,
}

impl ElectionKeys {
    pub(crate) fn new(prefix: &str, db: i64, election: &ElectionName) -> Self {
        ElectionKeys {
            election: election.to_string(),
            seat: format!("{prefix}:seat:{election}"),
            counter: format!("{prefix}:token:{election}"),
            queue: format!("{prefix}:queue:{election}"),
            waits: format!("{prefix}:wait:{election}:"),
            next: format!("{prefix}:next:{election}"),
            channel: format!("{prefix}:chan:{db}:{election}"),
            hash: format!("{prefix}:e:{election}"),
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

/// The store-wide token counter.
pub(crate) fn token_key(prefix: &str) -> String {
    format!("{prefix}:tokens")
}

/// The key of session `id`.
pub(crate) fn session_key(prefix: &str, id: &str) -> String {
    format!("{}{id}", session_key_prefix(prefix))
}

/// What every session key starts with (the scripts append the id).
pub(crate) fn session_key_prefix(prefix: &str) -> String {
    format!("{prefix}:session:")
}

/// What the pub/sub channel of every session starts with (the scripts append the id).
pub(crate) fn session_channel_prefix(prefix: &str, db: i64) -> String {
    format!("{prefix}:schan:{db}:")
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

/// How many places one priority has in the queue: a waiter's score is its priority's
/// [`queue_band`] plus its arrival within the band (one more than the last waiter of
/// that band still queued).
pub(crate) const BAND: i64 = 1 << 42;

/// The lowest queue score of a waiter of `priority` (the scores of its band run up to
/// `queue_band(priority) + BAND - 1`). The highest priority has the lowest band, so
/// `ZRANGE queue 0 0` is the best waiter; every score stays below 2^53, so Redis and
/// Lua (doubles) keep it exactly. A handover moves its waiter below every band (a
/// negative score).
pub(crate) fn queue_band(priority: i32) -> i64 {
    let rank = i64::from(MAX_PRIORITY) - i64::from(priority.clamp(MIN_PRIORITY, MAX_PRIORITY));
    rank * BAND
}

/// The priority whose band holds queue score `score`; `None` for a score below every
/// band (a handover's) or above them.
#[cfg(test)]
pub(crate) fn band_priority(score: i64) -> Option<i32> {
    if score < 0 {
        return None;
    }
    let priority = i64::from(MAX_PRIORITY) - score / BAND;
    i32::try_from(priority)
        .ok()
        .filter(|p| (MIN_PRIORITY..=MAX_PRIORITY).contains(p))
}

/// What the seat keeps of a holder's candidacy besides its id and value: its priority,
/// whether it may be preempted, and whether it was told to give the seat up (a
/// preemption or a handover), which the renewal answers until the seat is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeatTerms {
    pub(crate) priority: i32,
    pub(crate) preemptible: bool,
    pub(crate) told: bool,
}

impl SeatTerms {
    /// The terms of a new grant to `candidate`, as the grant writes them.
    pub(crate) fn of(candidate: &Candidate) -> Self {
        SeatTerms {
            priority: candidate.priority(),
            preemptible: candidate.preemptible(),
            told: false,
        }
    }

    /// As stored: `prio <priority> <preemptible 1/0> <told 1/0>` (spaces, which no
    /// candidate id holds, so a seat written without terms never passes for one).
    pub(crate) fn encode(&self) -> String {
        format!(
            "prio {} {} {}",
            self.priority, self.preemptible as u8, self.told as u8
        )
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut words = text.split(' ');
        if words.next()? != "prio" {
            return None;
        }
        let priority = words.next()?.parse::<i32>().ok()?;
        let flag = |w: Option<&str>| match w {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        };
        let preemptible = flag(words.next())?;
        let told = flag(words.next())?;
        if words.next().is_some() || !(MIN_PRIORITY..=MAX_PRIORITY).contains(&priority) {
            return None;
        }
        Some(SeatTerms {
            priority,
            preemptible,
            told,
        })
    }
}

/// The value of a waiter's liveness key: `<priority> <preemptible 1/0> <candidate id>`
/// (the id last: it has no spaces, but may have anything else). The handover script
/// finds a waiter by the id; a newcomer of a higher priority takes a free seat kept for
/// a preemptible waiter of a lower one.
pub(crate) fn waiter_tag(candidate: &Candidate) -> String {
    format!(
        "{} {} {}",
        candidate.priority(),
        candidate.preemptible() as u8,
        candidate.id()
    )
}

/// A seat value as stored: who holds it, with which token, on which terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seat {
    pub(crate) session: String,
    pub(crate) terms: SeatTerms,
    pub(crate) info: LeaderInfo,
}

/// Parse a seat value; `None` if it is not one of ours.
pub(crate) fn parse_seat(raw: &[u8]) -> Option<Seat> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut parts = text.splitn(5, '\n');
    let session = parts.next()?;
    let token = parts.next()?.parse::<u64>().ok()?;
    let terms = SeatTerms::parse(parts.next()?)?;
    let id = parts.next()?;
    let value = parts.next()?;
    if session.is_empty() || id.is_empty() {
        return None;
    }
    Some(Seat {
        session: session.to_string(),
        terms,
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
        assert_eq!(k.next, "app:next:billing/shard-1");
        assert_eq!(k.election, "billing/shard-1");
        assert_eq!(session_channel_prefix("app", 2), "app:schan:2:");
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
        let s = parse_seat(b"0123\n42\nprio -7 0 1\nnode-1\n10.0.0.1:80 with\nno newline").unwrap();
        assert_eq!(s.session, "0123");
        assert_eq!(s.info.token, FencingToken(42));
        assert_eq!(
            s.terms,
            SeatTerms {
                priority: -7,
                preemptible: false,
                told: true
            }
        );
        assert_eq!(s.info.id, "node-1");
        assert_eq!(s.info.value, "10.0.0.1:80 with\nno newline");
        assert_eq!(
            parse_seat(b"s\n1\nprio 0 1 0\nid\n").unwrap().info.value,
            ""
        );
        for bad in [
            &b""[..],
            b"s",
            b"s\n1",
            b"s\nx\nprio 0 1 0\nid\nv",
            b"\n1\nprio 0 1 0\nid\nv",
            b"s\n1\nprio 0 1 0\n\nv",
            b"\xff\n1\nprio 0 1 0\nid\nv",
            // The layout before priorities: no terms.
            b"s\n1\nid\nv",
            b"s\n1\nid\nprio 0 1 0\nv",
        ] {
            assert!(parse_seat(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn seat_terms_round_trip_and_reject_the_rest() {
        for priority in [MIN_PRIORITY, -1, 0, 1, MAX_PRIORITY] {
            for preemptible in [false, true] {
                for told in [false, true] {
                    let t = SeatTerms {
                        priority,
                        preemptible,
                        told,
                    };
                    assert_eq!(SeatTerms::parse(&t.encode()), Some(t));
                    // What the scripts match: `tell` and the renewal's told flag.
                    let e = t.encode();
                    assert!(e.starts_with("prio ") && e.ends_with(if told { " 1" } else { " 0" }));
                    assert!(e.contains(' '), "a candidate id can never look like terms");
                }
            }
        }
        let c = Candidate::new("a")
            .unwrap()
            .with_priority(5)
            .unwrap()
            .never_preempted();
        assert_eq!(SeatTerms::of(&c).encode(), "prio 5 0 0");
        assert_eq!(
            SeatTerms::of(&Candidate::new("a").unwrap()).encode(),
            "prio 0 1 0"
        );
        for bad in [
            "",
            "prio",
            "prio 1 1",
            "prio 1 1 1 1",
            "prio x 1 0",
            "prio 1 2 0",
            "prio 1 1 x",
            "prio 1001 1 0",
            "prio -1001 1 0",
            "prio  1 1 0",
            "pri 1 1 0",
            "node-1",
        ] {
            assert_eq!(SeatTerms::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn waiter_tags() {
        let c = Candidate::new("node:1,a=b").unwrap();
        assert_eq!(waiter_tag(&c), "0 1 node:1,a=b");
        let c = c.with_priority(-12).unwrap().never_preempted();
        let tag = waiter_tag(&c);
        assert_eq!(tag, "-12 0 node:1,a=b");
        // What the scripts read back: priority, opt-out, then the id whole.
        let mut parts = tag.splitn(3, ' ');
        assert_eq!(parts.next().map(str::parse::<i32>), Some(Ok(-12)));
        assert_eq!(parts.next(), Some("0"));
        assert_eq!(parts.next(), Some(c.id()));
    }

    #[test]
    fn queue_scores_order_by_priority_then_arrival_exactly() {
        // The best priority has the lowest band; bands do not overlap.
        let mut last_end = None;
        for priority in (MIN_PRIORITY..=MAX_PRIORITY).rev() {
            let band = queue_band(priority);
            assert!(band >= 0);
            if let Some(end) = last_end {
                assert_eq!(band, end, "priority {priority}");
            }
            last_end = Some(band + BAND);
            assert_eq!(band_priority(band), Some(priority));
            assert_eq!(band_priority(band + BAND - 1), Some(priority));
        }
        assert_eq!(queue_band(MAX_PRIORITY), 0);
        // A later arrival of a better priority still goes first.
        assert!(queue_band(5) + BAND - 1 < queue_band(4));
        assert!(queue_band(1) < queue_band(0) && queue_band(0) < queue_band(-1));
        // Every score Lua and Redis handle is exact in a double (below 2^53), and the
        // neighbours at the top stay apart.
        let top = queue_band(MIN_PRIORITY) + BAND - 1;
        assert!(top < 1 << 53, "{top}");
        assert_ne!(top as f64, (top - 1) as f64);
        assert_eq!((top as f64) as i64, top);
        // Out of range (never reaches here: the core rejects it) is clamped.
        assert_eq!(queue_band(5000), queue_band(MAX_PRIORITY));
        assert_eq!(band_priority(-1), None);
        assert_eq!(band_priority(queue_band(MIN_PRIORITY) + BAND), None);
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
