//! The messages of etcd's v3 API that Pinion sends and reads, as protobuf
//! structs (field numbers from etcd's `api/etcdserverpb/rpc.proto` and
//! `api/mvccpb/kv.proto`). Written out here with prost's derive rather than
//! generated at build time: the generator needs `protoc` on the build host
//! and a dozen crates of its own, for the few messages below. Fields Pinion
//! never sets are left out; prost skips fields it does not know when it
//! decodes, as every protobuf reader does, so etcd may send more.

/// `etcdserverpb.ResponseHeader`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    /// The key-value store's revision when the request was applied.
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// `mvccpb.KeyValue`
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
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
    /// The lease the key is bound to (0: none).
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `mvccpb.Event.EventType`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    Put = 0,
    Delete = 1,
}

/// `mvccpb.Event`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

/// `etcdserverpb.RangeRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: the one key; otherwise every key in `[key, range_end)`.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// Most keys answered (0: no limit).
    #[prost(int64, tag = "3")]
    pub limit: i64,
    /// Read as of this revision (0: the newest).
    #[prost(int64, tag = "4")]
    pub revision: i64,
}

/// `etcdserverpb.RangeResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    /// More keys are in the range than `limit` let through.
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

/// `etcdserverpb.PutRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

/// `etcdserverpb.PutResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.DeleteRangeRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `etcdserverpb.RequestOp`: one operation of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

/// `etcdserverpb.RequestOp.request`
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

/// `etcdserverpb.ResponseOp`: one operation's answer, in the order sent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3")]
    pub response: Option<Response>,
}

/// `etcdserverpb.ResponseOp.response`
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeResponse),
}

/// `etcdserverpb.Compare.CompareResult`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CompareResult {
    Equal = 0,
    Greater = 1,
    Less = 2,
    NotEqual = 3,
}

/// `etcdserverpb.Compare.CompareTarget`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Value = 3,
    Lease = 4,
}

/// `etcdserverpb.Compare`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    #[prost(enumeration = "CompareResult", tag = "1")]
    pub result: i32,
    #[prost(enumeration = "CompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7, 8")]
    pub target_union: Option<TargetUnion>,
}

/// `etcdserverpb.Compare.target_union`
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes = "vec", tag = "7")]
    Value(Vec<u8>),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

/// `etcdserverpb.TxnRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.CompactionRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactionRequest {
    #[prost(int64, tag = "1")]
    pub revision: i64,
    /// Answer only once the compaction is applied to the backend.
    #[prost(bool, tag = "2")]
    pub physical: bool,
}

/// `etcdserverpb.CompactionResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactionResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.WatchRequest` (only its `create_request`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(message, optional, tag = "1")]
    pub create_request: Option<WatchCreateRequest>,
}

/// `etcdserverpb.WatchCreateRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    /// etcd sends an empty response now and then when nothing changed, so
    /// that a quiet watch still learns the revision.
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
}

/// `etcdserverpb.WatchResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    /// Set when the watch was cancelled because its start revision is compacted.
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `etcdserverpb.LeaseGrantRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    /// 0: etcd chooses.
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `etcdserverpb.LeaseGrantResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// `etcdserverpb.LeaseRevokeRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseRevokeResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.LeaseKeepAliveRequest`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// The lease's time to live from now, in seconds; 0: the lease is gone.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}
