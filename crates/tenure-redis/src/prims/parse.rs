//! Reading Redis's answers: the read and commit scripts' elections, and the elections
//! pushed on a session's channel.

use super::*;

/// An election as read: the snapshot and each record's session PTTL in ms (-2: gone).
pub(super) type Read = (Snapshot, HashMap<String, i64>);

/// The answer of the read or commit script for `n` elections (each `{committed,
/// snapshot}` if `committed`, else the snapshot).
pub(super) fn parse_many(reply: &Value, n: usize, committed: bool) -> Result<Vec<(bool, Read)>> {
    let bad = || unexpected("election script", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != n {
        return Err(bad());
    }
    items
        .iter()
        .map(|item| match (committed, item) {
            (false, snap) => Ok((false, parse_election(snap)?)),
            (true, Value::Array(pair)) => match &pair[..] {
                [done, snap] => Ok((as_int(done) == Some(1), parse_election(snap)?)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        })
        .collect()
}

pub(super) fn parse_election(reply: &Value) -> Result<Read> {
    let bad = || unexpected("read", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let (Some(revision), Some(left)) = (items.first().and_then(as_int), items.get(1)) else {
        return Err(bad());
    };
    let number = |v: &Value| -> Result<Option<u64>> {
        match bytes(v).unwrap_or_default() {
            b"" => Ok(None),
            digits => std::str::from_utf8(digits)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(bad),
        }
    };
    let mut records = Vec::new();
    let mut pttls = HashMap::new();
    for r in items.get(2..).unwrap_or_default().chunks(6) {
        let [session, arrival, version, token, pttl, body] = r else {
            return Err(bad());
        };
        let session = String::from_utf8_lossy(bytes(session).ok_or_else(bad)?).into_owned();
        let pttl = as_int(pttl).ok_or_else(bad)?;
        records.push(Record::from_store(
            session.clone(),
            number(arrival)?.unwrap_or(0),
            number(version)?.unwrap_or(0),
            number(token)?,
            pttl != -2,
            bytes(body).unwrap_or_default(),
        ));
        pttls.insert(session, pttl);
    }
    let revision = u64::try_from(revision).map_err(|_| bad())?;
    let left = bytes(left).unwrap_or_default();
    Ok((Snapshot::from_store(revision, left, records), pttls))
}

/// A pushed election (see the commit script): its hash and what it holds; `None` if
/// the message is not one (an empty one tells of a re-subscription).
pub(super) fn unpack(payload: &[u8]) -> Option<(String, Read)> {
    let mut fields = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let colon = rest.iter().position(|b| *b == b':')?;
        let n: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
        let field = rest.get(colon + 1..colon + 1 + n)?;
        fields.push(Value::BulkString(field.to_vec()));
        rest = &rest[colon + 1 + n..];
    }
    if fields.is_empty() {
        return None;
    }
    let Value::BulkString(hash) = fields.remove(0) else {
        return None;
    };
    let read = parse_election(&Value::Array(fields)).ok()?;
    Some((String::from_utf8(hash).ok()?, read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_election_is_unpacked() {
        let fields = ["p:e:ab", "7", "", "a", "7", "7", "5", "12", "body"];
        let payload: String = fields.iter().map(|f| format!("{}:{f}", f.len())).collect();
        let (hash, (snap, pttls)) = unpack(payload.as_bytes()).expect("a push");
        assert_eq!(hash, "p:e:ab");
        assert_eq!(snap.revision, 7);
        let r = snap.record("a").expect("record");
        assert_eq!(
            (r.arrival, r.version, r.token, r.live),
            (7, 7, Some(5), true)
        );
        assert_eq!(pttls.get("a"), Some(&12));
        assert!(unpack(b"").is_none());
        assert!(unpack(b"9:short").is_none());
    }
}
