//! The etcd requests this backend makes, built from plain values, and the readers of
//! their answers. Sans-IO, so each is tested without a server.

use crate::proto::{
    Compare, CompareTarget, DeleteRangeRequest, KeyValue, PutRequest, RangeRequest, Request,
    RequestOp, Response, ResponseHeader, ResponseOp, SortOrder, TargetUnion, TxnRequest,
    SORT_BY_CREATE,
};

/// The end of the range of every key that starts with `prefix`: the prefix with its
/// last byte below 0xff raised by one and what follows it dropped (`[0]`, "to the end
/// of the key space", when every byte is 0xff).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The first key under `range` by create revision: an election's leader.
pub(crate) fn first_by_create(range: &str) -> RangeRequest {
    RangeRequest {
        limit: 1,
        sort_order: SortOrder::Ascend as i32,
        sort_target: SORT_BY_CREATE,
        ..all_under(range)
    }
}

/// The last key under `range` created before `revision` (keys only): the one a waiter
/// with that create revision waits on.
pub(crate) fn predecessor(range: &str, revision: i64) -> RangeRequest {
    RangeRequest {
        sort_order: SortOrder::Descend as i32,
        keys_only: true,
        max_create_revision: revision - 1,
        ..first_by_create(range)
    }
}

/// The two newest keys of an election by creation, keys only: read in the transaction
/// that creates a candidate key, they are that key and the one just before it.
pub(crate) fn newest_two(range: &str) -> RangeRequest {
    RangeRequest {
        limit: 2,
        sort_order: SortOrder::Descend as i32,
        sort_target: SORT_BY_CREATE,
        keys_only: true,
        ..all_under(range)
    }
}

/// Every key under `prefix`, with values.
pub(crate) fn all_under(prefix: &str) -> RangeRequest {
    RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix.as_bytes()),
        ..Default::default()
    }
}

/// One key.
pub(crate) fn get(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// One key, without its value.
pub(crate) fn get_key_only(key: &str) -> RangeRequest {
    RangeRequest {
        keys_only: true,
        ..get(key)
    }
}

/// Up to `limit` keys from `from` (inclusive) to `end` (exclusive), in key order, read
/// at `revision` (0: the latest).
pub(crate) fn page(from: Vec<u8>, end: Vec<u8>, limit: i64, revision: i64) -> RangeRequest {
    RangeRequest {
        key: from,
        range_end: end,
        limit,
        revision,
        ..Default::default()
    }
}

/// "`key` was created at `revision`" (0: `key` does not exist).
pub(crate) fn created_at(key: &str, revision: i64) -> Compare {
    equal(
        key,
        CompareTarget::Create,
        TargetUnion::CreateRevision(revision),
    )
}

/// "`key` is attached to `lease`".
pub(crate) fn on_lease(key: &str, lease: i64) -> Compare {
    equal(key, CompareTarget::Lease, TargetUnion::Lease(lease))
}

/// "`key` was last written at `revision`".
pub(crate) fn modified_at(key: &str, revision: i64) -> Compare {
    equal(key, CompareTarget::Mod, TargetUnion::ModRevision(revision))
}

/// "`key`'s `target` equals `value`".
fn equal(key: &str, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        target: target as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(value),
    }
}

/// A put of `key` attached to `lease`.
pub(crate) fn put(key: &str, value: &[u8], lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.to_vec(),
        lease,
        ignore_value: false,
    }
}

/// A delete of one key.
pub(crate) fn delete(key: &str) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.as_bytes().to_vec(),
    }
}

/// `request` as a transaction operation.
pub(crate) fn op(request: impl Into<Request>) -> RequestOp {
    RequestOp {
        request: Some(request.into()),
    }
}

impl From<RangeRequest> for Request {
    fn from(r: RangeRequest) -> Self {
        Request::Range(r)
    }
}

impl From<PutRequest> for Request {
    fn from(r: PutRequest) -> Self {
        Request::Put(r)
    }
}

impl From<DeleteRangeRequest> for Request {
    fn from(r: DeleteRangeRequest) -> Self {
        Request::DeleteRange(r)
    }
}

/// Delete `key` only if it was created at `revision`.
pub(crate) fn delete_if_created_at(key: &str, revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![op(delete(key))],
        failure: Vec::new(),
    }
}

/// The store revision an answer was read at (0 when the header is missing).
pub(crate) fn revision(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

/// The keys of the `n`th range answer among `responses` (a transaction's answers).
pub(crate) fn read_in(responses: &[ResponseOp], n: usize) -> Vec<KeyValue> {
    responses
        .iter()
        .filter_map(|r| match &r.response {
            Some(Response::Range(range)) => Some(range.kvs.clone()),
            _ => None,
        })
        .nth(n)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{RangeResponse, ResponseOp, TxnResponse};

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"p/a/@"), b"p/a/A");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
        assert_eq!(prefix_end(b""), [0]);
        let end = prefix_end(b"p/@members/ns/@");
        assert!(b"p/@members/ns/@zzzz".as_slice() < end.as_slice());
        assert!(b"p/@members/ns/b/@x".as_slice() > end.as_slice());
    }

    #[test]
    fn ranges_cover_the_prefix_and_sort_by_creation() {
        let first = first_by_create("p/e/@");
        assert_eq!(first.range_end, b"p/e/A");
        assert_eq!(
            (first.limit, first.sort_order, first.sort_target),
            (1, 1, 2)
        );
        let before = predecessor("p/e/@", 10);
        assert_eq!(before.max_create_revision, 9);
        assert_eq!(before.sort_order, SortOrder::Descend as i32);
        assert!(before.keys_only);
        assert!(get_key_only("k").keys_only && get_key_only("k").range_end.is_empty());
    }

    #[test]
    fn reads_are_picked_from_transaction_answers() {
        let kv = |rev| KeyValue {
            create_revision: rev,
            ..Default::default()
        };
        let resp = TxnResponse {
            header: Some(ResponseHeader { revision: 7 }),
            succeeded: true,
            responses: vec![
                ResponseOp {
                    response: Some(Response::Put(Default::default())),
                },
                ResponseOp {
                    response: Some(Response::Range(RangeResponse {
                        kvs: vec![kv(3)],
                        ..Default::default()
                    })),
                },
                ResponseOp {
                    response: Some(Response::Range(RangeResponse {
                        kvs: vec![kv(4)],
                        ..Default::default()
                    })),
                },
            ],
        };
        assert_eq!(read_in(&resp.responses, 0), vec![kv(3)]);
        assert_eq!(read_in(&resp.responses, 1), vec![kv(4)]);
        assert!(read_in(&resp.responses, 2).is_empty());
        assert_eq!(revision(&resp.header), 7);
        assert_eq!(revision(&None), 0);
    }

    #[test]
    fn compares_name_their_targets() {
        assert_eq!(created_at("k", 3).target, CompareTarget::Create as i32);
        let m = modified_at("k", 4);
        assert_eq!(
            (m.target, m.target_union),
            (CompareTarget::Mod as i32, Some(TargetUnion::ModRevision(4)))
        );
    }

    #[test]
    fn guarded_delete() {
        let txn = delete_if_created_at("k", 5);
        assert_eq!(txn.compare, vec![created_at("k", 5)]);
        assert_eq!(txn.success, vec![op(delete("k"))]);
        assert!(txn.failure.is_empty());
    }
}
