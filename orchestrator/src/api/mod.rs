//! The HTTPS API: a bounded accept loop (hyper 1 over tokio-rustls), the client
//! identity from the verified certificate, body limits and read timeouts, then
//! route -> `parse` (typed `Action`) -> `apply` (store) -> JSON or a watch
//! stream. Graceful shutdown: stop accepting, let in-flight requests finish,
//! end watch streams. Liveness (`ApiConfig::liveness`): TCP keepalive on every
//! accepted socket, an HTTP/2 PING on a quiet connection, a BOOKMARK on an idle
//! watch that asked for them, a heartbeat frame on an idle attach stream.

pub mod apply;
pub mod attach;
pub mod error;
pub mod local;
pub mod parse;
pub mod proxy;
pub mod routes;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use specs::api::{ApiError, Liveness, WatchEventType};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use self::apply::{apply, bookmark_line, watch_line, ApiState, Reply};
use self::error::{bad_request, error};
use self::routes::{match_route, routes, Matched, Route};
use crate::tls::Identity;

/// A reply body. Its error ends a stream abruptly (HTTP/2 RST_STREAM, an
/// HTTP/1 connection closed mid-body), which is how a proxied stream whose
/// upstream broke tells its reader to resume rather than to stop.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// Requests (and watches) one HTTP/2 connection may have open at once.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;

#[derive(Debug, Clone, Copy)]
pub struct ApiConfig {
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// Connections served at once; the accept loop waits beyond that.
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// Time to send the request head, and separately the body.
    pub read_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// How often an idle stream or connection carries something; clients
    /// bound silence by the same rule.
    pub liveness: Liveness,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            body_limit: 1 << 20,
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(10),
            liveness: Liveness::default(),
        }
    }
}

/// Serves until `shutdown` turns true, then drains connections.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<ApiState>,
    config: ApiConfig,
    shutdown: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    accept_loop(listener, Listener::Api(acceptor), routes(), state, config, shutdown).await;
}

/// What a listener speaks: the HTTPS API, or the local listener's plain HTTP
/// (`local`).
#[derive(Clone)]
enum Listener {
    Api(tokio_rustls::TlsAcceptor),
    Local,
}

/// The bounded accept loop both listeners share: at most
/// `config.max_connections` at once; on shutdown it stops accepting and waits
/// (up to `shutdown_timeout`) for the connections to finish.
async fn accept_loop(
    listener: TcpListener,
    kind: Listener,
    table: Vec<Route>,
    state: Arc<ApiState>,
    config: ApiConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let table = Arc::new(table);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let _ = tcp.set_nodelay(true);
        pinion_client::keep_alive(&tcp, &config.liveness);
        let (kind, state, table, shutdown) = (kind.clone(), state.clone(), table.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match kind {
                Listener::Api(acceptor) => {
                    let tls = match tokio::time::timeout(config.handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                    };
                    let identity = Arc::new(Identity::from_peer(tls.get_ref().1.peer_certificates()));
                    serve_connection(tls, identity, false, state, table, config, shutdown).await;
                }
                // Only the read-only routes of `local::routes` are in `table`;
                // on them the local listener reads what the admin may read.
                Listener::Local => {
                    serve_connection(tcp, Arc::new(Identity::Admin), true, state, table, config, shutdown).await
                }
            }
        });
    }
    drop(listener);
    // Every connection holds a permit: all permits back means all handlers gone.
    let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(config.shutdown_timeout, slots.acquire_many(all)).await.is_err() {
        tracing::warn!("shutdown: some connections did not finish in time");
    }
}

async fn serve_connection<S>(
    io: S,
    identity: Arc<Identity>,
    local: bool,
    state: Arc<ApiState>,
    table: Arc<Vec<Route>>,
    config: ApiConfig,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let stop = shutdown.clone();
    let svc = hyper::service::service_fn(move |req| {
        let (identity, state, table, stop) = (identity.clone(), state.clone(), table.clone(), stop.clone());
        async move {
            Ok::<_, Infallible>(if local {
                local::respond(req, &identity, state, &table, config, stop).await
            } else {
                handle(req, &identity, state, &table, config, stop).await
            })
        }
    });
    // HTTP/2 when the client chose it over ALPN (one connection for all its
    // requests and watches), HTTP/1.1 otherwise; the auto builder reads the
    // connection preface to tell them apart.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(config.read_timeout);
    // Pings on a quiet connection: a client whose path went silent is let go
    // (its watches and follows with it) instead of held until the OS gives up.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .keep_alive_interval(config.liveness.heartbeat)
        .keep_alive_timeout(config.liveness.silence().saturating_sub(config.liveness.heartbeat));
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r { tracing::debug!(error = %e, "connection ended") },
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

pub fn json_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(e).unwrap_or_else(|_| b"{\"code\":500}".to_vec());
    json_response(e.code, body)
}

async fn handle(
    req: Request<Incoming>,
    identity: &Identity,
    state: Arc<ApiState>,
    table: &[Route],
    config: ApiConfig,
    shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    let (route, param) = match match_route(table, req.method(), req.uri().path()) {
        Matched::Route(r, p) => (r, p),
        Matched::MethodNotAllowed => {
            let allowed = routes::allowed_methods(table, req.uri().path());
            let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
            let mut r = error_response(&error(
                405,
                "MethodNotAllowed",
                format!("{} is not allowed on {} (allowed: {allow})", req.method(), req.uri().path()),
            ));
            if let Ok(v) = hyper::header::HeaderValue::from_str(&allow) {
                r.headers_mut().insert(hyper::header::ALLOW, v);
            }
            return r;
        }
        Matched::NotFound => return error_response(&error(404, "NotFound", format!("no route {}", req.uri().path()))),
    };
    let too_large =
        || error(413, "RequestEntityTooLarge", format!("request body is larger than {} bytes", config.body_limit));
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.body_limit as u64) {
        drain(req.into_body(), config).await;
        return error_response(&too_large());
    }
    let (parts, mut body) = req.into_parts();
    let limit = config.body_limit;
    let collected = tokio::time::timeout(config.read_timeout, async {
        let mut buf = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                if buf.len() + data.len() > limit {
                    return Ok(None);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok::<_, hyper::Error>(Some(buf.freeze()))
    })
    .await;
    let body = match collected {
        Ok(Ok(Some(b))) => b,
        Ok(Ok(None)) => {
            drain(body, config).await;
            return error_response(&too_large());
        }
        Ok(Err(e)) => return error_response(&bad_request(format!("cannot read the body: {e}"))),
        Err(_) => return error_response(&error(408, "RequestTimeout", "the body did not arrive in time")),
    };
    let action = match parse::parse(route, param, parts.uri.query().unwrap_or(""), &parts.headers, &body) {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    match apply(&state, identity, action).await {
        Ok(Reply::Json(code, v)) => json_response(code, v),
        Ok(Reply::Metrics(text)) => {
            let mut r = json_response(200, text.into_bytes());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            r
        }
        Ok(Reply::Watch { initial, mut watch, filter, from, bookmarks }) => {
            let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
            let mut stop = shutdown;
            let heartbeat = config.liveness.heartbeat;
            let watches = state.metrics.watches.clone();
            tokio::spawn(async move {
                // Counted while this task lives, however it ends.
                watches.inc();
                let _open = WatchOpen(watches);
                for line in initial {
                    if tx.send(Ok(Bytes::from(line))).await.is_err() {
                        return;
                    }
                }
                // Every change read so far was sent or filtered out: a bookmark
                // at this version skips nothing.
                let mut version = from;
                let mut last_sent = tokio::time::Instant::now();
                loop {
                    let change = tokio::select! {
                        c = watch.next() => c,
                        _ = tokio::time::sleep_until(last_sent + heartbeat), if bookmarks => {
                            if tx.send(Ok(Bytes::from(bookmark_line(filter.kind, version)))).await.is_err() {
                                return;
                            }
                            last_sent = tokio::time::Instant::now();
                            continue;
                        }
                        _ = stop.changed() => return,
                        _ = tx.closed() => return,
                    };
                    let line = match change {
                        Ok(c) => {
                            version = version.max(c.rv);
                            match filter.line(&c) {
                                Some(l) => l,
                                None => continue,
                            }
                        }
                        Err(e) => {
                            let err = error::store_error(e);
                            let obj = serde_json::to_string(&err).unwrap_or_default();
                            let _ = tx.send(Ok(Bytes::from(watch_line(WatchEventType::Error, &obj)))).await;
                            return;
                        }
                    };
                    if tx.send(Ok(Bytes::from(line))).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
            });
            let mut r = Response::new(BodyExt::boxed(ChannelBody { rx }));
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-ndjson"));
            r
        }
        Ok(Reply::Proxy { node, endpoint, path }) => {
            proxy::proxy(&state.proxy, &node, &endpoint, &path, shutdown).await
        }
        Ok(Reply::Attach(a)) => attach::respond(state, *a, config.liveness, shutdown),
        Ok(Reply::Exec { node, endpoint, path, request }) => {
            proxy::exec(&state.proxy, &node, &endpoint, &path, &request, config.liveness, shutdown).await
        }
        Err(e) => error_response(&e),
    }
}

/// Takes one off the open-watch gauge when the watch's task ends.
struct WatchOpen(prometheus_client::metrics::gauge::Gauge);

impl Drop for WatchOpen {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Reads and discards what is left of a refused body (up to 16 times the limit)
/// so the client, still sending, reads the 413 instead of a broken pipe.
async fn drain(mut body: Incoming, config: ApiConfig) {
    let cap = config.body_limit.saturating_mul(16);
    let _ = tokio::time::timeout(config.read_timeout, async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(d) = frame.into_data() {
                seen += d.len();
                if seen > cap {
                    break;
                }
            }
        }
    })
    .await;
}

/// A streaming body fed by a channel (a watch's lines, attach frames, a
/// node's log bytes); an error item ends it abruptly (see `Body`).
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> ChannelBody {
        ChannelBody { rx }
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|item| item.map(|r| r.map(Frame::data)))
    }
}
