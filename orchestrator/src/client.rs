//! An HTTPS client for the API (hyper 1 over tokio-rustls): used by the CLI,
//! by benchmarks and tests, and by the nodelet for join and its watch stream.
//!
//! Every call has a timeout; an API refusal comes back as the server's
//! `ApiError` (code, reason, every field problem).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use specs::api::{ApiError, Event, JoinRequest, JoinResponse, List, Node, WatchEventType};
use specs::Pod;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::api::parse::percent_encode;
use crate::tls::{Credentials, TlsError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_RESPONSE: usize = 256 << 20;

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
    Http(#[from] hyper::Error),
    #[error("{0}")]
    Api(ApiError),
    #[error("unexpected reply from the server: {0}")]
    Decode(String),
}

/// A client bound to one server and one identity.
#[derive(Clone)]
pub struct Client {
    connector: TlsConnector,
    authority: String,
    server_name: ServerName<'static>,
}

/// One kept-alive HTTP/1 connection (requests on it go one at a time).
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
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

impl Client {
    pub fn new(creds: &Credentials) -> Result<Client, ClientError> {
        Client::with_config(&creds.server, creds.client_config()?)
    }

    fn with_config(url: &str, mut config: rustls::ClientConfig) -> Result<Client, ClientError> {
        let (authority, host) = parse_url(url)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host).map_err(|_| ClientError::BadUrl(url.to_string()))?;
        Ok(Client { connector: TlsConnector::from(Arc::new(config)), authority, server_name })
    }

    /// A client with no certificate, trusting `ca_pem`: only for joining.
    pub fn anonymous(url: &str, ca_pem: &str) -> Result<Client, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| TlsError::Pem { what: "CA certificate".into(), reason: e.to_string() })?;
        roots.add(ca).map_err(TlsError::from)?;
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client::with_config(url, config)
    }

    /// A client with no certificate that trusts the server only if the chain
    /// it presents contains a CA whose SHA-256 is `pin` (from the join token)
    /// and that CA signed the server's certificate: only for joining.
    pub fn pinned(url: &str, pin: [u8; 32]) -> Result<Client, ClientError> {
        let provider = crate::tls::provider();
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::from)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCa { pin, provider }))
            .with_no_client_auth();
        Client::with_config(url, config)
    }

    pub async fn connect(&self) -> Result<Connection, ClientError> {
        let addr = self.authority.clone();
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr))
            .await
            .map_err(|_| ClientError::Timeout(format!("connecting to {addr}")))?
            .map_err(|source| ClientError::Connect { addr: addr.clone(), source })?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, self.connector.connect(self.server_name.clone(), tcp))
            .await
            .map_err(|_| ClientError::Timeout(format!("TLS handshake with {addr}")))?
            .map_err(|source| ClientError::Connect { addr: addr.clone(), source })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended");
            }
        });
        Ok(Connection { sender, authority: self.authority.clone() })
    }

    /// One request on a fresh connection.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(u16, Bytes), ClientError> {
        self.connect().await?.request(method, path, body).await
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
        Ok(self.call(Method::GET, &format!("/api/v1/pods/{name}"), None).await?.1)
    }

    pub async fn list_pods(&self, selector: Option<&str>) -> Result<List<Pod>, ClientError> {
        let q = selector.map(|s| format!("?labelSelector={}", percent_encode(s))).unwrap_or_default();
        Ok(self.call(Method::GET, &format!("/api/v1/pods{q}"), None).await?.1)
    }

    pub async fn delete_pod(&self, name: &str) -> Result<Pod, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/pods/{name}"), None).await?.1)
    }

    pub async fn get_node(&self, name: &str) -> Result<Node, ClientError> {
        Ok(self.call(Method::GET, &format!("/api/v1/nodes/{name}"), None).await?.1)
    }

    pub async fn delete_node(&self, name: &str) -> Result<Node, ClientError> {
        Ok(self.call(Method::DELETE, &format!("/api/v1/nodes/{name}"), None).await?.1)
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
    pub async fn join(&self, token: &str, node_name: &str) -> Result<JoinResponse, ClientError> {
        let body = serde_json::to_vec(&JoinRequest { node_name: node_name.to_string() })
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let mut conn = self.connect().await?;
        let req = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/join")
            .header(hyper::header::HOST, &conn.authority)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let (code, bytes) = conn.send(req).await?;
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

    /// A GET whose 200 reply is read as it arrives (watches, logs); any other
    /// status is the `ApiError`. Only the reply's head has a timeout.
    pub async fn get_stream(&self, path: &str) -> Result<ByteStream, ClientError> {
        let mut conn = self.connect().await?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(hyper::header::HOST, &conn.authority)
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, conn.sender.send_request(req))
            .await
            .map_err(|_| ClientError::Timeout(format!("GET {path}")))??;
        let code = resp.status().as_u16();
        if code != 200 {
            let bytes = collect(resp.into_body()).await?;
            return Err(api_error(code, &bytes));
        }
        Ok(ByteStream { body: resp.into_body(), _conn: conn })
    }
}

/// A streamed reply body.
pub struct ByteStream {
    body: Incoming,
    _conn: Connection,
}

impl ByteStream {
    /// The next bytes; `Ok(None)` at the end of the reply.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(ClientError::Http(e)),
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

impl Connection {
    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), ClientError> {
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, self.sender.send_request(req))
            .await
            .map_err(|_| ClientError::Timeout("request".into()))??;
        let code = resp.status().as_u16();
        Ok((code, collect(resp.into_body()).await?))
    }

    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(u16, Bytes), ClientError> {
        let mut b = Request::builder().method(method).uri(path).header(hyper::header::HOST, &self.authority);
        let payload = match body {
            Some((ct, bytes)) => {
                b = b.header(hyper::header::CONTENT_TYPE, ct);
                bytes
            }
            None => Bytes::new(),
        };
        let req = b.body(Full::new(payload)).map_err(|e| ClientError::Decode(e.to_string()))?;
        self.send(req).await
    }
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

/// Verifies a server against the CA its own chain carries, once that CA's
/// hash matches the pin: trust on a known fingerprint, then ordinary WebPKI
/// checks (signature, validity, the server name).
#[derive(Debug)]
struct PinnedCa {
    pin: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use sha2::Digest;
        let ca = intermediates
            .iter()
            .find(|c| <[u8; 32]>::from(sha2::Sha256::digest(c.as_ref())) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the server's CA is not the one the join token pins (wrong server or token)".into(),
                )
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

// `pinion run`'s calls: a create and its attach stream share one connection
// (one TLS handshake), and an attach stream resumes from a version and an
// output offset.

impl Connection {
    /// Creates a pod on this connection; 201 created, 200 unchanged.
    pub async fn create_pod(&mut self, manifest: Bytes) -> Result<(u16, Pod), ClientError> {
        self.wait_ready().await?;
        let (code, bytes) = self.request(Method::POST, "/api/v1/pods", Some(("application/yaml", manifest))).await?;
        decode_reply(code, &bytes)
    }

    /// Deletes a pod on this connection.
    pub async fn delete_pod(&mut self, name: &str) -> Result<Pod, ClientError> {
        self.wait_ready().await?;
        let (code, bytes) =
            self.request(Method::DELETE, &format!("/api/v1/pods/{}", percent_encode(name)), None).await?;
        Ok(decode_reply(code, &bytes)?.1)
    }

    /// Waits until the connection can take the next request: right after a
    /// reply it may not yet, and a request sent then fails ("canceled").
    async fn wait_ready(&mut self) -> Result<(), ClientError> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.sender.ready())
            .await
            .map_err(|_| ClientError::Timeout("waiting for the connection".into()))??;
        Ok(())
    }

    /// A GET on this connection whose 200 reply is read as it arrives; any
    /// other status is the `ApiError`. Only the reply's head has a timeout.
    pub async fn into_stream(mut self, path: &str) -> Result<ByteStream, ClientError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        // After an earlier request the connection takes a moment to be ready
        // for the next one; sending before that fails ("canceled").
        self.wait_ready().await?;
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, self.sender.send_request(req))
            .await
            .map_err(|_| ClientError::Timeout(format!("GET {path}")))??;
        let code = resp.status().as_u16();
        if code != 200 {
            let bytes = collect(resp.into_body()).await?;
            return Err(api_error(code, &bytes));
        }
        Ok(ByteStream { body: resp.into_body(), _conn: self })
    }

    /// `GET /api/v1/pods/{name}/attach` on this connection: the pod's status
    /// frames newer than `from`, its output after `offset` bytes, then its exit.
    pub async fn attach_pod(self, name: &str, from: Option<u64>, offset: u64) -> Result<AttachStream, ClientError> {
        let mut path = format!("/api/v1/pods/{}/attach?offset={offset}", percent_encode(name));
        if let Some(v) = from {
            path.push_str(&format!("&resourceVersion={v}"));
        }
        Ok(AttachStream { stream: self.into_stream(&path).await?, buf: BytesMut::new() })
    }
}

impl Client {
    /// `Connection::attach_pod` on a fresh connection.
    pub async fn attach_pod(&self, name: &str, from: Option<u64>, offset: u64) -> Result<AttachStream, ClientError> {
        self.connect().await?.attach_pod(name, from, offset).await
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
