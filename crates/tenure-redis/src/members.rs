//! Membership: one hash per namespace (member id → registering session, version and
//! value); an entry is live while its session's key lives, so renewing the session
//! keeps its registrations without touching them. Watchers hear the namespace's channel
//! and look again when the earliest session among the members would expire; a look
//! names the versions the watcher has, so only changed values cross the wire.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tenure_core::backend::Published;
use tenure_core::{ElectionName, Member, MemberStream, Result, Retry};
use tokio::sync::Notify;

use crate::error::unexpected;
use crate::scripts::LIST_SCRIPT;
use crate::shared::{as_int, bytes, Shared};

/// How long a watcher waits for a change when no member could expire.
const IDLE: Duration = Duration::from_secs(24 * 3600);

/// The members a watcher has, by id: the entry's version and the member.
pub(crate) type Known = HashMap<String, (String, Member)>;

/// The live members of the namespace whose hash is `hash`, sorted by id, and how long
/// until the first of their sessions expires unless renewed (`None` without members).
/// `known` is what the caller has; it is replaced by what the list found.
pub(crate) async fn list(
    shared: &Shared,
    hash: &str,
    known: &mut Known,
) -> Result<(Vec<Member>, Option<Duration>)> {
    let mut invocation = LIST_SCRIPT.key(hash);
    invocation.arg(&shared.sessions);
    for (id, (version, _)) in known.iter() {
        invocation.arg(id).arg(version);
    }
    let reply = shared.script("list members", &invocation).await?;
    let parsed = parse_list(&reply, known);
    if parsed.is_err() {
        // Look again from scratch.
        known.clear();
    }
    parsed
}

fn parse_list(reply: &Value, known: &mut Known) -> Result<(Vec<Member>, Option<Duration>)> {
    let Value::Array(items) = reply else {
        return Err(unexpected("list members", format!("{reply:?}")));
    };
    let earliest = items
        .first()
        .and_then(as_int)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    let text = |v: &Value| Some(std::str::from_utf8(bytes(v)?).ok()?.to_string());
    let mut found = Known::new();
    for entry in items.get(1..).unwrap_or_default().chunks(3) {
        let (Some(id), Some(version)) = (entry.first().and_then(text), entry.get(1).and_then(text))
        else {
            continue;
        };
        let member = match entry.get(2) {
            Some(Value::Nil) => match known.remove(&id) {
                Some((v, m)) if v == version => m,
                _ => {
                    return Err(unexpected(
                        "list members",
                        format!("no value for {id:?}, which this watcher does not have"),
                    ))
                }
            },
            // An entry tenure did not write is not a member.
            Some(v) => match text(v).map(|value| Member::new(&id, value)) {
                Some(Ok(m)) => m,
                _ => continue,
            },
            None => continue,
        };
        found.insert(id, (version, member));
    }
    *known = found;
    let mut members: Vec<Member> = known.values().map(|(_, m)| m.clone()).collect();
    members.sort_by(|a, b| a.id().cmp(b.id()));
    Ok((members, earliest))
}

/// The members of `namespace` as they change: read again after every message on the
/// namespace's channel, after a re-subscription, and just after the earliest member
/// session's expiry (which publishes nothing); after a failed read, with back-off at
/// most one poll interval apart.
pub(crate) async fn watch(shared: Arc<Shared>, namespace: &ElectionName) -> Result<MemberStream> {
    let keys = shared.member_keys(namespace);
    // Subscribe before the first list, so no change after it goes unheard. A message
    // (or a re-subscription) that comes while no look waits is kept for the next.
    let heard = Arc::new(Notify::new());
    let wake = heard.clone();
    let on_message = Arc::new(move |_: &[u8]| wake.notify_one());
    let registration = shared.hub.listener(&keys.channel, on_message);
    let mut subscribed = registration.is_subscribed();
    let mut known = Known::new();
    let (first, earliest) = list(&shared, &keys.hash, &mut known).await?;
    let (mut published, stream) = Published::new(first);
    let (poll, retry) = (shared.config.get_poll_interval(), Retry::default());
    tokio::spawn(async move {
        let (mut next, mut failures) = (next_look(earliest), 0u32);
        loop {
            tokio::select! {
                _ = published.closed() => return,
                _ = heard.notified() => {}
                _ = tokio::time::sleep(next) => {}
                // A change published before the subscription was confirmed was missed.
                _ = registration.subscribed(), if !subscribed => {}
            }
            subscribed = registration.is_subscribed();
            match list(&shared, &keys.hash, &mut known).await {
                Ok((members, earliest)) => {
                    (next, failures) = (next_look(earliest), 0);
                    published.publish(Ok(members));
                }
                Err(e) => {
                    next = retry.delay(failures).min(poll);
                    failures = failures.saturating_add(1);
                    published.publish(Err(e));
                }
            }
        }
    });
    Ok(stream)
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
        let mut known = Known::new();
        let reply = Value::Array(vec![
            Value::Int(850),
            bulk("b"),
            bulk("7"),
            bulk("state of b"),
            bulk("a"),
            bulk(""),
            bulk(""),
            bulk("bad/id"),
            bulk("3"),
            bulk("x"),
            bulk("c"),
            bulk("4"),
            Value::BulkString(b"\xff".to_vec()),
        ]);
        let (members, earliest) = parse_list(&reply, &mut known).unwrap();
        let got: Vec<(&str, &str)> = members.iter().map(|m| (m.id(), m.value())).collect();
        assert_eq!(got, [("a", ""), ("b", "state of b")]);
        assert_eq!(earliest, Some(Duration::from_millis(850)));
        assert_eq!(next_look(earliest), Duration::from_millis(851));
        assert_eq!(known.len(), 2);

        // A value left out is the one the watcher has; a gone member goes.
        let reply = Value::Array(vec![Value::Int(-1), bulk("b"), bulk("7"), Value::Nil]);
        let (members, earliest) = parse_list(&reply, &mut known).unwrap();
        let got: Vec<(&str, &str)> = members.iter().map(|m| (m.id(), m.value())).collect();
        assert_eq!(got, [("b", "state of b")]);
        assert_eq!(earliest, None);
        assert_eq!(next_look(None), IDLE);
        assert_eq!(known.keys().collect::<Vec<_>>(), ["b"]);

        // Left out at another version: an error, not a stale value.
        let reply = Value::Array(vec![Value::Int(-1), bulk("b"), bulk("8"), Value::Nil]);
        let e = parse_list(&reply, &mut known).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert_eq!(
            parse_list(&Value::Nil, &mut Known::new())
                .unwrap_err()
                .kind(),
            ErrorKind::Backend
        );
    }
}
