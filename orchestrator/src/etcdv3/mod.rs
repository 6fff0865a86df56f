//! A client for etcd's v3 API: the calls the store, the election, the
//! shared identity and the compaction make (range, put, transactions,
//! compaction, leases, watches), as gRPC over HTTP/2 on the hyper and
//! rustls the server already carries.
//!
//! It replaces the `etcd-client` crate, which built the same calls through
//! tonic with its HTTP server and router (axum), generated its protobuf
//! code at build time (`protoc` on the build host) and cost about 45 s of
//! a 2-core build (BENCHMARKS.md "Build time"). Its connection is one
//! HTTP/2 connection to one member at a time, every call multiplexed on it;
//! a call that finds it broken, or a member without a quorum, moves the
//! client to the next endpoint, and the caller's retry (the store's, the
//! election's) goes there.

mod grpc;
pub mod proto;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::sync::{mpsc, Mutex};

use grpc::{frame, Messages, Outgoing};
pub use proto::{
    Compare, CompareResult, EventType, KeyValue, LeaseKeepAliveResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchResponse,
};
use proto::{CompareTarget, TargetUnion};

/// What a call to etcd ended with, when not an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// etcd refused or failed the call: its gRPC status.
    #[error("etcd answered {} ({code}): {message}", code_name(*code))]
    Status { code: i32, message: String },
    /// No connection, or it broke during the call: the outcome is unknown.
    #[error("{0}")]
    Transport(String),
    /// An answer that is not etcd's API.
    #[error("{0}")]
    Protocol(String),
}

impl Error {
    /// The gRPC status code, when etcd gave one.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// gRPC's name for a status code.
fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code).ok().and_then(|c| NAMES.get(c)).copied().unwrap_or("status")
}

/// gRPC's UNAVAILABLE: etcd's "no leader", or a member shutting down.
const UNAVAILABLE: i32 = 14;

/// Bound on one connection attempt (TCP, TLS, HTTP/2's preface).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on an idle connection: a member that died without closing
/// it (its host gone, a cut cable) is found within about twice this.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// Most bytes of an answer's headers or trailers.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

/// One etcd member's client URL, taken apart.
#[derive(Debug, Clone)]
struct Endpoint {
    url: String,
    /// `host:port`, for the TCP connection and the `:authority`.
    authority: String,
    host: String,
    https: bool,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, String> {
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| format!("{url:?} has no scheme (http:// or https://)"))?;
        let https = match scheme {
            "https" => true,
            "http" => false,
            _ => return Err(format!("{url:?}: the scheme must be http or https")),
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("{url:?}: give scheme://host:port, no path"));
        }
        let host = match authority.rsplit_once(':') {
            Some((h, port)) if !h.is_empty() && port.parse::<u16>().is_ok() => h,
            _ => return Err(format!("{url:?}: no port")),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        Ok(Endpoint { url: url.to_string(), authority: authority.to_string(), host, https })
    }
}

/// A connection in use, and which endpoint it reaches.
#[derive(Clone)]
struct Conn {
    id: u64,
    endpoint: usize,
    send: SendRequest<Outgoing>,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    tls: Option<tokio_rustls::TlsConnector>,
    conn: Mutex<Option<Conn>>,
    /// The endpoint the next connection tries first.
    next: AtomicUsize,
    ids: AtomicU64,
}

/// A handle on etcd; clones share one connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.inner.endpoints.iter().map(|e| e.url.as_str()).collect();
        f.debug_struct("Client").field("endpoints", &urls).finish()
    }
}

impl Client {
    /// A client of `endpoints` (tried in turn), connected to the first that
    /// answers. `tls` is needed for https endpoints; ALPN `h2` is set here.
    pub async fn connect(endpoints: &[String], tls: Option<rustls::ClientConfig>) -> Result<Client, Error> {
        let parsed = endpoints
            .iter()
            .map(|e| Endpoint::parse(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Protocol(format!("endpoints: {e}")))?;
        if parsed.is_empty() {
            return Err(Error::Protocol("endpoints: at least one etcd endpoint is needed".into()));
        }
        if parsed.iter().any(|e| e.https) && tls.is_none() {
            return Err(Error::Protocol("an https endpoint needs a TLS configuration".into()));
        }
        let tls = tls.map(|mut config| {
            config.alpn_protocols = vec![b"h2".to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(config))
        });
        let client = Client {
            inner: Arc::new(Inner {
                endpoints: parsed,
                tls,
                conn: Mutex::new(None),
                next: AtomicUsize::new(0),
                ids: AtomicU64::new(0),
            }),
        };
        client.connection().await?;
        Ok(client)
    }

    /// The live connection, or a new one to the first endpoint that answers,
    /// from the one after the last that failed.
    async fn connection(&self) -> Result<Conn, Error> {
        let inner = &self.inner;
        let mut slot = inner.conn.lock().await;
        let n = inner.endpoints.len();
        if let Some(c) = slot.take() {
            if !c.send.is_closed() {
                return Ok(slot.insert(c).clone());
            }
            // Closed under us (HTTP/2's keepalive found the member silent,
            // or it hung up), not by a failed call: start from the next one
            // too, rather than dialling a member that just went quiet.
            inner.next.store((c.endpoint + 1) % n, Ordering::Relaxed);
        }
        let first = inner.next.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..n {
            let endpoint = (first + i) % n;
            let e = &inner.endpoints[endpoint];
            match tokio::time::timeout(CONNECT_TIMEOUT, self.dial(e)).await {
                Ok(Ok(send)) => {
                    let c = Conn { id: inner.ids.fetch_add(1, Ordering::Relaxed), endpoint, send };
                    inner.next.store(endpoint, Ordering::Relaxed);
                    *slot = Some(c.clone());
                    return Ok(c);
                }
                Ok(Err(why)) => failures.push(format!("{}: {why}", e.url)),
                Err(_) => failures.push(format!("{}: no connection within {CONNECT_TIMEOUT:?}", e.url)),
            }
        }
        Err(Error::Transport(format!("no etcd endpoint could be reached ({})", failures.join("; "))))
    }

    async fn dial(&self, e: &Endpoint) -> Result<SendRequest<Outgoing>, String> {
        let tcp = tokio::net::TcpStream::connect(&e.authority).await.map_err(|err| err.to_string())?;
        let _ = tcp.set_nodelay(true);
        let builder = {
            let mut b = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
            b.timer(TokioTimer::new())
                .keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(KEEPALIVE)
                .keep_alive_while_idle(true)
                .max_header_list_size(MAX_HEADER_LIST_BYTES);
            b
        };
        let handshake = |e: hyper::Error| format!("HTTP/2: {e}");
        if e.https {
            let Some(tls) = &self.inner.tls else { return Err("https without a TLS configuration".into()) };
            let name =
                ServerName::try_from(e.host.clone()).map_err(|err| format!("server name {:?}: {err}", e.host))?;
            let stream = tls.connect(name, tcp).await.map_err(|err| format!("TLS: {err}"))?;
            let (send, conn) = builder.handshake(TokioIo::new(stream)).await.map_err(handshake)?;
            tokio::spawn(conn);
            Ok(send)
        } else {
            let (send, conn) = builder.handshake(TokioIo::new(tcp)).await.map_err(handshake)?;
            tokio::spawn(conn);
            Ok(send)
        }
    }

    /// After `c` failed a call: the next call connects afresh, to the next endpoint.
    async fn broken(&self, c: &Conn) {
        let mut slot = self.inner.conn.lock().await;
        if slot.as_ref().is_some_and(|s| s.id == c.id) {
            *slot = None;
            self.inner.next.store((c.endpoint + 1) % self.inner.endpoints.len(), Ordering::Relaxed);
        }
    }

    /// Starts a call on the connection: its answer's messages once etcd sent
    /// its headers.
    async fn start(&self, path: &'static str, body: Outgoing) -> Result<(Conn, Messages), Error> {
        let mut c = self.connection().await?;
        let e = &self.inner.endpoints[c.endpoint];
        let scheme = if e.https { "https" } else { "http" };
        let request = hyper::Request::post(format!("{scheme}://{}{path}", e.authority))
            .header(hyper::header::CONTENT_TYPE, "application/grpc")
            .header(hyper::header::TE, "trailers")
            // etcd's "require leader": a member cut off from its quorum
            // answers UNAVAILABLE ("no leader") at once, and ends the
            // streams it serves, rather than holding them until the
            // caller's bound; `judge` then moves the client on.
            .header("hasleader", "true")
            .body(body)
            .map_err(|err| Error::Protocol(format!("{path}: {err}")))?;
        let answer = async {
            c.send.ready().await?;
            c.send.send_request(request).await
        };
        match answer.await {
            Ok(response) => match Messages::new(response) {
                Ok(m) => Ok((c, m)),
                Err(err) => Err(self.judge(&c, err).await),
            },
            Err(err) => {
                self.broken(&c).await;
                Err(Error::Transport(format!("{}: {err}", e.url)))
            }
        }
    }

    /// `err` from a call on `c`, noting a connection that should be left.
    async fn judge(&self, c: &Conn, err: Error) -> Error {
        if matches!(err, Error::Transport(_)) || err.code() == Some(UNAVAILABLE) {
            self.broken(c).await;
        }
        err
    }

    async fn unary<M: prost::Message + Default>(
        &self,
        path: &'static str,
        request: &impl prost::Message,
    ) -> Result<M, Error> {
        let (c, mut messages) = self.start(path, Outgoing::Once(Some(frame(request)))).await?;
        let read = async {
            let answer = messages.next::<M>().await?.ok_or_else(|| Error::Protocol(format!("{path}: no answer")))?;
            match messages.next::<M>().await? {
                None => Ok(answer),
                Some(_) => Err(Error::Protocol(format!("{path}: more than one answer"))),
            }
        };
        match read.await {
            Ok(m) => Ok(m),
            Err(err) => Err(self.judge(&c, err).await),
        }
    }

    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Error> {
        self.unary("/etcdserverpb.KV/Range", &request).await
    }

    /// The one key (its newest revision).
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        self.range(RangeRequest::key(key)).await
    }

    /// Writes `key`, bound to `lease` unless it is 0.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<proto::PutResponse, Error> {
        let request = proto::PutRequest { key: key.into(), value: value.into(), lease };
        self.unary("/etcdserverpb.KV/Put", &request).await
    }

    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Error> {
        self.unary("/etcdserverpb.KV/Txn", &request).await
    }

    /// Forgets every revision before `revision`; `physical`: answers once
    /// the backend has dropped them too.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<proto::CompactionResponse, Error> {
        self.unary("/etcdserverpb.KV/Compact", &proto::CompactionRequest { revision, physical }).await
    }

    /// A new lease of `ttl` seconds (etcd rounds a TTL below its minimum up).
    pub async fn lease_grant(&self, ttl: i64) -> Result<proto::LeaseGrantResponse, Error> {
        self.unary("/etcdserverpb.Lease/LeaseGrant", &proto::LeaseGrantRequest { ttl, id: 0 }).await
    }

    /// Ends the lease, deleting the keys bound to it.
    pub async fn lease_revoke(&self, id: i64) -> Result<proto::LeaseRevokeResponse, Error> {
        self.unary("/etcdserverpb.Lease/LeaseRevoke", &proto::LeaseRevokeRequest { id }).await
    }

    /// A stream of renewals of lease `id`, opened with a first renewal
    /// (etcd answers a stream's headers only with its first message).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<(KeepAlive, LeaseKeepAliveResponse), Error> {
        let (tx, rx) = mpsc::channel(1);
        let first = frame(&proto::LeaseKeepAliveRequest { id });
        tx.try_send(first).map_err(|_| Error::Protocol("the renewal stream's channel is full".into()))?;
        let (conn, messages) = self.start("/etcdserverpb.Lease/LeaseKeepAlive", Outgoing::Stream(rx)).await?;
        let mut keep = KeepAlive { client: self.clone(), conn, id, tx, messages };
        let answer = keep.read().await?;
        Ok((keep, answer))
    }

    /// Watches what `request` names. The stream stays open while the
    /// returned `Watch` lives; dropping it cancels the watch.
    pub async fn watch(&self, request: WatchCreateRequest) -> Result<Watch, Error> {
        let (tx, rx) = mpsc::channel(1);
        let create = frame(&proto::WatchRequest { create_request: Some(request) });
        tx.try_send(create).map_err(|_| Error::Protocol("the watch's channel is full".into()))?;
        let (conn, messages) = self.start("/etcdserverpb.Watch/Watch", Outgoing::Stream(rx)).await?;
        Ok(Watch { client: self.clone(), conn, _requests: tx, messages })
    }
}

/// An open watch.
pub struct Watch {
    client: Client,
    conn: Conn,
    /// Held so that the request stream stays open.
    _requests: mpsc::Sender<Bytes>,
    messages: Messages,
}

impl Watch {
    /// The next answer; `None` when etcd ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        match self.messages.next().await {
            Ok(m) => Ok(m),
            Err(err) => Err(self.client.judge(&self.conn, err).await),
        }
    }
}

/// An open stream of lease renewals.
pub struct KeepAlive {
    client: Client,
    conn: Conn,
    id: i64,
    tx: mpsc::Sender<Bytes>,
    messages: Messages,
}

impl KeepAlive {
    /// Renews the lease: its TTL from now, 0 when it is gone.
    pub async fn renew(&mut self) -> Result<LeaseKeepAliveResponse, Error> {
        let request = frame(&proto::LeaseKeepAliveRequest { id: self.id });
        if self.tx.send(request).await.is_err() {
            return Err(self.client.judge(&self.conn, Error::Transport("the renewal stream is closed".into())).await);
        }
        self.read().await
    }

    async fn read(&mut self) -> Result<LeaseKeepAliveResponse, Error> {
        let read = match self.messages.next().await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(Error::Transport("etcd ended the renewal stream".into())),
            Err(e) => Err(e),
        };
        match read {
            Ok(r) => Ok(r),
            Err(err) => Err(self.client.judge(&self.conn, err).await),
        }
    }
}

/// The first key after every key that starts with `prefix`: a prefix's
/// `range_end`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the key space.
    vec![0]
}

/// The revision an answer's header names (0 without a header).
macro_rules! revision {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn revision(&self) -> i64 {
                self.header.as_ref().map_or(0, |h| h.revision)
            }
        }
    )*};
}
revision!(RangeResponse, TxnResponse, proto::PutResponse, WatchResponse);

impl RangeRequest {
    /// The one key.
    pub fn key(key: impl Into<Vec<u8>>) -> RangeRequest {
        RangeRequest { key: key.into(), ..Default::default() }
    }

    /// Every key in `[key, end)`.
    pub fn until(mut self, end: impl Into<Vec<u8>>) -> RangeRequest {
        self.range_end = end.into();
        self
    }

    /// Every key that starts with the key.
    pub fn prefix(mut self) -> RangeRequest {
        self.range_end = prefix_end(&self.key);
        self
    }

    pub fn limit(mut self, limit: i64) -> RangeRequest {
        self.limit = limit;
        self
    }

    /// As of `revision` (0: the newest).
    pub fn at(mut self, revision: i64) -> RangeRequest {
        self.revision = revision;
        self
    }
}

impl WatchCreateRequest {
    /// Changes to the one key, from now.
    pub fn key(key: impl Into<Vec<u8>>) -> WatchCreateRequest {
        WatchCreateRequest { key: key.into(), ..Default::default() }
    }

    /// Changes to every key that starts with the key.
    pub fn prefix(mut self) -> WatchCreateRequest {
        self.range_end = prefix_end(&self.key);
        self
    }

    /// From `revision` on (its changes included).
    pub fn since(mut self, revision: i64) -> WatchCreateRequest {
        self.start_revision = revision;
        self
    }

    pub fn progress_notify(mut self) -> WatchCreateRequest {
        self.progress_notify = true;
        self
    }
}

impl Compare {
    fn new(key: impl Into<Vec<u8>>, result: CompareResult, target: CompareTarget, union: TargetUnion) -> Compare {
        Compare { result: result as i32, target: target as i32, key: key.into(), target_union: Some(union) }
    }

    pub fn value(key: impl Into<Vec<u8>>, result: CompareResult, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, result, CompareTarget::Value, TargetUnion::Value(value.into()))
    }

    /// The revision that last wrote the key (0: absent).
    pub fn mod_revision(key: impl Into<Vec<u8>>, result: CompareResult, revision: i64) -> Compare {
        Compare::new(key, result, CompareTarget::Mod, TargetUnion::ModRevision(revision))
    }

    /// The revision that created the key (0: absent).
    pub fn create_revision(key: impl Into<Vec<u8>>, result: CompareResult, revision: i64) -> Compare {
        Compare::new(key, result, CompareTarget::Create, TargetUnion::CreateRevision(revision))
    }

    /// The lease the key is bound to.
    pub fn lease(key: impl Into<Vec<u8>>, result: CompareResult, lease: i64) -> Compare {
        Compare::new(key, result, CompareTarget::Lease, TargetUnion::Lease(lease))
    }
}

impl RequestOp {
    pub fn range(request: RangeRequest) -> RequestOp {
        RequestOp { request: Some(proto::Request::Range(request)) }
    }

    /// The one key.
    pub fn get(key: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp::range(RangeRequest::key(key))
    }

    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> RequestOp {
        RequestOp {
            request: Some(proto::Request::Put(proto::PutRequest { key: key.into(), value: value.into(), lease })),
        }
    }

    /// The one key.
    pub fn delete(key: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp::delete_range(key, Vec::new())
    }

    /// Every key in `[key, end)`.
    pub fn delete_range(key: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> RequestOp {
        let request = proto::DeleteRangeRequest { key: key.into(), range_end: end.into() };
        RequestOp { request: Some(proto::Request::DeleteRange(request)) }
    }
}

impl ResponseOp {
    /// The first key a range operation found.
    pub fn first_kv(&self) -> Option<&KeyValue> {
        match &self.response {
            Some(proto::Response::Range(r)) => r.kvs.first(),
            _ => None,
        }
    }
}

impl TxnRequest {
    /// Applies `success` if every compare holds, else `failure`.
    pub fn new(
        compare: impl IntoIterator<Item = Compare>,
        success: impl IntoIterator<Item = RequestOp>,
        failure: impl IntoIterator<Item = RequestOp>,
    ) -> TxnRequest {
        TxnRequest {
            compare: compare.into_iter().collect(),
            success: success.into_iter().collect(),
            failure: failure.into_iter().collect(),
        }
    }
}

impl TxnResponse {
    /// The first key found by the `i`th operation that ran.
    pub fn found(&self, i: usize) -> Option<&KeyValue> {
        self.responses.get(i).and_then(ResponseOp::first_kv)
    }
}

impl proto::Event {
    pub fn is_delete(&self) -> bool {
        self.r#type == EventType::Delete as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_name_what_is_wrong() {
        let e = Endpoint::parse("https://[::1]:2379/").expect("v6");
        assert_eq!((e.host.as_str(), e.authority.as_str(), e.https), ("::1", "[::1]:2379", true));
        let e = Endpoint::parse("http://etcd-1:2379").expect("name");
        assert_eq!((e.host.as_str(), e.https), ("etcd-1", false));
        for (bad, why) in [
            ("etcd:2379", "no scheme"),
            ("grpc://a:1", "scheme must be"),
            ("http://a", "no port"),
            ("http://a:99999", "no port"),
            ("http://a:1/v3", "no path"),
        ] {
            let err = Endpoint::parse(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        for (prefix, end) in [(&b"/p/"[..], &b"/p0"[..]), (b"a\xff", b"b"), (b"\xff\xff", b"\0"), (b"", b"\0")] {
            assert_eq!(prefix_end(prefix), end, "{prefix:?}");
        }
    }

    #[test]
    fn a_status_error_names_the_code() {
        let e = Error::Status { code: 11, message: "mvcc: required revision has been compacted".into() };
        assert_eq!(e.to_string(), "etcd answered OUT_OF_RANGE (11): mvcc: required revision has been compacted");
        assert_eq!(Error::Status { code: 99, message: "x".into() }.to_string(), "etcd answered status (99): x");
    }

    /// A member that lost its quorum says so at once (`hasleader`) instead
    /// of holding a read until the caller's bound; once the quorum is back
    /// the client answers again, through whichever member it moved to.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_without_a_leader_refuses_at_once_and_the_client_moves_on() {
        use crate::testing::etcd::{available, EtcdCluster};
        use tokio::time::{timeout, Instant};
        let test = "a_member_without_a_leader_refuses_at_once_and_the_client_moves_on";
        if !available(test) {
            return;
        }
        let mut cluster = EtcdCluster::start(3).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let client = crate::store::connect(&cluster.config("/t/")).await.expect("connect");
        client.put("k", "v", 0).await.expect("put");
        // The client is on member 0, the first endpoint; the other two stop.
        cluster.pause(1);
        cluster.pause(2);
        let deadline = Instant::now() + Duration::from_secs(30);
        let (refusal, took) = loop {
            let t = Instant::now();
            // Until member 0 notices (an election timeout or two), a read
            // waits for a quorum that does not come.
            if let Ok(Err(e)) = timeout(Duration::from_secs(3), client.get("k")).await {
                break (e, t.elapsed());
            }
            assert!(Instant::now() < deadline, "member 0 never said that it has no leader");
        };
        assert_eq!(refusal.code(), Some(UNAVAILABLE), "{refusal}");
        assert!(refusal.to_string().contains("no leader"), "{refusal}");
        assert!(took < Duration::from_secs(1), "the refusal took {took:?}");
        cluster.resume(1);
        cluster.resume(2);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Ok(r)) = timeout(Duration::from_secs(3), client.get("k")).await {
                assert_eq!(r.kvs.first().map(|kv| kv.value.as_slice()), Some(&b"v"[..]));
                break;
            }
            assert!(Instant::now() < deadline, "no answer within 30 s of the quorum's return");
        }
    }

    /// No etcd listening: the error names every endpoint tried, and comes at once.
    #[tokio::test]
    async fn nothing_listening_names_each_endpoint() {
        let ports: Vec<u16> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()))
            .collect::<Result<_, _>>()
            .expect("ports");
        let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
        let err = Client::connect(&urls, None).await.expect_err("nothing listens");
        let text = err.to_string();
        assert!(urls.iter().all(|u| text.contains(u.as_str())), "{text}");
        assert!(matches!(err, Error::Transport(_)), "{err:?}");
    }
}
