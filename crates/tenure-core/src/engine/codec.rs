//! How a store keeps the engine's records: the fields it manages itself (the session
//! that owns a record, its arrival, version and token, whether the session lives) in
//! its own terms, and everything else as one opaque body the engine encodes. A store
//! therefore never learns what a candidacy holds, and a new field of the engine's (a
//! state left to a successor, say) changes no store.
//!
//! The body is JSON that starts `{"id":…,"value":…`, the same shape as the candidate
//! record of [`decode_record`](crate::backend::decode_record), so tools that read
//! leader values see the id and value.

use serde::{Deserialize, Serialize};

use super::{Candidacy, Inherited, Op, Record, Snapshot, Write};

#[derive(Serialize, Deserialize)]
struct Body {
    id: String,
    #[serde(default)]
    value: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    priority: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    preemptible: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    told: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    chosen: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inherited: Option<Left>,
}

/// A state in a body: the token that left it and the bytes, in hex.
#[derive(Serialize, Deserialize)]
struct Left {
    token: u64,
    state: String,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising strings, numbers and booleans cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    s.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [hi, lo] => Some(digit(*hi)? << 4 | digit(*lo)?),
            _ => None,
        })
        .collect()
}

impl From<&Inherited> for Left {
    fn from(i: &Inherited) -> Self {
        Left {
            token: i.token,
            state: hex(&i.state),
        }
    }
}

impl Left {
    fn decode(self) -> Option<Inherited> {
        Some(Inherited {
            token: self.token,
            state: unhex(&self.state)?,
        })
    }
}

fn body(c: &Candidacy, told: bool, chosen: bool, inherited: Option<&Inherited>) -> Vec<u8> {
    to_json(&Body {
        id: c.candidate.clone(),
        value: c.value.clone(),
        priority: c.priority,
        preemptible: c.preemptible,
        told,
        chosen,
        inherited: inherited.map(Left::from),
    })
}

impl Record {
    /// The opaque body a store keeps for this record.
    pub fn body(&self) -> Vec<u8> {
        body(
            &self.candidacy,
            self.told,
            self.chosen,
            self.inherited.as_ref(),
        )
    }

    /// The record a store holds: the fields it keeps itself and the body it was given.
    /// A body the engine did not write (another tool's data) is a candidate of that
    /// name, as text, of priority 0; never an error.
    pub fn from_store(
        session: String,
        arrival: u64,
        version: u64,
        token: Option<u64>,
        live: bool,
        body: &[u8],
    ) -> Record {
        let b = serde_json::from_slice::<Body>(body).unwrap_or_else(|_| Body {
            id: String::from_utf8_lossy(body).into_owned(),
            value: String::new(),
            priority: 0,
            preemptible: false,
            told: false,
            chosen: false,
            inherited: None,
        });
        Record {
            candidacy: Candidacy {
                session,
                candidate: b.id,
                value: b.value,
                priority: b.priority,
                preemptible: b.preemptible,
            },
            arrival,
            version,
            token,
            told: b.told,
            chosen: b.chosen,
            live,
            inherited: b.inherited.and_then(Left::decode),
        }
    }
}

impl Op {
    /// For a put, the body of the record it leaves (its token aside, which the store
    /// keeps or mints); `None` for a touch or a delete.
    pub fn body(&self) -> Option<Vec<u8>> {
        match self {
            Op::Put {
                candidacy,
                told,
                chosen,
                inherited,
                ..
            } => Some(body(candidacy, *told, *chosen, inherited.as_ref())),
            Op::Touch(_) | Op::Delete(_) => None,
        }
    }
}

impl Write {
    /// For a write that changes the state the election keeps for its next grant, the
    /// bytes to keep (empty: none); `None`: leave what is kept.
    pub fn left_body(&self) -> Option<Vec<u8>> {
        self.left.as_ref().map(|l| {
            l.as_ref()
                .map(|i| to_json(&Left::from(i)))
                .unwrap_or_default()
        })
    }
}

impl Snapshot {
    /// An election as a store holds it: its revision, the bytes it keeps for the next
    /// grant (as [`Write::left_body`] gave them; empty: none) and its records.
    pub fn from_store(revision: u64, left: &[u8], records: Vec<Record>) -> Snapshot {
        Snapshot {
            revision,
            records,
            left: serde_json::from_slice::<Left>(left)
                .ok()
                .and_then(Left::decode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Token;

    fn candidacy() -> Candidacy {
        Candidacy {
            session: "s1".into(),
            candidate: "node-1".into(),
            value: "http://10.0.0.1 \"x\"".into(),
            priority: -3,
            preemptible: true,
        }
    }

    #[test]
    fn records_and_states_round_trip_through_a_store() {
        let state: Vec<u8> = (0..=255).collect();
        let put = Op::Put {
            candidacy: candidacy(),
            token: Token::Mint,
            told: true,
            chosen: false,
            inherited: Some(Inherited {
                token: 41,
                state: state.clone(),
            }),
        };
        let body = put.body().expect("a put has a body");
        assert!(body.starts_with(br#"{"id":"node-1","value":"#));
        let rec = Record::from_store("s1".into(), 7, 9, Some(42), true, &body);
        assert_eq!(Some(rec.clone()), put.record(7, 9, || 42));
        assert_eq!(rec.body(), body);
        let w = Write {
            left: Some(rec.inherited.clone()),
            ..Write::default()
        };
        let kept = w.left_body().expect("a change of what is kept");
        let snap = Snapshot::from_store(3, &kept, vec![rec]);
        assert_eq!(snap.left.map(|l| l.state), Some(state));
        let cleared = Write {
            left: Some(None),
            ..Write::default()
        };
        assert_eq!(cleared.left_body(), Some(Vec::new()));
        assert_eq!(Snapshot::from_store(3, b"", vec![]).left, None);
        assert_eq!(Write::default().left_body(), None);
    }

    #[test]
    fn a_foreign_body_is_a_candidate_of_that_name() {
        let rec = Record::from_store("s".into(), 1, 1, None, true, b"participant-7");
        assert_eq!(rec.candidacy.candidate, "participant-7");
        assert_eq!((rec.candidacy.priority, rec.told), (0, false));
        assert_eq!(unhex("0g"), None);
    }
}
