//! Pinion's wire, shared by the CLI, the nodelet and the server: the HTTPS
//! client (this module; the CLI, the nodelet's link and the server's proxy to
//! nodes use it), the serving side both servers share (`tls`, `door`,
//! `connect::keep_alive`, `query`), private files (`private`), one backoff,
//! and, behind the `testing` feature, the tests' scaffolding. It carries no
//! store and no CA.
//!
//! A `Client` is bound to one identity and knows every server of a cluster,
//! keeping a pool of connections to each (hyper-util's pooled client over
//! tokio-rustls): when a server offers HTTP/2 over ALPN, every request and
//! every watch stream to it share one connection; over HTTP/1.1 an idle
//! connection is reused. Clones share the pools, and the rustls configuration
//! (with its session cache) is shared by every connection, so a reconnect
//! resumes the TLS session.
//!
//! Requests go to the server that last worked. One that cannot be reached
//! (no connection, no handshake, a dead connection, a 503 because it is
//! shutting down) hands the request to the next, round robin, within one
//! bound for the whole call; a refusal (4xx) is the answer. A request that
//! may have reached a server is sent again elsewhere only when sending it
//! twice does no harm (GET, PUT, DELETE): a POST moves only when it never
//! left (the connection failed). A watch or attach stream that dies moves
//! its server to the back too, so the caller's resume (from the version it
//! reached: every server of a cluster shares its versions) goes elsewhere.
//!
//! Every call has a timeout; an API refusal comes back as the server's
//! `ApiError` (code, reason, every field problem). Every stream has a bound on
//! silence (`specs::api::Liveness`): a watch or attach stream that carries
//! nothing, not even the server's heartbeat, for `silence()` ends with
//! `ClientError::Silent` and its connection is not reused; a quiet connection
//! is pinged every heartbeat (HTTP/2) and dropped when the ping goes
//! unanswered, which is what ends a log follow through a dead path.

pub mod backoff;
mod connect;
pub mod door;
mod lines;
pub mod private;
pub mod query;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy;
use hyper_util::client::legacy::connect::{capture_connection, CaptureConnection};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use specs::api::{ApiError, Event, JoinRequest, JoinResponse, List, Liveness, Node, WatchEventType, MAX_STREAM_LINE};
use specs::daemonset::DaemonSet;
use specs::deployment::Deployment;
use specs::job::Job;
use specs::partition::Partition;
use specs::Pod;

pub use crate::connect::keep_alive;
pub use crate::lines::LineTooLong;
use crate::lines::Lines;
pub use crate::query::percent_encode;
use crate::tls::{Credentials, PinnedCa, TlsError, ALPN};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound on one call, every server it is tried on together.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The `ApiError::reason` of a server's 503 while it shuts down (its store
/// is closed): another server of the cluster can answer.
const SHUTTING_DOWN: &str = "ShuttingDown";
/// The 503 of a server that does not lead, to a node's call (register,
/// heartbeat, status): refused before anything was written, so the call goes
/// to the next server, as after `SHUTTING_DOWN`, until it reaches the leader.
const NOT_LEADER: &str = "NotLeader";
const MAX_RESPONSE: usize = 256 << 20;
/// An idle pooled connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("server URL {0:?}: expected https://HOST:PORT")]
    BadUrl(String),
    #[error("no server URL given")]
    NoServers,
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
    /// Nothing arrived on a stream, not even a heartbeat, for longer than the
    /// liveness bound: the path to the server is dead although the socket is
    /// open (a NAT or relay forgot the flow). Resume on a new connection.
    #[error("the stream was silent for more than {0:?}; the connection is dead")]
    Silent(Duration),
    #[error(transparent)]
    LineTooLong(#[from] LineTooLong),
}

impl ClientError {
    /// The stream (or its connection) died, or its server is shutting down:
    /// resume from where it was, on a new connection (to the next server). A
    /// refusal or a reply that makes no sense is not this: nor is a line past
    /// the cap, which a resume would only read again.
    pub fn is_dead_stream(&self) -> bool {
        matches!(self, ClientError::Silent(_) | ClientError::Http(_)) || self.is_shutting_down()
    }

    /// The server's 503 while it shuts down, or to a node's call when it does
    /// not lead: nothing was written, another server can answer.
    fn is_shutting_down(&self) -> bool {
        matches!(self, ClientError::Api(e) if e.code == 503 && (e.reason == SHUTTING_DOWN || e.reason == NOT_LEADER))
    }

    /// Worth trying again after a pause: no answer, a dead stream, or the
    /// server (or the node behind it) failing or busy (5xx). A refusal (4xx)
    /// or a reply that makes no sense is final.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Api(e) => e.code >= 500,
            ClientError::Decode(_)
            | ClientError::LineTooLong(_)
            | ClientError::BadUrl(_)
            | ClientError::NoServers
            | ClientError::Tls(_) => false,
            _ => true,
        }
    }
}

/// A client bound to one identity and the servers of one cluster; clones
/// share its connections and which server is current.
#[derive(Clone)]
pub struct Client {
    servers: Arc<[Server]>,
    rotation: Rotation,
    liveness: Liveness,
}

/// One server and the pool of connections to it.
struct Server {
    http: legacy::Client<connect::TlsConnect, Full<Bytes>>,
    authority: String,
    connector: connect::TlsConnect,
}

/// Which server is tried first: the one that last worked.
#[derive(Clone)]
struct Rotation {
    current: Arc<AtomicUsize>,
    count: usize,
}

impl Rotation {
    fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.count
    }

    /// Server `i` could not be reached: the next one is tried first from now
    /// on, unless another call already moved on from `i`.
    fn failed(&self, i: usize) {
        if self.count > 1 {
            let next = (i + 1) % self.count;
            if self.current.compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                tracing::info!(next, "a server cannot be reached; moving to the next");
            }
        }
    }

    fn worked(&self, i: usize) {
        self.current.store(i, Ordering::Relaxed);
    }
}

/// Whether a method may be sent to a second server after it may have
/// reached the first: sending it twice does what sending it once does.
fn idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS)
}

/// `https://HOST:PORT` split into the authority (`HOST:PORT`) and the host
/// (an IPv6 address without its brackets); anything else is `BadUrl`.
pub fn parse_url(url: &str) -> Result<(String, String), ClientError> {
    let rest = url.strip_prefix("https://").ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
    let authority = rest.trim_end_matches('/').to_string();
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
            h.trim_start_matches('[').trim_end_matches(']').to_string()
        }
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
        Client::with_tls(&creds.servers, None, creds.client_config()?)
    }

    /// A client whose new connections present what `live` holds then: a
    /// renewed certificate takes over without a new client.
    pub fn with_identity(creds: &Credentials, live: Arc<tls::LiveIdentity>) -> Result<Client, ClientError> {
        Client::with_tls(&creds.servers, None, creds.client_config_live(live)?)
    }

    /// A client for the servers at `urls` (tried in this order) with this TLS
    /// configuration; each server's certificate must name `server_name` (its
    /// URL's host when `None`).
    pub fn with_tls(
        urls: &[String],
        server_name: Option<&str>,
        mut config: rustls::ClientConfig,
    ) -> Result<Client, ClientError> {
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        // One configuration, so one TLS session cache, for every server.
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        let liveness = Liveness::default();
        let mut servers = Vec::with_capacity(urls.len());
        for url in urls {
            let (authority, host) = parse_url(url)?;
            let name = server_name.map(str::to_string).unwrap_or(host);
            let server_name = ServerName::try_from(name).map_err(|_| ClientError::BadUrl(url.to_string()))?;
            let connector = connect::TlsConnect { tls: tls.clone(), server_name, timeout: CONNECT_TIMEOUT, liveness };
            servers.push((authority, connector));
        }
        if servers.is_empty() {
            return Err(ClientError::NoServers);
        }
        Ok(Client::build(servers, liveness))
    }

    fn build(servers: Vec<(String, connect::TlsConnect)>, liveness: Liveness) -> Client {
        let servers: Vec<Server> = servers
            .into_iter()
            .map(|(authority, mut connector)| {
                connector.liveness = liveness;
                // A ping every heartbeat on a quiet connection, and the
                // connection is dead when its answer has not come by the
                // silence bound: this ends every stream on a path that went
                // silent (a log follow has no heartbeat of its own) and takes
                // the connection out of the pool.
                let http = legacy::Client::builder(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(IDLE_TIMEOUT)
                    .http2_keep_alive_interval(liveness.heartbeat)
                    .http2_keep_alive_timeout(liveness.silence().saturating_sub(liveness.heartbeat))
                    .http2_keep_alive_while_idle(true)
                    .build(connector.clone());
                Server { http, authority, connector }
            })
            .collect();
        let rotation = Rotation { current: Arc::new(AtomicUsize::new(0)), count: servers.len() };
        Client { servers: servers.into(), rotation, liveness }
    }

    /// The same client with another liveness rule (fresh pools); tests
    /// shorten the heartbeat with it, and it must match the server's.
    pub fn with_liveness(self, liveness: Liveness) -> Client {
        let servers = self.servers.iter().map(|s| (s.authority.clone(), s.connector.clone())).collect();
        Client::build(servers, liveness)
    }

    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// A client with no certificate, trusting `ca_pem`: only for joining.
    pub fn anonymous(urls: &[String], ca_pem: &str) -> Result<Client, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(tls::pem_cert(ca_pem, "CA certificate")?).map_err(TlsError::from)?;
        let config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client::with_tls(urls, None, config)
    }

    /// A client with no certificate that trusts the server only if the chain
    /// it presents contains a CA whose SHA-256 is `pin` (from the join token)
    /// and that CA signed the server's certificate: only for joining.
    pub fn pinned(urls: &[String], pin: [u8; 32]) -> Result<Client, ClientError> {
        let provider = tls::provider();
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCa { pin, provider }))
            .with_no_client_auth();
        Client::with_tls(urls, None, config)
    }

    /// `HOST:PORT` of the server requests go to first (the one that last worked).
    pub fn authority(&self) -> &str {
        &self.servers[self.rotation.current()].authority
    }

    /// `HOST:PORT` of every server, in the order they are tried.
    pub fn authorities(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|s| s.authority.as_str())
    }

    /// Sends a request as it is (its URI names the server) over the current
    /// server's pool, with no second server; returns the reply's head.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, ClientError> {
        let i = self.rotation.current();
        let what = format!("{} {}", req.method(), req.uri().path());
        match tokio::time::timeout(REQUEST_TIMEOUT, self.servers[i].http.request(req)).await {
            Err(_) => Err(ClientError::Timeout(what)),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.request_error(i, e)),
        }
    }

    /// Sends `method path` with `headers` and `body` to the server that last
    /// worked, moving on to the next while one cannot be reached (see the
    /// module's comment for which failures move a request, and which
    /// requests); the whole call within `REQUEST_TIMEOUT`. Returns the server
    /// that answered, the reply's head and a handle on its connection.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        headers: &[(hyper::header::HeaderName, String)],
        body: Bytes,
    ) -> Result<(usize, Response<Incoming>, CaptureConnection), ClientError> {
        let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let first = self.rotation.current();
        let mut last = None;
        for k in 0..self.servers.len() {
            let i = (first + k) % self.servers.len();
            let server = &self.servers[i];
            let mut req = Request::builder().method(method.clone()).uri(format!("https://{}{path}", server.authority));
            for (name, value) in headers {
                req = req.header(name, value);
            }
            let mut req = req.body(Full::new(body.clone())).map_err(|e| ClientError::Decode(e.to_string()))?;
            let connection = capture_connection(&mut req);
            let error = match tokio::time::timeout_at(deadline, server.http.request(req)).await {
                // The whole bound is spent: no server left to try, and the
                // next call starts with another one.
                Err(_) => {
                    self.rotation.failed(i);
                    return Err(ClientError::Timeout(what));
                }
                Ok(Ok(resp)) if resp.status() == hyper::StatusCode::SERVICE_UNAVAILABLE => {
                    let bytes = collect(resp.into_body()).await?;
                    match api_error(503, &bytes) {
                        error if error.is_shutting_down() => {
                            self.rotation.failed(i);
                            // Whether a write refused this way was applied
                            // or not cannot be told from here.
                            if !idempotent(&method) {
                                return Err(error);
                            }
                            error
                        }
                        other => return Err(other),
                    }
                }
                Ok(Ok(resp)) => {
                    self.rotation.worked(i);
                    return Ok((i, resp, connection));
                }
                Ok(Err(e)) => {
                    let error = self.request_error(i, e);
                    self.rotation.failed(i);
                    // A connection that failed carried nothing: any request
                    // may go elsewhere. One that broke may have delivered it.
                    if !matches!(error, ClientError::Connect { .. }) && !idempotent(&method) {
                        return Err(error);
                    }
                    error
                }
            };
            if self.servers.len() > 1 {
                tracing::debug!(server = %server.authority, error = %error, "{what}: trying the next server");
            }
            last = Some(error);
        }
        Err(last.unwrap_or(ClientError::NoServers))
    }

    fn request_error(&self, i: usize, e: legacy::Error) -> ClientError {
        if e.is_connect() {
            let mut next = std::error::Error::source(&e);
            while let Some(s) = next {
                if let Some(io) = s.downcast_ref::<std::io::Error>() {
                    let source = std::io::Error::new(io.kind(), chain(io));
                    return ClientError::Connect { addr: self.servers[i].authority.clone(), source };
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
        let (headers, payload) = match body {
            Some((ct, bytes)) => (vec![(hyper::header::CONTENT_TYPE, ct.to_string())], bytes),
            None => (Vec::new(), Bytes::new()),
        };
        let (_, resp, _) = self.exchange(method, path, &headers, payload).await?;
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

    /// Creates a job (and its member pods) from YAML or JSON; 201 created, 200 unchanged.
    pub async fn create_job(&self, manifest: Bytes) -> Result<(u16, Job), ClientError> {
        self.call(Method::POST, "/api/v1/jobs", Some(("application/yaml", manifest))).await
    }

    pub async fn get_job(&self, name: &str) -> Result<Job, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/jobs/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_jobs(&self, selector: Option<&str>) -> Result<List<Job>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/jobs{q}"), None).await?.1)
    }

    /// Deletes a job and its member pods.
    pub async fn delete_job(&self, name: &str) -> Result<Job, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/jobs/{}", percent_encode(name)), None).await?.1)
    }

    /// Holds a pending job (its members are not made until it is
    /// released), as Slurm's `scontrol hold`.
    pub async fn hold_job(&self, name: &str) -> Result<Job, ClientError> {
        let path = format!("/api/v1/jobs/{}/hold", percent_encode(name));
        Ok(self.call(Method::POST, &path, Some(("application/json", Bytes::from_static(b"{}")))).await?.1)
    }

    /// Releases a held job.
    pub async fn release_job(&self, name: &str) -> Result<Job, ClientError> {
        let path = format!("/api/v1/jobs/{}/release", percent_encode(name));
        Ok(self.call(Method::POST, &path, Some(("application/json", Bytes::from_static(b"{}")))).await?.1)
    }

    /// Creates a Deployment from YAML or JSON, or changes the stored one of
    /// that name (`pinion apply` again); 201 created, 200 changed or unchanged.
    pub async fn apply_deployment(&self, manifest: Bytes) -> Result<(u16, Deployment), ClientError> {
        self.call(Method::POST, "/api/v1/deployments", Some(("application/yaml", manifest))).await
    }

    pub async fn get_deployment(&self, name: &str) -> Result<Deployment, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/deployments/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_deployments(&self, selector: Option<&str>) -> Result<List<Deployment>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/deployments{q}"), None).await?.1)
    }

    /// Deletes a Deployment and its pods.
    pub async fn delete_deployment(&self, name: &str) -> Result<Deployment, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/deployments/{}", percent_encode(name)), None).await?.1)
    }

    /// Sets a Deployment's replicas.
    pub async fn scale_deployment(&self, name: &str, replicas: u32) -> Result<Deployment, ClientError> {
        let body = serde_json::to_vec(&specs::deployment::Scale { replicas })
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let path = format!("/api/v1/deployments/{}/scale", percent_encode(name));
        Ok(self.call(Method::PUT, &path, Some(("application/json", Bytes::from(body)))).await?.1)
    }

    /// Back to revision `to_revision`, or the one before the current.
    pub async fn undo_deployment(&self, name: &str, to_revision: Option<u64>) -> Result<Deployment, ClientError> {
        self.undo("deployments", name, to_revision).await
    }

    /// A new revision of the same template: every pod replaced under the strategy's rules.
    pub async fn restart_deployment(&self, name: &str) -> Result<Deployment, ClientError> {
        self.restart("deployments", name).await
    }

    /// A DaemonSet back to revision `to_revision`, or the one before the current.
    pub async fn undo_daemonset(&self, name: &str, to_revision: Option<u64>) -> Result<DaemonSet, ClientError> {
        self.undo("daemonsets", name, to_revision).await
    }

    /// A new revision of a DaemonSet's template: every node's pod replaced under its update strategy.
    pub async fn restart_daemonset(&self, name: &str) -> Result<DaemonSet, ClientError> {
        self.restart("daemonsets", name).await
    }

    /// `POST /api/v1/KIND/NAME/undo`, for any kind that keeps revisions.
    async fn undo<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        name: &str,
        to_revision: Option<u64>,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(&specs::deployment::Undo { to_revision })
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let path = format!("/api/v1/{kind}/{}/undo", percent_encode(name));
        Ok(self.call(Method::POST, &path, Some(("application/json", Bytes::from(body)))).await?.1)
    }

    /// `POST /api/v1/KIND/NAME/restart`.
    async fn restart<T: serde::de::DeserializeOwned>(&self, kind: &str, name: &str) -> Result<T, ClientError> {
        let path = format!("/api/v1/{kind}/{}/restart", percent_encode(name));
        Ok(self.call(Method::POST, &path, Some(("application/json", Bytes::from_static(b"{}")))).await?.1)
    }

    /// Creates a DaemonSet from YAML or JSON, or changes the stored one of
    /// that name (`pinion apply` again); 201 created, 200 changed or unchanged.
    pub async fn apply_daemonset(&self, manifest: Bytes) -> Result<(u16, DaemonSet), ClientError> {
        self.call(Method::POST, "/api/v1/daemonsets", Some(("application/yaml", manifest))).await
    }

    pub async fn get_daemonset(&self, name: &str) -> Result<DaemonSet, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/daemonsets/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_daemonsets(&self, selector: Option<&str>) -> Result<List<DaemonSet>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/daemonsets{q}"), None).await?.1)
    }

    /// Deletes a DaemonSet and its pods.
    pub async fn delete_daemonset(&self, name: &str) -> Result<DaemonSet, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/daemonsets/{}", percent_encode(name)), None).await?.1)
    }

    /// Creates a partition from YAML or JSON, or changes the stored one of
    /// that name (admins); 201 created, 200 changed or unchanged.
    pub async fn apply_partition(&self, manifest: Bytes) -> Result<(u16, Partition), ClientError> {
        self.call(Method::POST, "/api/v1/partitions", Some(("application/yaml", manifest))).await
    }

    pub async fn get_partition(&self, name: &str) -> Result<Partition, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/partitions/{}", percent_encode(name)), None).await?.1)
    }

    pub async fn list_partitions(&self) -> Result<List<Partition>, ClientError> {
        Ok(self.call(Method::GET, "/api/v1/partitions", None).await?.1)
    }

    pub async fn delete_partition(&self, name: &str) -> Result<Partition, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/partitions/{}", percent_encode(name)), None).await?.1)
    }

    /// Every user's and account's fair share (`pinion share`).
    pub async fn list_shares(&self) -> Result<List<specs::fairshare::Share>, ClientError> {
        Ok(self.call(Method::GET, "/api/v1/shares", None).await?.1)
    }

    /// The accounting records the caller may read (`pinion acct`).
    pub async fn list_acct(&self) -> Result<List<specs::acct::Record>, ClientError> {
        Ok(self.call(Method::GET, "/api/v1/acct", None).await?.1)
    }

    /// The cluster's people (admins and viewers).
    pub async fn list_users(&self) -> Result<List<specs::api::User>, ClientError> {
        Ok(self.call(Method::GET, "/api/v1/users", None).await?.1)
    }

    /// Adds a person (admin); their first certificate comes back.
    pub async fn add_user(&self, user: &specs::api::User) -> Result<specs::api::UserCredentials, ClientError> {
        let body = serde_json::to_vec(user).map_err(|e| ClientError::Decode(e.to_string()))?;
        Ok(self.call(Method::POST, "/api/v1/users", Some(("application/json", Bytes::from(body)))).await?.1)
    }

    /// Revokes a person (admin).
    pub async fn revoke_user(&self, name: &str) -> Result<specs::api::User, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/users/{}", percent_encode(name)), None).await?.1)
    }

    /// A fresh certificate and key for the caller's own identity.
    pub async fn renew(&self) -> Result<specs::api::Renewed, ClientError> {
        Ok(self.call(Method::POST, "/api/v1/renew", None).await?.1)
    }

    /// Makes a join token (admin); the answer holds the token, shown once.
    pub async fn create_token(
        &self,
        request: &specs::api::TokenRequest,
    ) -> Result<specs::api::TokenCreated, ClientError> {
        let body = serde_json::to_vec(request).map_err(|e| ClientError::Decode(e.to_string()))?;
        Ok(self.call(Method::POST, "/api/v1/tokens", Some(("application/json", Bytes::from(body)))).await?.1)
    }

    /// The join tokens, without their secrets (admin).
    pub async fn list_tokens(&self) -> Result<List<specs::api::Token>, ClientError> {
        Ok(self.call(Method::GET, "/api/v1/tokens", None).await?.1)
    }

    /// Revokes a join token (admin).
    pub async fn revoke_token(&self, id: &str) -> Result<specs::api::Token, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/tokens/{}", percent_encode(id)), None).await?.1)
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
        let headers = [
            (hyper::header::AUTHORIZATION, format!("Bearer {token}")),
            (hyper::header::CONTENT_TYPE, "application/json".to_string()),
        ];
        let (_, resp, _) = self.exchange(Method::POST, "/api/v1/join", &headers, Bytes::from(body)).await?;
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
        path.push_str("&allowWatchBookmarks=true");
        let stream = self.open_stream(&path, true).await?;
        Ok(ObjectWatch { stream, lines: Lines::new(MAX_STREAM_LINE), version: from, object: PhantomData })
    }

    /// Node changes after version `from` (or the current nodes as ADDED
    /// first when `None`). A node watching reads the others without status.
    pub async fn watch_nodes(&self, from: Option<u64>) -> Result<NodeWatch, ClientError> {
        let mut path = "/api/v1/nodes?watch=true&allowWatchBookmarks=true".to_string();
        if let Some(v) = from {
            path.push_str(&format!("&resourceVersion={v}"));
        }
        let stream = self.open_stream(&path, true).await?;
        Ok(ObjectWatch { stream, lines: Lines::new(MAX_STREAM_LINE), version: from, object: PhantomData })
    }

    /// A GET whose reply head is returned as it arrives, whatever its status
    /// (the server's proxy passes a node's refusals through).
    pub async fn get(&self, path: &str) -> Result<Response<Incoming>, ClientError> {
        Ok(self.exchange(Method::GET, path, &[], Bytes::new()).await?.1)
    }

    /// A GET whose 200 reply is read as it arrives (a log follow); any other
    /// status is the `ApiError`. Only the reply's head has a timeout; the body
    /// may be quiet for any time (a container that prints nothing), so its
    /// liveness is the connection's pings.
    pub async fn get_stream(&self, path: &str) -> Result<ByteStream, ClientError> {
        self.open_stream(path, false).await
    }

    /// `heartbeats`: the server sends something at least every heartbeat on
    /// this stream, so a longer silence is a dead stream.
    async fn open_stream(&self, path: &str, heartbeats: bool) -> Result<ByteStream, ClientError> {
        self.open_stream_with(Method::GET, path, None, heartbeats).await
    }

    async fn open_stream_with(
        &self,
        method: Method,
        path: &str,
        json_body: Option<Bytes>,
        heartbeats: bool,
    ) -> Result<ByteStream, ClientError> {
        let (headers, body) = match json_body {
            Some(b) => (vec![(hyper::header::CONTENT_TYPE, "application/json".to_string())], b),
            None => (Vec::new(), Bytes::new()),
        };
        let (server, resp, connection) = self.exchange(method, path, &headers, body).await?;
        let code = resp.status().as_u16();
        if code != 200 {
            let bytes = collect(resp.into_body()).await?;
            return Err(api_error(code, &bytes));
        }
        let silence = heartbeats.then(|| self.liveness.silence());
        Ok(ByteStream { body: resp.into_body(), silence, connection, server, rotation: self.rotation.clone() })
    }
}

/// A streamed reply body.
pub struct ByteStream {
    body: Incoming,
    /// The bound on silence, for a stream with heartbeats.
    silence: Option<Duration>,
    connection: CaptureConnection,
    /// The server it comes from, which its death moves to the back.
    server: usize,
    rotation: Rotation,
}

impl ByteStream {
    /// The next bytes; `Ok(None)` at the end of the reply.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            let frame = match self.silence {
                None => self.body.frame().await,
                Some(bound) => match tokio::time::timeout(bound, self.body.frame()).await {
                    Ok(f) => f,
                    Err(_) => {
                        // Over HTTP/2 the next request would go on the same
                        // dead connection: take it out of the pool.
                        if let Some(c) = self.connection.connection_metadata().as_ref() {
                            c.poison();
                        }
                        self.rotation.failed(self.server);
                        return Err(ClientError::Silent(bound));
                    }
                },
            };
            match frame {
                None => return Ok(None),
                // A broken stream: the caller resumes, on the next server.
                Some(Err(e)) => {
                    self.rotation.failed(self.server);
                    return Err(ClientError::Http(chain(&e)));
                }
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

/// A watch stream of objects of one kind: one `(type, object)` per line.
/// The server's bookmarks are read here (they only move `resource_version`
/// on).
pub struct ObjectWatch<T> {
    stream: ByteStream,
    lines: Lines,
    version: Option<u64>,
    object: PhantomData<fn() -> T>,
}

/// A pod watch (`Client::watch_pods`).
pub type PodWatch = ObjectWatch<Pod>;
/// A node watch (`Client::watch_nodes`).
pub type NodeWatch = ObjectWatch<Node>;

impl<T: DeserializeOwned> ObjectWatch<T> {
    /// The version this watch has reached: resume from it to miss nothing
    /// and see nothing twice.
    pub fn resource_version(&self) -> Option<u64> {
        self.version
    }

    /// The next change; `Ok(None)` when the server ended the stream (it
    /// does when it shuts down: the next call goes to the next server).
    pub async fn next(&mut self) -> Result<Option<(WatchEventType, T)>, ClientError> {
        let next = self.next_change().await;
        if matches!(&next, Ok(None)) || next.as_ref().is_err_and(|e| e.is_shutting_down()) {
            self.stream.rotation.failed(self.stream.server);
        }
        next
    }

    async fn next_change(&mut self) -> Result<Option<(WatchEventType, T)>, ClientError> {
        loop {
            if let Some(line) = self.lines.next_line()? {
                let v: serde_json::Value =
                    serde_json::from_slice(&line).map_err(|e| ClientError::Decode(format!("watch line: {e}")))?;
                let ty: WatchEventType = serde_json::from_value(v["type"].clone())
                    .map_err(|e| ClientError::Decode(format!("watch event type: {e}")))?;
                if ty == WatchEventType::Error {
                    let e: ApiError = serde_json::from_value(v["object"].clone())
                        .map_err(|e| ClientError::Decode(format!("watch error: {e}")))?;
                    return Err(ClientError::Api(e));
                }
                if ty == WatchEventType::Bookmark {
                    let v = v["object"]["metadata"]["resourceVersion"]
                        .as_u64()
                        .ok_or_else(|| ClientError::Decode("watch bookmark without metadata.resourceVersion".into()))?;
                    self.version = Some(self.version.map_or(v, |have| have.max(v)));
                    continue;
                }
                let version = v["object"]["metadata"]["resourceVersion"].as_u64();
                let object: T = serde_json::from_value(v["object"].clone())
                    .map_err(|e| ClientError::Decode(format!("watch object: {e}")))?;
                if let Some(v) = version {
                    self.version = Some(self.version.map_or(v, |have| have.max(v)));
                }
                return Ok(Some((ty, object)));
            }
            match self.stream.next().await? {
                None => return Ok(None),
                Some(data) => self.lines.extend(&data),
            }
        }
    }
}

impl Client {
    /// `GET /api/v1/pods/{name}/attach`: the pod's status frames newer than
    /// `from`, its output after `offset` bytes, then its exit. Over HTTP/2 it
    /// shares the connection of the create before it (no new handshake).
    /// With `rm` the server deletes the pod once it finished, before the
    /// exit frame, which then says `removed`.
    pub async fn attach_pod(
        &self,
        name: &str,
        from: Option<u64>,
        offset: u64,
        rm: bool,
    ) -> Result<AttachStream, ClientError> {
        let mut path = format!("/api/v1/pods/{}/attach?offset={offset}", percent_encode(name));
        if let Some(v) = from {
            path.push_str(&format!("&resourceVersion={v}"));
        }
        if rm {
            path.push_str("&rm=true");
        }
        Ok(FrameStream::new(self.open_stream(&path, true).await?, "attach frame"))
    }

    /// `POST /api/v1/pods/{name}/exec`: the command's output as it comes, then
    /// its exit code (`ExecFrame`s). Not resumable: a broken stream ends the
    /// command on the node. Sent to a second server only when the first
    /// connection failed (a POST), as any call.
    pub async fn exec_pod(&self, name: &str, request: &specs::api::ExecRequest) -> Result<ExecStream, ClientError> {
        let path = format!("/api/v1/pods/{}/exec", percent_encode(name));
        self.post_frames(&path, request).await
    }

    /// `POST /api/v1/pods/{name}/exec/input`: stdin for an exec started with
    /// `stdin`, answered once the node queued it for the command.
    pub async fn exec_input(&self, name: &str, input: &specs::api::ExecInput) -> Result<(), ClientError> {
        let path = format!("/api/v1/pods/{}/exec/input", percent_encode(name));
        let body = serde_json::to_vec(input).map_err(|e| ClientError::Decode(e.to_string()))?;
        let sent = self.call::<serde_json::Value>(Method::POST, &path, Some(("application/json", Bytes::from(body))));
        sent.await.map(|_| ())
    }

    /// A POST of `body` as JSON whose 200 reply is a stream of JSON lines
    /// with heartbeats (a longer silence than the liveness bound is
    /// `ClientError::Silent`); any other status is the `ApiError`. The
    /// server's exec proxy calls a node's `/exec` with it.
    pub async fn post_frames<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<FrameStream<T>, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Decode(e.to_string()))?;
        let stream = self.open_stream_with(Method::POST, path, Some(Bytes::from(body)), true).await?;
        Ok(FrameStream::new(stream, "stream frame"))
    }
}

/// An attach stream: one `AttachFrame` per line.
pub type AttachStream = FrameStream<specs::api::AttachFrame>;
/// An exec stream: one `ExecFrame` per line.
pub type ExecStream = FrameStream<specs::api::ExecFrame>;

/// A stream of JSON lines, each one `T`, its silence bounded (see `ByteStream`)
/// and its unfinished line capped (`MAX_STREAM_LINE`).
pub struct FrameStream<T> {
    stream: ByteStream,
    lines: Lines,
    what: &'static str,
    frames: std::marker::PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> FrameStream<T> {
    fn new(stream: ByteStream, what: &'static str) -> FrameStream<T> {
        FrameStream { stream, lines: Lines::new(MAX_STREAM_LINE), what, frames: std::marker::PhantomData }
    }

    /// The next frame; `Ok(None)` when the stream ended (after a last frame, or
    /// broken off).
    pub async fn next(&mut self) -> Result<Option<T>, ClientError> {
        loop {
            if let Some(line) = self.lines.next_line()? {
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| ClientError::Decode(format!("{}: {e}", self.what)));
            }
            match self.stream.next().await? {
                None => return Ok(None),
                Some(data) => self.lines.extend(&data),
            }
        }
    }
}
