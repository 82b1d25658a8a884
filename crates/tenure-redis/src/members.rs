//! Membership: one hash per namespace (member id → registering session and value); an
//! entry is live while its session's key lives, so renewing the session keeps its
//! registrations without touching them. Watchers hear the namespace's channel and look
//! again when the earliest session among the members would expire.

use std::time::Duration;

use redis::Value;
use tenure_core::{Member, Result};

use crate::error::unexpected;
use crate::scripts::LIST_SCRIPT;
use crate::shared::{as_int, Shared};

/// How long a watcher waits for a change when no member could expire.
const IDLE: Duration = Duration::from_secs(24 * 3600);

/// The live members of the namespace whose hash is `hash`, sorted by id, and how long
/// until the first of their sessions expires unless renewed (`None` without members).
pub(crate) async fn list(shared: &Shared, hash: &str) -> Result<(Vec<Member>, Option<Duration>)> {
    let mut invocation = LIST_SCRIPT.key(hash);
    invocation.arg(&shared.sessions);
    let reply = shared.script("list members", &invocation).await?;
    parse_list(&reply)
}

fn parse_list(reply: &Value) -> Result<(Vec<Member>, Option<Duration>)> {
    let Value::Array(items) = reply else {
        return Err(unexpected("list members", format!("{reply:?}")));
    };
    let earliest = items
        .first()
        .and_then(as_int)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_string),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut members: Vec<Member> = items
        .get(1..)
        .unwrap_or_default()
        .chunks(2)
        .filter_map(|pair| {
            let id = text(pair.first()?)?;
            let value = text(pair.get(1)?)?;
            // An entry tenure did not write is not a member.
            Member::new(id, value).ok()
        })
        .collect();
    members.sort_by(|a, b| a.id().cmp(b.id()));
    Ok((members, earliest))
}

/// When to look again after a list whose earliest session expiry is `earliest`: just
/// after it, so a crashed member is gone from the list about a millisecond after its
/// session expired.
pub(crate) fn next_look(earliest: Option<Duration>) -> Duration {
    earliest.map_or(IDLE, |d| d + Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::bulk;
    use tenure_core::ErrorKind;

    #[test]
    fn list_replies() {
        let reply = Value::Array(vec![
            Value::Int(850),
            bulk("b"),
            bulk("state of b"),
            bulk("a"),
            bulk(""),
            bulk("bad/id"),
            bulk("x"),
            bulk("c"),
            Value::BulkString(b"\xff".to_vec()),
        ]);
        let (members, earliest) = parse_list(&reply).unwrap();
        let got: Vec<(&str, &str)> = members.iter().map(|m| (m.id(), m.value())).collect();
        assert_eq!(got, [("a", ""), ("b", "state of b")]);
        assert_eq!(earliest, Some(Duration::from_millis(850)));
        assert_eq!(next_look(earliest), Duration::from_millis(851));
        let (members, earliest) = parse_list(&Value::Array(vec![Value::Int(-1)])).unwrap();
        assert!(members.is_empty());
        assert_eq!(earliest, None);
        assert_eq!(next_look(None), IDLE);
        assert_eq!(
            parse_list(&Value::Nil).unwrap_err().kind(),
            ErrorKind::Backend
        );
    }
}
