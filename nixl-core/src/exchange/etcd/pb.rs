//! The part of etcd's v3 gRPC API the exchange uses, as prost messages written out by hand.
//!
//! Field numbers and types are those of etcd's `etcdserverpb/rpc.proto` and `mvccpb/kv.proto`
//! (stable since etcd 3.0; fields this crate never reads or sets are left out, and protobuf
//! skips unknown fields when decoding). Writing them here instead of running `protoc` from a
//! build script means a crate enabling the `etcd` feature builds with no protobuf compiler
//! and no well-known-type headers installed.
//!
//! Messages are only built and read by `super::client`; fields are public for that reason.

#![allow(missing_docs)]

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `mvccpb.Event.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    Put = 0,
    Delete = 1,
}

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Event {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

/// `etcdserverpb.RangeRequest` (sorting and revision filters left out).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(bool, tag = "7")]
    pub serializable: bool,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
    #[prost(bool, tag = "9")]
    pub count_only: bool,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

/// `etcdserverpb.PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

/// `etcdserverpb.PutResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.DeleteRangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `etcdserverpb.RequestOp` (nested transactions left out).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RequestOp {
    #[prost(oneof = "request_op::Request", tags = "1, 2, 3")]
    pub request: Option<request_op::Request>,
}

/// Nested types of [`RequestOp`].
pub(super) mod request_op {
    /// `etcdserverpb.RequestOp.request`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Request {
        #[prost(message, tag = "1")]
        Range(super::RangeRequest),
        #[prost(message, tag = "2")]
        Put(super::PutRequest),
        #[prost(message, tag = "3")]
        DeleteRange(super::DeleteRangeRequest),
    }
}

/// `etcdserverpb.ResponseOp` (nested transactions left out).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ResponseOp {
    #[prost(oneof = "response_op::Response", tags = "1, 2, 3")]
    pub response: Option<response_op::Response>,
}

/// Nested types of [`ResponseOp`].
pub(super) mod response_op {
    /// `etcdserverpb.ResponseOp.response`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Response {
        #[prost(message, tag = "1")]
        Range(super::RangeResponse),
        #[prost(message, tag = "2")]
        Put(super::PutResponse),
        #[prost(message, tag = "3")]
        DeleteRange(super::DeleteRangeResponse),
    }
}

/// `etcdserverpb.TxnRequest` (without comparisons: every transaction here succeeds).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct TxnRequest {
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.WatchCreateRequest` (filters, prev_kv and fragmenting left out).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
}

/// `etcdserverpb.WatchRequest` (cancel and progress requests left out: a watch ends when its
/// stream is dropped).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct WatchRequest {
    #[prost(oneof = "watch_request::RequestUnion", tags = "1")]
    pub request_union: Option<watch_request::RequestUnion>,
}

/// Nested types of [`WatchRequest`].
pub(super) mod watch_request {
    /// `etcdserverpb.WatchRequest.request_union`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum RequestUnion {
        #[prost(message, tag = "1")]
        CreateRequest(super::WatchCreateRequest),
    }
}

/// `etcdserverpb.WatchResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct WatchResponse {
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
pub(super) struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `etcdserverpb.LeaseGrantResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseGrantResponse {
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
pub(super) struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseRevokeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes of etcd's own encoding (field numbers and wire types as in rpc.proto): a
    /// RangeResponse with a header at revision 7 and one key `k` = `v` modified at 5.
    #[test]
    fn decodes_etcd_encoding() {
        let bytes = [
            0x0a, 0x02, 0x18, 0x07, // header { revision: 7 }
            0x12, 0x08, 0x0a, 0x01, b'k', 0x18, 0x05, 0x2a, 0x01, b'v', // kvs
            0x18, 0x01, // more: true
            0x20, 0x01, // count: 1
        ];
        let r = RangeResponse::decode(&bytes[..]).unwrap();
        assert_eq!(r.header.unwrap().revision, 7);
        assert_eq!(r.kvs[0].key, b"k");
        assert_eq!(r.kvs[0].mod_revision, 5);
        assert_eq!(r.kvs[0].value, b"v");
        assert!(r.more);
        assert_eq!(r.count, 1);
    }

    #[test]
    fn encodes_field_numbers_of_rpc_proto() {
        let put = PutRequest {
            key: b"a".to_vec(),
            value: b"b".to_vec(),
            lease: 3,
        };
        assert_eq!(
            put.encode_to_vec(),
            [0x0a, 0x01, b'a', 0x12, 0x01, b'b', 0x18, 0x03]
        );
        let w = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: b"k".to_vec(),
                    start_revision: 2,
                    progress_notify: true,
                    ..Default::default()
                },
            )),
        };
        assert_eq!(
            w.encode_to_vec(),
            [0x0a, 0x07, 0x0a, 0x01, b'k', 0x18, 0x02, 0x20, 0x01]
        );
    }
}
