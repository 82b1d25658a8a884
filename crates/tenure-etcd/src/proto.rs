//! The part of etcd's v3 gRPC API this backend speaks, as protobuf messages.
//!
//! Written by hand instead of generated from etcd's `.proto` files, so that building
//! this crate needs no `protoc` (see the README, "Why no protoc"). Each message keeps
//! only the fields the backend reads or writes, with the field numbers and types of
//! etcd's `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto`; protobuf skips the
//! fields a reader does not know, so answers from newer servers decode the same way.
//! The tests at the bottom pin every field number against hand-encoded bytes.

#![allow(missing_docs)]

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResponseHeader {
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `mvccpb.Event.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum EventType {
    Put = 0,
    Delete = 1,
}

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Event {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

/// `RangeRequest.SortOrder`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum SortOrder {
    None = 0,
    Ascend = 1,
    Descend = 2,
}

/// `RangeRequest.SortTarget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum SortTarget {
    Key = 0,
    Version = 1,
    Create = 2,
    Mod = 3,
    Value = 4,
}

/// `etcdserverpb.RangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(enumeration = "SortOrder", tag = "5")]
    pub sort_order: i32,
    #[prost(enumeration = "SortTarget", tag = "6")]
    pub sort_target: i32,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
    #[prost(int64, tag = "13")]
    pub max_create_revision: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
}

/// `etcdserverpb.PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
    /// Keep the key's value (the key must exist): a put that only moves its revision.
    #[prost(bool, tag = "5")]
    pub ignore_value: bool,
}

/// `etcdserverpb.PutResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.DeleteRangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `etcdserverpb.Compare.CompareResult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum CompareResult {
    Equal = 0,
    Greater = 1,
    Less = 2,
    NotEqual = 3,
}

/// `etcdserverpb.Compare.CompareTarget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum CompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Value = 3,
    Lease = 4,
}

/// `etcdserverpb.Compare.target_union`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum TargetUnion {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes, tag = "7")]
    Value(Vec<u8>),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

/// `etcdserverpb.Compare`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Compare {
    #[prost(enumeration = "CompareResult", tag = "1")]
    pub result: i32,
    #[prost(enumeration = "CompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "5, 6, 7, 8")]
    pub target_union: Option<TargetUnion>,
    /// With a range end (etcd 3.3+), the compare holds for every key in
    /// `[key, range_end)`; over no key at all, it compares a missing key (revisions 0).
    #[prost(bytes = "vec", tag = "64")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.RequestOp.request`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
    /// A nested transaction (etcd 3.3+): its own compares and branches.
    #[prost(message, tag = "4")]
    Txn(TxnRequest),
}

/// `etcdserverpb.RequestOp`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3, 4")]
    pub request: Option<Request>,
}

/// `etcdserverpb.ResponseOp.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeResponse),
    #[prost(message, tag = "4")]
    Txn(TxnResponse),
}

/// `etcdserverpb.ResponseOp`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3, 4")]
    pub response: Option<Response>,
}

/// `etcdserverpb.TxnRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.WatchCreateRequest.FilterType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum FilterType {
    NoPut = 0,
    NoDelete = 1,
}

/// `etcdserverpb.WatchCreateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    #[prost(enumeration = "FilterType", repeated, tag = "5")]
    pub filters: Vec<i32>,
    #[prost(int64, tag = "7")]
    pub watch_id: i64,
}

/// `etcdserverpb.WatchCancelRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchCancelRequest {
    #[prost(int64, tag = "1")]
    pub watch_id: i64,
}

/// `etcdserverpb.WatchRequest.request_union`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum WatchRequestUnion {
    #[prost(message, tag = "1")]
    Create(WatchCreateRequest),
    #[prost(message, tag = "2")]
    Cancel(WatchCancelRequest),
}

/// `etcdserverpb.WatchRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchRequest {
    #[prost(oneof = "WatchRequestUnion", tags = "1, 2")]
    pub request_union: Option<WatchRequestUnion>,
}

/// `etcdserverpb.WatchResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `etcdserverpb.LeaseGrantRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `etcdserverpb.LeaseGrantResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// `etcdserverpb.LeaseRevokeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseRevokeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `etcdserverpb.AuthenticateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `etcdserverpb.AuthenticateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AuthenticateResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub token: String,
}

/// The gRPC method paths of the calls above.
pub(crate) mod path {
    pub(crate) const RANGE: &str = "/etcdserverpb.KV/Range";
    pub(crate) const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
    pub(crate) const TXN: &str = "/etcdserverpb.KV/Txn";
    pub(crate) const WATCH: &str = "/etcdserverpb.Watch/Watch";
    pub(crate) const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub(crate) const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub(crate) const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    pub(crate) const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

#[cfg(test)]
mod tests {
    //! Each field's number and wire type, checked against bytes written by hand from
    //! the protobuf encoding rules (tag = field number << 3 | wire type; 0 = varint,
    //! 2 = length-delimited).
    use super::*;
    use prost::Message;

    #[test]
    fn range_request_fields() {
        let req = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            limit: 1,
            revision: 2,
            sort_order: SortOrder::Descend as i32,
            sort_target: SortTarget::Create as i32,
            keys_only: true,
            max_create_revision: 3,
        };
        let expected = [
            0x0a, 1, b'k', // 1: key
            0x12, 1, b'l', // 2: range_end
            0x18, 1, // 3: limit
            0x20, 2, // 4: revision
            0x28, 2, // 5: sort_order DESCEND
            0x30, 2, // 6: sort_target CREATE
            0x40, 1, // 8: keys_only
            0x68, 3, // 13: max_create_revision
        ];
        assert_eq!(req.encode_to_vec(), expected);
    }

    #[test]
    fn key_value_and_events_decode() {
        let kv = [
            0x0a, 1, b'k', // 1: key
            0x10, 5, // 2: create_revision
            0x18, 6, // 3: mod_revision
            0x20, 1, // 4: version (not kept)
            0x2a, 1, b'v', // 5: value
            0x30, 7, // 6: lease
        ];
        let mut event = vec![0x08, 1, 0x12, kv.len() as u8]; // 1: DELETE, 2: kv
        event.extend_from_slice(&kv);
        let mut watch = vec![
            0x0a,
            4,
            0x10,
            9,
            0x18,
            8, // 1: header {member_id 9, revision 8}
            0x10,
            4, // 2: watch_id
            0x18,
            1, // 3: created
            0x20,
            1, // 4: canceled
            0x28,
            3, // 5: compact_revision
            0x32,
            1,
            b'x', // 6: cancel_reason
            0x5a,
            event.len() as u8, // 11: events
        ];
        watch.extend_from_slice(&event);
        let decoded = WatchResponse::decode(watch.as_slice()).unwrap();
        assert_eq!(
            decoded.header,
            Some(ResponseHeader {
                member_id: 9,
                revision: 8
            })
        );
        assert_eq!(
            (decoded.watch_id, decoded.created, decoded.canceled),
            (4, true, true)
        );
        assert_eq!(
            (decoded.compact_revision, decoded.cancel_reason.as_str()),
            (3, "x")
        );
        let event = &decoded.events[0];
        assert_eq!(event.r#type, EventType::Delete as i32);
        assert_eq!(
            event.kv,
            Some(KeyValue {
                key: b"k".to_vec(),
                create_revision: 5,
                mod_revision: 6,
                value: b"v".to_vec(),
                lease: 7,
            })
        );
    }

    #[test]
    fn txn_fields() {
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::NotEqual as i32,
                target: CompareTarget::Lease as i32,
                key: b"k".to_vec(),
                target_union: Some(TargetUnion::Lease(2)),
                range_end: Vec::new(),
            }],
            success: vec![RequestOp {
                request: Some(Request::Put(PutRequest {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: 3,
                    ignore_value: false,
                })),
            }],
            failure: vec![RequestOp {
                request: Some(Request::DeleteRange(DeleteRangeRequest {
                    key: b"k".to_vec(),
                    range_end: Vec::new(),
                })),
            }],
        };
        let expected = [
            0x0a, 9, // 1: compare
            0x08, 3, 0x10, 4, 0x1a, 1, b'k', 0x40, 2, // NOT_EQUAL, LEASE, key, 8: lease
            0x12, 10, // 2: success
            0x12, 8, 0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 3, // 2: put {key, value, lease}
            0x1a, 5, // 3: failure
            0x1a, 3, 0x0a, 1, b'k', // 3: delete_range {key}
        ];
        assert_eq!(txn.encode_to_vec(), expected);
        let create = Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: Vec::new(),
            target_union: Some(TargetUnion::CreateRevision(1)),
            range_end: Vec::new(),
        };
        assert_eq!(create.encode_to_vec(), [0x10, 1, 0x28, 1]);
        // A compare over a range (field 64, a two-byte tag) and on a mod revision (6).
        let range = Compare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Mod as i32,
            key: b"a".to_vec(),
            target_union: Some(TargetUnion::ModRevision(3)),
            range_end: b"b".to_vec(),
        };
        assert_eq!(
            range.encode_to_vec(),
            [0x08, 1, 0x10, 2, 0x1a, 1, b'a', 0x30, 3, 0x82, 0x04, 1, b'b']
        );

        let answer = [
            0x0a, 2, 0x18, 4, // 1: header {revision 4}
            0x10, 1, // 2: succeeded
            0x1a, 6, 0x0a, 4, 0x12, 2, 0x10, 5, // 3: range {kvs [{create_revision 5}]}
            0x1a, 4, 0x1a, 2, 0x10, 1, // 3: delete_range {deleted 1}
            0x1a, 2, 0x12, 0, // 3: put {}
        ];
        let decoded = TxnResponse::decode(answer.as_slice()).unwrap();
        assert!(decoded.succeeded);
        assert_eq!(decoded.header.map(|h| h.revision), Some(4));
        assert!(matches!(
            &decoded.responses[0].response,
            Some(Response::Range(r)) if r.kvs[0].create_revision == 5
        ));
        assert!(matches!(
            &decoded.responses[1].response,
            Some(Response::DeleteRange(d)) if d.deleted == 1
        ));
        assert!(matches!(
            &decoded.responses[2].response,
            Some(Response::Put(_))
        ));
    }

    #[test]
    fn watch_requests() {
        let create = WatchRequest {
            request_union: Some(WatchRequestUnion::Create(WatchCreateRequest {
                key: b"k".to_vec(),
                range_end: b"l".to_vec(),
                start_revision: 2,
                filters: vec![FilterType::NoPut as i32],
                watch_id: 3,
            })),
        };
        let expected = [
            0x0a, 13, // 1: create_request
            0x0a, 1, b'k', 0x12, 1, b'l', // key, range_end
            0x18, 2, // 3: start_revision
            0x2a, 1, 0, // 5: filters, packed [NOPUT]
            0x38, 3, // 7: watch_id
        ];
        assert_eq!(create.encode_to_vec(), expected);
        let cancel = WatchRequest {
            request_union: Some(WatchRequestUnion::Cancel(WatchCancelRequest {
                watch_id: 3,
            })),
        };
        assert_eq!(cancel.encode_to_vec(), [0x12, 2, 0x08, 3]);
    }

    #[test]
    fn lease_and_auth_fields() {
        let grant = LeaseGrantRequest { ttl: 5, id: 0 };
        assert_eq!(grant.encode_to_vec(), [0x08, 5]);
        let granted = LeaseGrantResponse::decode(
            [0x10, 7, 0x18, 5, 0x22, 1, b'e'].as_slice(), // id, ttl, error
        )
        .unwrap();
        assert_eq!(
            (granted.id, granted.ttl, granted.error.as_str()),
            (7, 5, "e")
        );
        assert_eq!(LeaseRevokeRequest { id: 7 }.encode_to_vec(), [0x08, 7]);
        assert_eq!(LeaseKeepAliveRequest { id: 7 }.encode_to_vec(), [0x08, 7]);
        let kept = LeaseKeepAliveResponse::decode([0x10, 7, 0x18, 4].as_slice()).unwrap();
        assert_eq!((kept.id, kept.ttl), (7, 4));
        let auth = AuthenticateRequest {
            name: "u".into(),
            password: "p".into(),
        };
        assert_eq!(auth.encode_to_vec(), [0x0a, 1, b'u', 0x12, 1, b'p']);
        let token = AuthenticateResponse::decode([0x12, 1, b't'].as_slice()).unwrap();
        assert_eq!(token.token, "t");
        let put = PutResponse::decode([0x0a, 2, 0x18, 9].as_slice()).unwrap();
        assert_eq!(put.header.map(|h| h.revision), Some(9));
        let range = RangeResponse::decode([0x18, 1].as_slice()).unwrap();
        assert!(range.more);
    }
}
