//! The candidate record of stores that keep one value per candidacy (etcd keys,
//! ZooKeeper nodes): JSON `{"id":…,"value":…}`, the same bytes on every such store, and
//! the fencing token taken from the store's own revision of the candidacy.

use serde::{Deserialize, Serialize};

use crate::name::{Candidate, FencingToken, LeaderInfo};

#[derive(Serialize)]
struct Record<'a> {
    id: &'a str,
    value: &'a str,
}

#[derive(Deserialize)]
struct OwnedRecord {
    id: String,
    #[serde(default)]
    value: String,
}

/// The record stored for `candidate`.
pub fn encode_record(candidate: &Candidate) -> Vec<u8> {
    let record = Record {
        id: candidate.id(),
        value: candidate.value(),
    };
    // Serialising two strings cannot fail; fall back to the bare id all the same.
    serde_json::to_vec(&record).unwrap_or_else(|_| candidate.id().as_bytes().to_vec())
}

/// The leader described by a stored record and its grant's `token`. Data that is not a
/// record (written by another tool: a Curator participant id, say) becomes the id, as
/// text, with an empty value; never an error.
pub fn decode_record(data: &[u8], token: FencingToken) -> LeaderInfo {
    match serde_json::from_slice::<OwnedRecord>(data) {
        Ok(r) => LeaderInfo {
            id: r.id,
            value: r.value,
            token,
        },
        Err(_) => LeaderInfo {
            id: String::from_utf8_lossy(data).into_owned(),
            value: String::new(),
            token,
        },
    }
}

/// The fencing token of a grant whose store revision (etcd create revision, ZooKeeper
/// creation zxid) is `revision`: positive for every real grant, 0 for anything else.
pub fn revision_token(revision: i64) -> FencingToken {
    FencingToken(u64::try_from(revision).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_foreign_data_is_the_id() {
        let c = Candidate::with_value("node-1", "http://10.0.0.1:80 \"x\"").unwrap();
        let data = encode_record(&c);
        assert_eq!(
            std::str::from_utf8(&data).unwrap(),
            r#"{"id":"node-1","value":"http://10.0.0.1:80 \"x\""}"#
        );
        let info = decode_record(&data, revision_token(42));
        assert_eq!(
            (info.id.as_str(), info.value.as_str()),
            ("node-1", c.value())
        );
        assert_eq!(info.token, FencingToken(42));
        let foreign = decode_record(b"\xffparticipant", revision_token(3));
        assert_eq!(
            (foreign.id.as_str(), foreign.value.as_str()),
            ("\u{fffd}participant", "")
        );
        assert_eq!(decode_record(br#"{"id":"x"}"#, FencingToken(5)).id, "x");
        assert_eq!(revision_token(-1), FencingToken(0));
    }
}
