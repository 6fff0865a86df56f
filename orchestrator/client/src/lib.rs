//! Pinion's HTTPS client, shared by the CLI, the nodelet's link and the
//! server's proxy to nodes. It carries no server code: no store, no CA.
//!
//! A `Client` is bound to one server and one identity and keeps a pool of
//! connections to it (hyper-util's pooled client over tokio-rustls): when the
//! server offers HTTP/2 over ALPN, every request and every watch stream share
//! one connection; over HTTP/1.1 an idle connection is reused. Clones share the
//! pool, and the rustls configuration (with its session cache) is shared by
//! every connection, so a reconnect resumes the TLS session.
//!
//! Every call has a timeout; an API refusal comes back as the server's
//! `ApiError` (code, reason, every field problem).

mod connect;
pub mod query;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use specs::api::{ApiError, Event, JoinRequest, JoinResponse, List, Node, WatchEventType};
use specs::Pod;

pub use crate::query::percent_encode;
use crate::tls::{Credentials, PinnedCa, TlsError, ALPN};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_RESPONSE: usize = 256 << 20;
/// An idle pooled connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// HTTP/2 pings on a quiet connection (a long watch), so a peer that vanished
/// without a FIN is noticed and the stream ends instead of hanging.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("server URL {0:?}: expected https://HOST:PORT")]
    BadUrl(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("{0} timed out")]
    Timeout(String),
    #[error("http: {0}")]
    Http(String),
    #[error("{0}")]
    Api(ApiError),
    #[error("unexpected reply from the server: {0}")]
    Decode(String),
}

/// A client bound to one server and one identity; clones share its connections.
#[derive(Clone)]
pub struct Client {
    http: legacy::Client<connect::TlsConnect, Full<Bytes>>,
    authority: String,
}

fn parse_url(url: &str) -> Result<(String, String), ClientError> {
    let rest = url.strip_prefix("https://").ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
    let authority = rest.trim_end_matches('/').to_string();
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
        _ => return Err(ClientError::BadUrl(url.to_string())),
    };
    Ok((authority, host))
}

/// The message of an error and of every error under it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        next = s.source();
    }
    out
}

impl Client {
    pub fn new(creds: &Credentials) -> Result<Client, ClientError> {
        Client::with_tls(&creds.server, None, creds.client_config()?)
    }

    /// A client for `url` with this TLS configuration; the server's certificate
    /// must name `server_name` (the URL's host when `None`).
    pub fn with_tls(
        url: &str,
        server_name: Option<&str>,
        mut config: rustls::ClientConfig,
    ) -> Result<Client, ClientError> {
        let (authority, host) = parse_url(url)?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        let name = server_name.map(str::to_string).unwrap_or(host);
        let server_name = ServerName::try_from(name).map_err(|_| ClientError::BadUrl(url.to_string()))?;
        let connector = connect::TlsConnect {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name,
            timeout: CONNECT_TIMEOUT,
        };
        let http = legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE_EVERY)
            .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
        Ok(Client { http, authority })
    }

    /// A client with no certificate, trusting `ca_pem`: only for joining.
    pub fn anonymous(url: &str, ca_pem: &str) -> Result<Client, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(tls::pem_cert(ca_pem, "CA certificate")?).map_err(TlsError::from)?;
        let config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client::with_tls(url, None, config)
    }

    /// A client with no certificate that trusts the server only if the chain
    /// it presents contains a CA whose SHA-256 is `pin` (from the join token)
    /// and that CA signed the server's certificate: only for joining.
    pub fn pinned(url: &str, pin: [u8; 32]) -> Result<Client, ClientError> {
        let provider = tls::provider();
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCa { pin, provider }))
            .with_no_client_auth();
        Client::with_tls(url, None, config)
    }

    /// `HOST:PORT` of the server.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    fn builder(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        Request::builder().method(method).uri(format!("https://{}{path}", self.authority))
    }

    /// Sends a request and returns the reply's head (the body streams).
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, ClientError> {
        let what = format!("{} {}", req.method(), req.uri().path());
        match tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(req)).await {
            Err(_) => Err(ClientError::Timeout(what)),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.request_error(e)),
        }
    }

    fn request_error(&self, e: legacy::Error) -> ClientError {
        if e.is_connect() {
            let mut next = std::error::Error::source(&e);
            while let Some(s) = next {
                if let Some(io) = s.downcast_ref::<std::io::Error>() {
                    let source = std::io::Error::new(io.kind(), chain(io));
                    return ClientError::Connect { addr: self.authority.clone(), source };
                }
                next = s.source();
            }
        }
        ClientError::Http(chain(&e))
    }

    /// One request; the reply's status and whole body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(u16, Bytes), ClientError> {
        let mut b = self.builder(method, path);
        let payload = match body {
            Some((ct, bytes)) => {
                b = b.header(hyper::header::CONTENT_TYPE, ct);
                bytes
            }
            None => Bytes::new(),
        };
        let req = b.body(Full::new(payload)).map_err(|e| ClientError::Decode(e.to_string()))?;
        let resp = self.send(req).await?;
        let code = resp.status().as_u16();
        Ok((code, collect(resp.into_body()).await?))
    }

    /// A request whose 2xx reply is decoded as `T`; any other status is the `ApiError`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(u16, T), ClientError> {
        let (code, bytes) = self.request(method, path, body).await?;
        decode_reply(code, &bytes)
    }

    /// Creates a pod from a YAML or JSON manifest; 201 created, 200 unchanged.
    pub async fn create_pod(&self, manifest: Bytes) -> Result<(u16, Pod), ClientError> {
        self.call(Method::POST, "/api/v1/pods", Some(("application/yaml", manifest))).await
    }

    pub async fn get_pod(&self, name: &str) -> Result<Pod, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/pods/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_pods(&self, selector: Option<&str>) -> Result<List<Pod>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/pods{q}"), None).await?.1)
    }

    pub async fn delete_pod(&self, name: &str) -> Result<Pod, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/pods/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn get_node(&self, name: &str) -> Result<Node, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/nodes/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn delete_node(&self, name: &str) -> Result<Node, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/nodes/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_nodes(&self, selector: Option<&str>) -> Result<List<Node>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/nodes{q}"), None).await?.1)
    }

    pub async fn events(&self, kind: &str, name: &str) -> Result<List<Event>, ClientError> {
        let path = format!("/api/v1/events?kind={kind}&name={}", percent_encode(name));
        Ok(self.call(Method::GET, &path, None).await?.1)
    }

    /// Asks for a node certificate with the bootstrap token (on an anonymous client).
    /// Joins as `node_name`; `attempt` (see `JoinRequest::attempt`) makes a
    /// retry after a lost reply succeed.
    pub async fn join(&self, token: &str, node_name: &str, attempt: Option<&str>) -> Result<JoinResponse, ClientError> {
        let body =
            serde_json::to_vec(&JoinRequest { node_name: node_name.to_string(), attempt: attempt.map(str::to_string) })
                .map_err(|e| ClientError::Decode(e.to_string()))?;
        let req = self
            .builder(Method::POST, "/api/v1/join")
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let resp = self.send(req).await?;
        let code = resp.status().as_u16();
        let bytes = collect(resp.into_body()).await?;
        Ok(decode_reply(code, &bytes)?.1)
    }

    /// Pod changes after version `from` (or the current pods as ADDED first when
    /// `None`), filtered to one node and/or a label selector.
    pub async fn watch_pods(
        &self,
        node: Option<&str>,
        selector: Option<&str>,
        from: Option<u64>,
    ) -> Result<PodWatch, ClientError> {
        let mut path = "/api/v1/pods?watch=true".to_string();
        if let Some(n) = node {
            path.push_str(&format!("&nodeName={}", percent_encode(n)));
        }
        if let Some(s) = selector {
            path.push_str(&format!("&labelSelector={}", percent_encode(s)));
        }
        if let Some(v) = from {
            path.push_str(&format!("&resourceVersion={v}"));
        }
        let stream = self.get_stream(&path).await?;
        Ok(PodWatch { stream, buf: BytesMut::new() })
    }

    /// A GET whose reply head is returned as it arrives, whatever its status
    /// (the server's proxy passes a node's refusals through).
    pub async fn get(&self, path: &str) -> Result<Response<Incoming>, ClientError> {
        let req = self
            .builder(Method::GET, path)
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        self.send(req).await
    }

    /// A GET whose 200 reply is read as it arrives (watches, logs); any other
    /// status is the `ApiError`. Only the reply's head has a timeout.
    pub async fn get_stream(&self, path: &str) -> Result<ByteStream, ClientError> {
        let resp = self.get(path).await?;
        let code = resp.status().as_u16();
        if code != 200 {
            let bytes = collect(resp.into_body()).await?;
            return Err(api_error(code, &bytes));
        }
        Ok(ByteStream { body: resp.into_body() })
    }
}

/// A streamed reply body.
pub struct ByteStream {
    body: Incoming,
}

impl ByteStream {
    /// The next bytes; `Ok(None)` at the end of the reply.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(ClientError::Http(chain(&e))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

fn api_error(code: u16, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(bytes) {
        Ok(e) => ClientError::Api(e),
        Err(_) => ClientError::Api(ApiError {
            code,
            reason: "Unknown".into(),
            message: String::from_utf8_lossy(bytes).chars().take(200).collect(),
            details: Vec::new(),
        }),
    }
}

fn decode_reply<T: DeserializeOwned>(code: u16, bytes: &[u8]) -> Result<(u16, T), ClientError> {
    if !(200..300).contains(&code) {
        return Err(api_error(code, bytes));
    }
    serde_json::from_slice(bytes).map(|v| (code, v)).map_err(|e| ClientError::Decode(e.to_string()))
}

async fn collect(body: Incoming) -> Result<Bytes, ClientError> {
    let limited = http_body_util::Limited::new(body, MAX_RESPONSE);
    let b = tokio::time::timeout(REQUEST_TIMEOUT, limited.collect())
        .await
        .map_err(|_| ClientError::Timeout("reading the reply".into()))?
        .map_err(|e| ClientError::Decode(format!("reading the reply: {e}")))?;
    Ok(b.to_bytes())
}

/// A pod watch stream: one `(type, pod)` per line.
pub struct PodWatch {
    stream: ByteStream,
    buf: BytesMut,
}

impl PodWatch {
    /// The next change; `Ok(None)` when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<(WatchEventType, Pod)>, ClientError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                let v: serde_json::Value =
                    serde_json::from_slice(&line).map_err(|e| ClientError::Decode(format!("watch line: {e}")))?;
                let ty: WatchEventType = serde_json::from_value(v["type"].clone())
                    .map_err(|e| ClientError::Decode(format!("watch event type: {e}")))?;
                if ty == WatchEventType::Error {
                    let e: ApiError = serde_json::from_value(v["object"].clone())
                        .map_err(|e| ClientError::Decode(format!("watch error: {e}")))?;
                    return Err(ClientError::Api(e));
                }
                let pod: Pod = serde_json::from_value(v["object"].clone())
                    .map_err(|e| ClientError::Decode(format!("watch object: {e}")))?;
                return Ok(Some((ty, pod)));
            }
            match self.stream.next().await? {
                None => return Ok(None),
                Some(data) => self.buf.extend_from_slice(&data),
            }
        }
    }
}

impl Client {
    /// `GET /api/v1/pods/{name}/attach`: the pod's status frames newer than
    /// `from`, its output after `offset` bytes, then its exit. Over HTTP/2 it
    /// shares the connection of the create before it (no new handshake).
    pub async fn attach_pod(&self, name: &str, from: Option<u64>, offset: u64) -> Result<AttachStream, ClientError> {
        let mut path = format!("/api/v1/pods/{}/attach?offset={offset}", percent_encode(name));
        if let Some(v) = from {
            path.push_str(&format!("&resourceVersion={v}"));
        }
        Ok(AttachStream { stream: self.get_stream(&path).await?, buf: BytesMut::new() })
    }
}

/// An attach stream: one `AttachFrame` per line.
pub struct AttachStream {
    stream: ByteStream,
    buf: BytesMut,
}

impl AttachStream {
    /// The next frame; `Ok(None)` when the stream ended (after a last frame, or
    /// broken off).
    pub async fn next(&mut self) -> Result<Option<specs::api::AttachFrame>, ClientError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| ClientError::Decode(format!("attach frame: {e}")));
            }
            match self.stream.next().await? {
                None => return Ok(None),
                Some(data) => self.buf.extend_from_slice(&data),
            }
        }
    }
}
