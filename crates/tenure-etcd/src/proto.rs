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

/// `RangeRequest.SortOrder`. An enumeration's first variant is the default prost
/// leaves unencoded, so each keeps its 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum SortOrder {
    None = 0,
    Ascend = 1,
    Descend = 2,
}

/// `RangeRequest.SortTarget`: the only one used is `CREATE` (`KEY` is 0).
pub(crate) const SORT_BY_CREATE: i32 = 2;

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
    #[prost(int32, tag = "6")]
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

/// `etcdserverpb.PutResponse` (nothing of it is read).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PutResponse {}

/// `etcdserverpb.DeleteRangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse` (nothing of it is read).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeleteRangeResponse {}

/// `etcdserverpb.Compare.CompareTarget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum CompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Lease = 4,
}

/// `etcdserverpb.Compare.target_union`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum TargetUnion {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

/// `etcdserverpb.Compare`, without its `result` (field 1): every compare here is
/// `EQUAL`, which is 0, the default.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Compare {
    #[prost(enumeration = "CompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "5, 6, 8")]
    pub target_union: Option<TargetUnion>,
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

/// `etcdserverpb.WatchCreateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
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

/// `etcdserverpb.LeaseGrantRequest` (its `ID`, field 2, left 0: etcd picks it).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

/// `etcdserverpb.LeaseGrantResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseGrantResponse {
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

/// `etcdserverpb.LeaseRevokeResponse` (nothing of it is read).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseRevokeResponse {}

/// `etcdserverpb.LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeaseKeepAliveResponse {
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
    #[prost(string, tag = "2")]
    pub token: String,
}

/// A unary call of etcd's API: its request, its answer and its gRPC method path.
pub(crate) trait Unary: prost::Message + Clone + Send + Sync + 'static {
    type Answer: prost::Message + Default + Send + Sync + 'static;
    const PATH: &'static str;
}

macro_rules! unary {
    ($($request:ty => $answer:ty, $path:literal;)*) => {$(
        impl Unary for $request {
            type Answer = $answer;
            const PATH: &'static str = $path;
        }
    )*};
}

unary! {
    RangeRequest => RangeResponse, "/etcdserverpb.KV/Range";
    DeleteRangeRequest => DeleteRangeResponse, "/etcdserverpb.KV/DeleteRange";
    TxnRequest => TxnResponse, "/etcdserverpb.KV/Txn";
    LeaseGrantRequest => LeaseGrantResponse, "/etcdserverpb.Lease/LeaseGrant";
    LeaseRevokeRequest => LeaseRevokeResponse, "/etcdserverpb.Lease/LeaseRevoke";
    AuthenticateRequest => AuthenticateResponse, "/etcdserverpb.Auth/Authenticate";
}

/// The gRPC method paths of the two streams.
pub(crate) const WATCH: &str = "/etcdserverpb.Watch/Watch";
pub(crate) const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";

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
            sort_target: SORT_BY_CREATE,
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
        // The header's member id (field 2) is skipped.
        assert_eq!(decoded.header, Some(ResponseHeader { revision: 8 }));
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
                target: CompareTarget::Lease as i32,
                key: b"k".to_vec(),
                target_union: Some(TargetUnion::Lease(2)),
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
                })),
            }],
        };
        let expected = [
            0x0a, 7, // 1: compare
            0x10, 4, 0x1a, 1, b'k', 0x40, 2, // (EQUAL), LEASE, key, 8: lease
            0x12, 10, // 2: success
            0x12, 8, 0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 3, // 2: put {key, value, lease}
            0x1a, 5, // 3: failure
            0x1a, 3, 0x0a, 1, b'k', // 3: delete_range {key}
        ];
        assert_eq!(txn.encode_to_vec(), expected);
        let create = Compare {
            target: CompareTarget::Create as i32,
            key: Vec::new(),
            target_union: Some(TargetUnion::CreateRevision(1)),
        };
        assert_eq!(create.encode_to_vec(), [0x10, 1, 0x28, 1]);
        // On a mod revision (6).
        let modified = Compare {
            target: CompareTarget::Mod as i32,
            key: b"a".to_vec(),
            target_union: Some(TargetUnion::ModRevision(3)),
        };
        assert_eq!(modified.encode_to_vec(), [0x10, 2, 0x1a, 1, b'a', 0x30, 3]);

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
            Some(Response::DeleteRange(_))
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
                watch_id: 3,
            })),
        };
        let expected = [
            0x0a, 10, // 1: create_request
            0x0a, 1, b'k', 0x12, 1, b'l', // key, range_end
            0x18, 2, // 3: start_revision
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
        let grant = LeaseGrantRequest { ttl: 5 };
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
        // An answer's fields not kept are skipped.
        let put = PutResponse::decode([0x0a, 2, 0x18, 9].as_slice()).unwrap();
        assert_eq!(put, PutResponse {});
        let range = RangeResponse::decode([0x18, 1].as_slice()).unwrap();
        assert!(range.more);
    }
}
