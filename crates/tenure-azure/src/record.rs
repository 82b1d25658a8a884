//! The election blob: the engine's records of one election as JSON, with the election's
//! revision and the last token minted in it. Each record keeps the fields the store
//! manages (session, arrival, version, token) and the engine's opaque body; nothing in
//! this file knows what a candidacy holds or how the seat is decided.

use serde::{Deserialize, Serialize};
use tenure_core::engine::{Op, Record, Snapshot, Write};

/// An election as its blob holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stored {
    /// The election's revision: one more with every committed write.
    pub(crate) rev: u64,
    /// The last token minted in this election.
    #[serde(default)]
    pub(crate) tok: u64,
    /// What the election keeps for its next grant ([`Write::left_body`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) left: String,
    #[serde(default)]
    pub(crate) recs: Vec<StoredRecord>,
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredRecord {
    /// The session that owns it.
    pub(crate) s: String,
    /// Arrival: the revision of the write that created it.
    pub(crate) a: u64,
    /// Version: the revision of the write that last changed it.
    pub(crate) v: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) t: Option<u64>,
    /// The engine's body.
    pub(crate) b: String,
}

impl Stored {
    /// Read a blob's body; `None` for a body tenure did not write.
    pub(crate) fn decode(body: &[u8]) -> Option<Stored> {
        serde_json::from_slice(body).ok()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        // Strings and numbers only: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The sessions its records belong to.
    pub(crate) fn sessions(&self) -> impl Iterator<Item = &str> {
        self.recs.iter().map(|r| r.s.as_str())
    }

    /// The engine's snapshot, `live` telling whether a session still lives.
    pub(crate) fn snapshot(&self, live: impl Fn(&str) -> bool) -> Snapshot {
        let records = self
            .recs
            .iter()
            .map(|r| Record::from_store(r.s.clone(), r.a, r.v, r.t, live(&r.s), r.b.as_bytes()))
            .collect();
        Snapshot::from_store(self.rev, self.left.as_bytes(), records)
    }

    /// The election after `write` (decided on this one): the revision moves on, minted
    /// tokens are above both the last one minted here and `floor`.
    pub(crate) fn apply(&self, write: &Write, floor: u64) -> Stored {
        let mut next = self.clone();
        next.rev = self.rev + 1;
        let rev = next.rev;
        if let Some(left) = write.left_body() {
            next.left = String::from_utf8_lossy(&left).into_owned();
        }
        for op in &write.ops {
            let at = next.recs.iter().position(|r| r.s == op.session());
            match (op, at) {
                (Op::Delete(_), Some(i)) => {
                    next.recs.remove(i);
                }
                (Op::Touch(_), Some(i)) => next.recs[i].v = rev,
                (Op::Put { .. }, _) => {
                    let mut minted = next.tok;
                    let mint = || {
                        minted = minted.max(floor) + 1;
                        minted
                    };
                    let arrival = at.map_or(rev, |i| next.recs[i].a);
                    let Some(rec) = op.record(arrival, rev, mint) else {
                        continue;
                    };
                    next.tok = minted;
                    let stored = StoredRecord {
                        s: op.session().to_string(),
                        a: arrival,
                        v: rev,
                        t: rec.token,
                        b: String::from_utf8_lossy(&rec.body()).into_owned(),
                    };
                    match at {
                        Some(i) => next.recs[i] = stored,
                        None => next.recs.push(stored),
                    }
                }
                (Op::Delete(_) | Op::Touch(_), None) => {}
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::engine::{Candidacy, Token};

    fn put(session: &str, token: Token) -> Op {
        Op::Put {
            candidacy: Candidacy {
                session: session.into(),
                candidate: format!("c-{session}"),
                value: "v \"ü\"".into(),
                priority: 3,
                preemptible: true,
            },
            token,
            told: false,
            chosen: false,
            inherited: None,
        }
    }

    #[test]
    fn writes_apply_and_round_trip() {
        let w = Write {
            revision: 0,
            ops: vec![put("a", Token::Mint), put("b", Token::None)],
            ..Write::default()
        };
        let s1 = Stored::default().apply(&w, 0);
        assert_eq!((s1.rev, s1.tok), (1, 1));
        assert_eq!(Stored::decode(&s1.encode()), Some(s1.clone()));
        let snap = s1.snapshot(|s| s == "a");
        assert_eq!(snap.revision, 1);
        let a = snap.record("a").expect("a");
        assert_eq!((a.token, a.live, a.arrival), (Some(1), true, 1));
        assert_eq!(a.candidacy.value, "v \"ü\"");
        assert!(!snap.record("b").expect("b").live);
        // The holder goes, the waiter is granted above the floor; a touch moves a
        // version, not an arrival.
        let w = Write {
            revision: 1,
            ops: vec![Op::Delete("a".into()), put("b", Token::Mint)],
            ..Write::default()
        };
        let s2 = s1.apply(&w, 40);
        assert_eq!((s2.rev, s2.tok, s2.recs.len()), (2, 41, 1));
        assert_eq!((s2.recs[0].a, s2.recs[0].v, s2.recs[0].t), (1, 2, Some(41)));
        let s3 = s2.apply(
            &Write {
                revision: 2,
                ops: vec![Op::Touch("b".into()), Op::Delete("x".into())],
                ..Write::default()
            },
            0,
        );
        assert_eq!((s3.recs[0].a, s3.recs[0].v, s3.tok), (1, 3, 41));
        assert_eq!(Stored::decode(b"not json"), None);
    }
}
