//! `Backend::handover` in the tenure layout: tell the holder to step down (delete its
//! notice key) and, for a named waiter, leave a handover request that the next grant
//! follows and uses up.

use tenure_core::backend::decode_record;
use tenure_core::{ElectionName, Error, ErrorKind, FencingToken, LeaderInfo, Result};

use crate::error::TAG;
use crate::keys::{decode_entry, encode_handover, queue_key_lease, seat_leader};
use crate::ops::{self, op};
use crate::proto::{KeyValue, TxnRequest};
use crate::shared::Shared;

/// Why a handover is refused (before anything is written).
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    NobodyWaits,
    NoSuchWaiter,
}

/// The waiters of the queue `kvs` (the keys under `range`, with values), without the
/// holder's own queue key (on `holder_lease`), in grant order: priority bucket, then
/// create revision.
fn waiters<'a>(range: &str, holder_lease: i64, kvs: &'a [KeyValue]) -> Vec<&'a KeyValue> {
    let mut waiting: Vec<&KeyValue> = kvs
        .iter()
        .filter(|kv| queue_key_lease(&kv.key) != Some(holder_lease))
        .collect();
    let bucket = |kv: &KeyValue| kv.key.get(range.len()..range.len() + 4).map(<[u8]>::to_vec);
    waiting.sort_by_key(|kv| (bucket(kv), kv.create_revision));
    waiting
}

/// The queue key (and its create revision) a handover to `to` names: `None` for the
/// best waiter (no request needed: the queue order gives it the seat).
fn target(
    range: &str,
    holder_lease: i64,
    kvs: &[KeyValue],
    to: Option<&str>,
) -> std::result::Result<Option<(String, i64)>, Refusal> {
    let waiting = waiters(range, holder_lease, kvs);
    if waiting.is_empty() {
        return Err(Refusal::NobodyWaits);
    }
    let Some(id) = to else { return Ok(None) };
    waiting
        .into_iter()
        .find(|kv| {
            let record = decode_entry(&kv.value).record;
            decode_record(record, FencingToken(0)).id == id
        })
        .map(|kv| {
            Some((
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.create_revision,
            ))
        })
        .ok_or(Refusal::NoSuchWaiter)
}

/// Ask the holder of `election` to step down to `to` (or the best waiter).
pub(crate) async fn handover(
    shared: &Shared,
    election: &ElectionName,
    to: Option<&str>,
) -> Result<LeaderInfo> {
    let keys = shared.keys.seat_keys(election, 0, 0);
    for _ in 0..4 {
        let reads = TxnRequest {
            success: vec![op(ops::get(&keys.seat)), op(ops::all_under(&keys.range))],
            ..Default::default()
        };
        let resp = shared
            .requests
            .call("handover: read", shared.client.txn(reads))
            .await?;
        let Some(seat) = ops::read_result(&resp, 0).into_iter().next() else {
            return Err(invalid(format!(
                "handover: election {election}: nobody leads it, nothing to hand over"
            )));
        };
        let info = seat_leader(&seat.value, seat.create_revision);
        let queue = ops::read_result(&resp, 1);
        let target = match target(&keys.range, seat.lease, &queue, to) {
            Ok(t) => t,
            Err(Refusal::NobodyWaits) => {
                return Err(invalid(format!(
                    "handover: election {election}: nobody waits for it, {:?} keeps it",
                    info.id
                )))
            }
            Err(Refusal::NoSuchWaiter) => {
                return Err(invalid(format!(
                    "handover: election {election}: no candidate {:?} waits for it",
                    to.unwrap_or_default()
                )))
            }
        };
        let request = match &target {
            // The request has no lease: it stays until a grant uses it up.
            Some((key, revision)) => op(ops::put(
                &keys.handover,
                &encode_handover(key, *revision),
                0,
            )),
            None => op(ops::delete(&keys.handover)),
        };
        let txn = TxnRequest {
            compare: vec![ops::created_at(&keys.seat, seat.create_revision)],
            success: vec![request, op(ops::delete(&keys.notice))],
            failure: Vec::new(),
        };
        let resp = shared
            .requests
            .call("handover", shared.client.txn(txn))
            .await?;
        if resp.succeeded {
            return Ok(info);
        }
        // The seat changed hands between the read and the write: ask the new holder.
    }
    Err(TAG.own(
        ErrorKind::Backend,
        format!("handover: election {election}: the seat keeps changing hands"),
    ))
}

fn invalid(message: String) -> Error {
    Error::invalid(message).with_backend(crate::config::SCHEME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{encode_entry, EtcdLayout, KeySpace};
    use tenure_core::Candidate;

    fn queued(lease: i64, id: &str, priority: i32, create: i64) -> KeyValue {
        let e = ElectionName::new("e").unwrap();
        let keys = KeySpace::new("t", EtcdLayout::Tenure).seat_keys(&e, lease, priority);
        let c = Candidate::new(id).unwrap().with_priority(priority).unwrap();
        KeyValue {
            key: keys.queue.into_bytes(),
            value: encode_entry(&c),
            create_revision: create,
            ..Default::default()
        }
    }

    const RANGE: &str = "t/e/@";

    /// The queue of the holder (lease 1, key created at 3) and `waiters` (lease, id,
    /// priority, create revision).
    fn with_holder(waiters: &[(i64, &str, i32, i64)]) -> Vec<KeyValue> {
        let holder = queued(1, "holder", 0, 3);
        let waiters = waiters.iter().map(|&(l, id, p, c)| queued(l, id, p, c));
        std::iter::once(holder).chain(waiters).collect()
    }

    #[test]
    fn waiters_are_in_grant_order_without_the_holder() {
        // Key order (by lease within a bucket) is not arrival order.
        let kvs = with_holder(&[(2, "late", 0, 9), (9, "early", 0, 5), (4, "high", 5, 12)]);
        let ids: Vec<String> = waiters(RANGE, 1, &kvs)
            .iter()
            .map(|kv| decode_record(decode_entry(&kv.value).record, FencingToken(0)).id)
            .collect();
        assert_eq!(ids, ["high", "early", "late"]);
    }

    #[test]
    fn a_handover_names_the_first_waiter_with_the_id_or_is_refused() {
        let kvs = with_holder(&[(2, "c", 0, 9), (4, "b", 9, 12)]);
        let (key, create) = target(RANGE, 1, &kvs, Some("c")).unwrap().unwrap();
        assert_eq!((key.as_bytes(), create), (kvs[1].key.as_slice(), 9));
        assert_eq!(target(RANGE, 1, &kvs, None), Ok(None));
        assert_eq!(
            target(RANGE, 1, &kvs, Some("nobody")),
            Err(Refusal::NoSuchWaiter)
        );
        // The holder's own queue key is no waiter.
        assert_eq!(
            target(RANGE, 1, &kvs, Some("holder")),
            Err(Refusal::NoSuchWaiter)
        );
        assert_eq!(target(RANGE, 1, &kvs[..1], None), Err(Refusal::NobodyWaits));
    }
}
