//! The joined nodelet's own HTTPS endpoint: container logs and execs, called
//! by the server's proxy (`GET /api/v1/pods/{name}/log`, `POST
//! /api/v1/pods/{name}/exec`), as the kubelet serves them to the API server.
//!
//! TLS with the node certificate from the join (it names the node); a client
//! certificate from the same CA is required, and only the server's proxy
//! identity or the admin may call. HTTP/2 or HTTP/1.1 as the caller chose over
//! ALPN (the server keeps one pooled connection per node). Three routes:
//! `GET /logs?pod=KEY&container=NAME&follow=BOOL`, `POST
//! /exec?pod=KEY&container=NAME` with an `ExecRequest` body (the server also
//! sends the pod's `uid`), and `GET /metrics` (the node's Prometheus metrics,
//! `crate::metrics`).
//!
//! Exec: the command runs through the runtime (`Runtime::exec`) in the
//! container named by the published report's `running` map; the reply is
//! `ExecFrame` lines, output as it is read, a heartbeat every
//! `Liveness::heartbeat` while nothing else goes out, and the exit. The
//! caller going away (the reply's stream reset or its connection gone) or the
//! endpoint stopping ends the command and whatever it started.
//!
//! Following: the file is read to its end, then re-read when the agent
//! publishes a report or every `POLL`, until the container is no longer
//! running. The shim writes the exit record only after the last byte is in the
//! file, so "not running" seen at the end of the file means nothing is missing.
//! A rotation (the path now names another inode) is followed to the new file.
//!
//! At most `EndpointConfig::max_connections` connections of the server's
//! proxy and the admin are served at once, and a few of anyone else's; the
//! handshake, the first request byte, each write and idleness are bounded
//! (`pinion_wire::door`); a quiet connection gets an HTTP/2 PING every
//! heartbeat and TCP keepalive, so a caller whose path went silent is let go.

use std::convert::Infallible;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pinion_wire::door::{self, Activity, Bounds, Pool, Watched, WhenFull};
use pinion_wire::query::Query;
use pinion_wire::tls::{common_name, ADMIN_CN, PROXY_CN};
use specs::api::{ApiError, ExecFrame, ExecRequest, Liveness, TextChunks};
use specs::status::ContainerState;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::runtime::{ExecProcess, Runtime, RuntimeError};
use crate::source::NodeReport;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A log or exec reply the caller does not read for this long ends its connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The whole life of a connection from a caller who may call nothing.
const UNKNOWN_LIFETIME: Duration = Duration::from_secs(30);
/// Connections of callers who may call nothing, held at once.
const UNKNOWN_CONNECTIONS: usize = 16;
const POLL: Duration = Duration::from_millis(200);
const CHUNK: usize = 64 * 1024;
/// Largest exec request body (a command within `specs::limits`' bounds; the
/// server's own body limit is the same).
const EXEC_BODY_LIMIT: usize = 1 << 20;
/// How long an exec's output may stay open after the command ended and its
/// session was swept: only a process that made its own session holds it then.
const EXEC_DRAIN: Duration = Duration::from_secs(2);

type Body = BoxBody<Bytes, Infallible>;

#[derive(Debug, Clone, Copy)]
pub struct EndpointConfig {
    pub(crate) liveness: Liveness,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        // The server's proxy keeps one connection per node; the rest is the
        // admin reading logs directly.
        EndpointConfig { liveness: Liveness::default(), max_connections: 256 }
    }
}

#[derive(Clone)]
struct Ctx {
    /// Execs whose stdin is forwarded, by session (`POST /exec/input`).
    sessions: Sessions,
    data_dir: PathBuf,
    reports: watch::Receiver<NodeReport>,
    runtime: Arc<dyn Runtime>,
    liveness: Liveness,
    stop: watch::Receiver<bool>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The bounds of a caller's connection (`pinion_wire::door`): the
/// server's proxy keeps one connection per node, pinged every heartbeat, so
/// only an unknown caller is held to a short life.
fn bounds(known: bool) -> Bounds {
    let known_bounds =
        Bounds { first_byte: FIRST_BYTE_TIMEOUT, idle: IDLE_TIMEOUT, write_stall: WRITE_TIMEOUT, lifetime: None };
    if known {
        known_bounds
    } else {
        Bounds { idle: FIRST_BYTE_TIMEOUT, lifetime: Some(UNKNOWN_LIFETIME), ..known_bounds }
    }
}

/// Serves until `stop` turns true. The accept loop never waits: a
/// connection takes a seat in the handshake pool (the oldest evicted when
/// full), then one in the pool of its caller (the server's proxy and the
/// admin: refused when full; anyone else: a small pool, the oldest evicted),
/// so a flood of raw connections cannot keep the server's proxy out.
// Each argument is a separate piece of the daemon's wiring (as `daemon::run` holds them).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    config: EndpointConfig,
    data_dir: PathBuf,
    reports: watch::Receiver<NodeReport>,
    runtime: Arc<dyn Runtime>,
    metrics: Arc<crate::metrics::Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let ctx = Ctx {
        sessions: Sessions::default(),
        data_dir,
        reports,
        runtime,
        liveness: config.liveness,
        stop: stop.clone(),
        metrics,
    };
    let handshakes = Pool::new("handshake", config.max_connections.max(1), WhenFull::EvictOldest);
    let known = Pool::new("known", config.max_connections.max(1), WhenFull::Refuse);
    let unknown = Pool::new("unknown", UNKNOWN_CONNECTIONS, WhenFull::EvictOldest);
    loop {
        let Some(accepted) = next_connection(&listener, &mut stop).await else { return };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A log stream's last small frame must not wait for the previous
        // one's ACK (Nagle against delayed ACK: 40 ms at the end of a `run`).
        let _ = tcp.set_nodelay(true);
        pinion_wire::keep_alive(&tcp, &config.liveness);
        let (acceptor, ctx) = (acceptor.clone(), ctx.clone());
        // Seated here, in the order of arrival, so that "oldest" means it.
        let Some(mut seat) = handshakes.enter() else { continue };
        let (known, unknown) = (known.clone(), unknown.clone());
        tokio::spawn(async move {
            let tls = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "endpoint: TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "endpoint: TLS handshake timed out"),
                },
                _ = seat.evicted() => return tracing::debug!(%peer, "endpoint: handshake evicted by newer ones"),
            };
            drop(seat);
            let caller = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(common_name);
            let allowed = matches!(caller.as_deref(), Some(PROXY_CN) | Some(ADMIN_CN));
            let pool = if allowed { &known } else { &unknown };
            let Some(mut seat) = pool.enter() else {
                return tracing::warn!(%peer, "endpoint: connection refused: every slot is taken");
            };
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let ctx = ctx.clone();
                let caller = caller.clone();
                async move {
                    if !allowed {
                        let who = caller.unwrap_or_default();
                        return Ok::<_, Infallible>(error_response(&error(
                            403,
                            "Forbidden",
                            format!("certificate {who:?} may not call this node's endpoint"),
                        )));
                    }
                    Ok(handle(req, ctx).await)
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(config.liveness.heartbeat)
                .keep_alive_timeout(config.liveness.silence().saturating_sub(config.liveness.heartbeat));
            let activity = Activity::new();
            let conn = builder.serve_connection(TokioIo::new(Watched::new(tls, activity.clone())), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { tracing::debug!(error = %e, "endpoint: connection ended") },
                why = door::watch(activity, bounds(allowed)) => {
                    tracing::debug!(%peer, reason = %why, "endpoint: connection closed");
                    if why.lets_the_reply_finish() {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(door::LAST_REPLY_GRACE, conn).await;
                    }
                }
                _ = seat.evicted() => tracing::debug!(%peer, "endpoint: connection evicted by newer ones"),
            }
        });
    }
}

fn error(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
    ApiError { code, reason: reason.to_string(), message: message.into(), details: Vec::new() }
}

/// The same JSON refusal the API sends, so the server's proxy passes it through.
fn error_response(e: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(e).unwrap_or_else(|_| b"{\"code\":500}".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(e.code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

async fn handle(req: Request<Incoming>, ctx: Ctx) -> Response<Body> {
    match (req.uri().path(), req.method()) {
        ("/logs", &Method::GET) => logs(req, ctx).await,
        ("/exec", &Method::POST) => exec(req, ctx).await,
        ("/exec/input", &Method::POST) => exec_input(req, ctx).await,
        ("/metrics", &Method::GET) => metrics_response(&ctx.metrics),
        ("/logs" | "/metrics", _) => error_response(&error(405, "MethodNotAllowed", "only GET")),
        ("/exec" | "/exec/input", _) => error_response(&error(405, "MethodNotAllowed", "only POST")),
        (path, _) => error_response(&error(404, "NotFound", format!("no route {path}"))),
    }
}

/// The scrape, for this endpoint and the plain-HTTP local listener.
pub(crate) fn metrics_response(metrics: &crate::metrics::Metrics) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(metrics.encode())).boxed());
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(crate::metrics::CONTENT_TYPE));
    r
}

/// The next connection (or its accept error); `None` once `stop` turns true.
async fn next_connection(
    listener: &TcpListener,
    stop: &mut watch::Receiver<bool>,
) -> Option<std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>> {
    tokio::select! {
        r = listener.accept() => Some(r),
        _ = stop.wait_for(|s| *s) => None,
    }
}

/// Serves `GET /metrics` in plain HTTP/1.1 on `listener` (a loopback
/// address, for a scraper on this machine; `--local-listen`) until `stop`;
/// any other request is a 404. Unauthenticated: the daemon refuses to bind
/// anything but loopback. At most `max_connections` at once, the oldest
/// evicted beyond, each bounded like an unknown caller's.
pub(crate) async fn serve_local(
    listener: TcpListener,
    metrics: Arc<crate::metrics::Metrics>,
    max_connections: usize,
    mut stop: watch::Receiver<bool>,
) {
    let pool = Pool::new("local", max_connections.max(1), WhenFull::EvictOldest);
    loop {
        let Some(accepted) = next_connection(&listener, &mut stop).await else { return };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "local listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let Some(mut seat) = pool.enter() else { continue };
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = match (req.method(), req.uri().path()) {
                    (&Method::GET, "/metrics") => metrics_response(&metrics),
                    (_, path) => error_response(&error(404, "NotFound", format!("no route {path}"))),
                };
                async move { Ok::<_, Infallible>(r) }
            });
            let activity = Activity::new();
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(Watched::new(tcp, activity.clone())), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { tracing::debug!(error = %e, "local listener: connection ended") },
                why = door::watch(activity, bounds(false)) => {
                    tracing::debug!(reason = %why, "local listener: connection closed");
                    if why.lets_the_reply_finish() {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(door::LAST_REPLY_GRACE, conn).await;
                    }
                }
                _ = seat.evicted() => {}
            }
        });
    }
}

async fn logs(req: Request<Incoming>, ctx: Ctx) -> Response<Body> {
    let q = match Query::parse(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let follow = match q.flag("follow") {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let (Some(pod), Some(container)) = (q.get("pod"), q.get("container")) else {
        return error_response(&error(400, "BadRequest", "pod= and container= are required"));
    };
    let (pod, container) = (pod.to_string(), container.to_string());
    match container_state(&ctx.reports.borrow(), &pod, &container) {
        Err(e) => return error_response(&e),
        Ok((ContainerState::Waiting, 0)) => {
            return error_response(&error(
                400,
                "ContainerWaiting",
                format!("container {container:?} of pod {pod:?} has not started yet"),
            ))
        }
        Ok(_) => {}
    }
    // The log of this pod, not of an earlier one of the same name: the server
    // passes the uid; without one (an older server), the newest of the name.
    let path = match q.get("uid") {
        Some(uid) => crate::agent::reconcile::container_log_path(&ctx.data_dir, &pod, uid, &container),
        None => newest_log(&ctx.data_dir, &pod, &container),
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => {
            return error_response(&error(
                404,
                "NoLog",
                format!("container {container:?} of pod {pod:?} has no log yet ({e})"),
            ))
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if let Err(e) = stream(file, &path, follow, &pod, &container, ctx, &tx).await {
            tracing::debug!(pod, container, error = %e, "endpoint: log stream ended early");
        }
    });
    let mut r = Response::new(BodyExt::boxed(ChannelBody(rx)));
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

/// `POST /exec`: starts the command, then streams it (see the module's comment).
async fn exec(req: Request<Incoming>, ctx: Ctx) -> Response<Body> {
    let q = match Query::parse(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let (Some(pod), Some(container)) = (q.get("pod"), q.get("container")) else {
        return error_response(&error(400, "BadRequest", "pod= and container= are required"));
    };
    let (pod, container, uid) = (pod.to_string(), container.to_string(), q.get("uid").map(str::to_string));
    let body = match read_body(req.into_body(), EXEC_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let request: ExecRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error_response(&ApiError::bad_field("(body)", format!("not an exec request: {e}"))),
    };
    if let Some(p) = specs::validate::validate_exec(&request).into_iter().next() {
        return error_response(&ApiError::bad_field(p.field, p.message));
    }
    let id = match runtime_id(&ctx.reports.borrow(), &pod, &container, uid.as_deref()) {
        Ok(id) => id,
        Err(e) => return error_response(&e),
    };
    let runtime = ctx.runtime.clone();
    let command = request.command;
    let tty = request.tty.then(|| request.size.unwrap_or(specs::api::TerminalSize { cols: 0, rows: 0 }));
    let with_stdin = request.stdin;
    let started = tokio::task::spawn_blocking(move || match with_stdin {
        true => runtime.exec_with_stdin(&id, &command, tty),
        false => runtime.exec(&id, &command),
    })
    .await;
    let process = match started {
        Ok(Ok(p)) => Some(p),
        // The command cannot be executed: its exit code, as a shell gives it.
        Ok(Err(RuntimeError::CannotRun { code, message, .. })) => {
            tracing::debug!(pod, container, code, message, "exec: the command cannot run");
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(frame_line(&ExecFrame::Exit { exit_code: code, message: Some(message) }));
            return ndjson(rx);
        }
        Ok(Err(e @ RuntimeError::Unsupported(_))) => {
            return error_response(&error(501, "NotImplemented", e.to_string()))
        }
        Ok(Err(e)) => return error_response(&error(500, "ExecFailed", e.to_string())),
        Err(e) => return error_response(&error(500, "ExecFailed", format!("the exec task failed: {e}"))),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    if let Some(mut p) = process {
        let (liveness, stop) = (ctx.liveness, ctx.stop.clone());
        // Its stdin: a session the caller posts to, written to the pipe by a
        // task of its own (a command that does not read holds only it).
        let session = match p.stdin.take() {
            Some(fd) => match ctx.sessions.open(&pod, fd, p.tty) {
                Ok(s) => Some(s),
                Err(e) => {
                    let error = error(500, "ExecFailed", format!("the command's stdin: {e}"));
                    let _ = tx.try_send(frame_line(&ExecFrame::Error { error }));
                    return ndjson(rx);
                }
            },
            None => None,
        };
        if let Some(s) = &session {
            let _ = tx.try_send(frame_line(&ExecFrame::Started { session: s.id.clone() }));
        }
        tokio::spawn(async move {
            pump(p, liveness, tx, stop).await;
            drop(session);
            tracing::debug!(pod, container, "exec ended");
        });
    }
    ndjson(rx)
}

/// How long a post of stdin waits for room in its session's queue (the
/// command reads slowly, or not at all) before it is refused.
const EXEC_INPUT_WAIT: Duration = Duration::from_secs(10);

/// What an exec's stdin task is given.
enum Input {
    Data(Bytes),
    Eof,
    Resize(specs::api::TerminalSize),
}

/// An open session's pod and the queue to its writer.
type SessionEnd = (String, mpsc::Sender<Input>);

/// The open stdin sessions, by id.
#[derive(Clone, Default)]
struct Sessions(Arc<std::sync::Mutex<std::collections::HashMap<String, SessionEnd>>>);

/// An open session; dropping it (the exec ended) closes it and ends its writer.
struct Session {
    id: String,
    sessions: Sessions,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.sessions.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        self.writer.abort();
    }
}

impl Sessions {
    /// A session for `pod`'s exec writing to `fd` (a pty's master with
    /// `tty`), under a fresh random id.
    fn open(&self, pod: &str, fd: std::os::fd::OwnedFd, tty: bool) -> std::io::Result<Session> {
        let id = pinion_wire::tls::random_hex::<16>().map_err(std::io::Error::other)?;
        let mut pipe = match tty {
            // Not a pipe, and already non-blocking (`ExecProcess::tty`).
            true => tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(fd)?,
            false => tokio::net::unix::pipe::Sender::from_owned_fd(fd)?,
        };
        let (tx, mut rx) = mpsc::channel::<Input>(specs::limits::MAX_EXEC_INPUT_QUEUED);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Some(input) = rx.recv().await {
                match input {
                    Input::Data(b) => {
                        if pipe.write_all(&b).await.is_err() {
                            return; // the command closed its stdin or ended
                        }
                    }
                    // Dropping the write end: the command reads end of file
                    // (on a terminal, the EOF character: ^D at a line's start).
                    Input::Eof if tty => {
                        if pipe.write_all(&[4]).await.is_err() {
                            return;
                        }
                    }
                    Input::Eof => return,
                    Input::Resize(size) => {
                        if tty {
                            crate::runtime::set_window_size(&pipe, size);
                        }
                    }
                }
            }
        });
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), (pod.to_string(), tx));
        Ok(Session { id, sessions: self.clone(), writer })
    }

    fn sender(&self, id: &str, pod: &str) -> Option<mpsc::Sender<Input>> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id).filter(|(p, _)| p == pod).map(|(_, tx)| tx.clone())
    }
}

/// `POST /exec/input?pod=KEY` with an `ExecInput`: its data (then its end
/// of file) queued for the session's command, in the order posted.
async fn exec_input(req: Request<Incoming>, ctx: Ctx) -> Response<Body> {
    let q = match Query::parse(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let Some(pod) = q.get("pod").map(str::to_string) else {
        return error_response(&error(400, "BadRequest", "pod= is required"));
    };
    let body = match read_body(req.into_body(), EXEC_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let input: specs::api::ExecInput = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error_response(&ApiError::bad_field("(body)", format!("not an exec input: {e}"))),
    };
    if let Some(p) = specs::validate::validate_exec_input(&input).into_iter().next() {
        return error_response(&ApiError::bad_field(p.field, p.message));
    }
    let Some(tx) = ctx.sessions.sender(&input.session, &pod) else {
        return error_response(&error(
            404,
            "NotFound",
            format!("no exec of pod {pod:?} reads session {}", input.session),
        ));
    };
    let mut queued = Vec::new();
    if !input.data.is_empty() {
        queued.push(Input::Data(Bytes::from(input.data.into_bytes())));
    }
    if input.eof {
        queued.push(Input::Eof);
    }
    if let Some(size) = input.resize {
        queued.push(Input::Resize(size));
    }
    for i in queued {
        match tokio::time::timeout(EXEC_INPUT_WAIT, tx.send(i)).await {
            Ok(Ok(())) => {}
            // The exec ended meanwhile: its input has nowhere to go.
            Ok(Err(_)) => return error_response(&error(404, "NotFound", "the exec ended")),
            Err(_) => {
                return error_response(&error(
                    503,
                    "StdinFull",
                    format!("the command has not read its stdin for {}s", EXEC_INPUT_WAIT.as_secs()),
                ))
            }
        }
    }
    let mut r = Response::new(Full::new(Bytes::from_static(b"{}")).boxed());
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

/// The runtime id of a running container of this pod, from the agent's last report.
fn runtime_id(report: &NodeReport, pod: &str, container: &str, uid: Option<&str>) -> Result<String, ApiError> {
    let status =
        report.pods.get(pod).ok_or_else(|| error(404, "NotFound", format!("pod {pod:?} is not on this node")))?;
    if let (Some(want), Some(have)) = (uid, status.pod_uid.as_deref()) {
        if want != have {
            return Err(error(404, "NotFound", format!("pod {pod:?} on this node is another pod (uid {have})")));
        }
    }
    report.running.get(pod).and_then(|c| c.get(container)).cloned().ok_or_else(|| {
        error(409, "ContainerNotRunning", format!("container {container:?} of pod {pod:?} is not running"))
    })
}

/// A request body of at most `limit` bytes, within `HEADER_TIMEOUT`.
async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, ApiError> {
    let read = async {
        let mut buf = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| error(400, "BadRequest", format!("cannot read the body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > limit {
                    return Err(error(413, "RequestEntityTooLarge", format!("the body is over {limit} bytes")));
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(HEADER_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err(error(408, "RequestTimeout", "the body did not arrive in time")))
}

fn frame_line(frame: &ExecFrame) -> Bytes {
    let mut line = serde_json::to_vec(frame).unwrap_or_else(|_| b"{\"type\":\"heartbeat\"}".to_vec());
    line.push(b'\n');
    Bytes::from(line)
}

fn ndjson(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed(ChannelBody(rx)));
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-ndjson"));
    r
}

/// One of the command's output pipes.
struct Output {
    pipe: tokio::net::unix::pipe::Receiver,
    text: TextChunks,
    open: bool,
    buf: Vec<u8>,
}

impl Output {
    /// `tty`: `fd` is a pty's master, not a pipe (see `ExecProcess::tty`).
    fn new(fd: std::os::fd::OwnedFd, tty: bool) -> std::io::Result<Output> {
        let pipe = match tty {
            true => tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)?,
            false => tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?,
        };
        Ok(Output { pipe, text: TextChunks::default(), open: true, buf: vec![0u8; CHUNK] })
    }

    /// The next text read, `None` at the end (with what was held back).
    async fn read(&mut self) -> Option<String> {
        loop {
            match self.pipe.read(&mut self.buf).await {
                Ok(n) if n > 0 => {
                    if let Some(t) = self.text.push(&self.buf[..n]) {
                        return Some(t);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => {
                    self.open = false;
                    return self.text.flush();
                }
            }
        }
    }
}

/// Streams a running exec to `tx` until it ends; the caller going away (`tx`
/// closed) or `stop` ends the command (by dropping its cancel handle).
async fn pump(process: ExecProcess, liveness: Liveness, tx: mpsc::Sender<Bytes>, mut stop: watch::Receiver<bool>) {
    // Returning drops `cancel`, which ends the command unless it has ended.
    let ExecProcess { stdout, stderr, wait, cancel: _cancel, tty, .. } = process;
    let mut waiting = tokio::task::spawn_blocking(wait);
    let (mut out, mut err) = match (Output::new(stdout, tty), Output::new(stderr, false)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            let error = error(500, "ExecFailed", format!("reading the command's output: {e}"));
            let _ = tx.send(frame_line(&ExecFrame::Error { error })).await;
            return;
        }
    };
    let mut last = tokio::time::Instant::now();
    let mut ended: Option<Result<i32, String>> = None;
    let mut drain_until = None;
    while out.open || err.open || ended.is_none() {
        let frame = tokio::select! {
            t = out.read(), if out.open => t.map(|data| ExecFrame::Stdout { data }),
            t = err.read(), if err.open => t.map(|data| ExecFrame::Stderr { data }),
            r = &mut waiting, if ended.is_none() => {
                ended = Some(match r {
                    Ok(Ok(code)) => Ok(code),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(format!("the exec task failed: {e}")),
                });
                drain_until = Some(tokio::time::Instant::now() + EXEC_DRAIN);
                None
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)), if drain_until.is_some() => {
                tracing::debug!("exec: the output stays open after the command ended; not read further");
                break;
            }
            _ = tokio::time::sleep_until(last + liveness.heartbeat) => Some(ExecFrame::Heartbeat),
            _ = tx.closed() => return,
            _ = stop.wait_for(|s| *s) => return,
        };
        if let Some(f) = frame {
            if tx.send(frame_line(&f)).await.is_err() {
                return;
            }
            last = tokio::time::Instant::now();
        }
    }
    let last = match ended {
        Some(Ok(exit_code)) => ExecFrame::Exit { exit_code, message: None },
        Some(Err(message)) => ExecFrame::Error { error: error(500, "ExecFailed", message) },
        None => return,
    };
    let _ = tx.send(frame_line(&last)).await;
}

/// The container's shown state and restart count, from the agent's last report.
fn container_state(report: &NodeReport, pod: &str, container: &str) -> Result<(ContainerState, u32), ApiError> {
    let status =
        report.pods.get(pod).ok_or_else(|| error(404, "NotFound", format!("pod {pod:?} is not on this node")))?;
    // Before the first start the agent may not list the container yet.
    Ok(status
        .container_statuses
        .iter()
        .find(|c| c.name == container)
        .map(|c| (c.state, c.restart_count))
        .unwrap_or((ContainerState::Waiting, 0)))
}

fn running(ctx: &Ctx, pod: &str, container: &str) -> bool {
    matches!(container_state(&ctx.reports.borrow(), pod, container), Ok((ContainerState::Running, _)))
}

async fn stream(
    mut file: tokio::fs::File,
    path: &Path,
    follow: bool,
    pod: &str,
    container: &str,
    mut ctx: Ctx,
    tx: &mpsc::Sender<Bytes>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf).await?;
        if n > 0 {
            if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                return Ok(()); // the reader went away
            }
            continue;
        }
        if !follow {
            return Ok(());
        }
        // At the end: a rotated file continues under the same path.
        let (ours, now) = (file.metadata().await?.ino(), tokio::fs::metadata(path).await.map(|m| m.ino()).ok());
        if now.is_some_and(|ino| ino != ours) {
            file = tokio::fs::File::open(path).await?;
            continue;
        }
        if !running(&ctx, pod, container) {
            // One last read: the exit was recorded after the last byte landed.
            loop {
                let n = file.read(&mut buf).await?;
                if n == 0 || tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                    return Ok(());
                }
            }
        }
        let stopping = tokio::select! {
            _ = tokio::time::sleep(POLL) => false,
            r = ctx.reports.changed() => r.is_err(),
            r = ctx.stop.wait_for(|s| *s) => { drop(r); true }
            _ = tx.closed() => true,
        };
        if stopping {
            return Ok(());
        }
    }
}

/// A streaming body fed by a channel (the log reader writes chunks into it).
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// The log of `container` of the newest pod under `pod_key` (the most
/// recently changed folder of the key, read from the disk), for callers that
/// know no uid; a path that does not exist when the key has no logs.
pub fn newest_log(data_dir: &Path, pod_key: &str, container: &str) -> PathBuf {
    let prefix = format!("{}_", crate::agent::reconcile::key_dir(pod_key));
    let logs = data_dir.join("logs");
    let newest = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().and_then(|n| n.strip_prefix(&prefix)).is_some_and(|uid| !uid.contains('_')))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    let dir = newest.map_or_else(|| logs.join(crate::agent::reconcile::key_dir(pod_key)), |e| e.path());
    dir.join(format!("{}.log", crate::agent::reconcile::sanitize(container, 120)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A session takes input only for its own pod, in order, the end of
    /// file closing the pipe; once dropped (the exec ended) it takes none.
    #[tokio::test]
    async fn an_exec_session_feeds_its_pipe_for_its_pod_only() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let sessions = Sessions::default();
        let session = sessions.open("ns/web", write, false).unwrap();
        assert_eq!(session.id.len(), 32);
        assert!(sessions.sender(&session.id, "ns/other").is_none(), "another pod's caller");
        let tx = sessions.sender(&session.id, "ns/web").unwrap();
        tx.send(Input::Data(Bytes::from_static(b"one "))).await.unwrap();
        tx.send(Input::Data(Bytes::from_static(b"two"))).await.unwrap();
        tx.send(Input::Eof).await.unwrap();
        let got = tokio::task::spawn_blocking(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut s).map(|_| s)
        });
        assert_eq!(got.await.unwrap().unwrap(), "one two");
        let id = session.id.clone();
        drop(session);
        assert!(sessions.sender(&id, "ns/web").is_none(), "a session ends with its exec");
    }

    #[test]
    fn the_newest_log_of_a_key_is_found_without_its_uid() {
        let dir = tempfile::tempdir().unwrap();
        let old = crate::agent::reconcile::container_log_path(dir.path(), "static/web", "h1", "main");
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        // Another key that shares the prefix is never taken for this one.
        let other = crate::agent::reconcile::container_log_path(dir.path(), "static/web/x", "u", "main");
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        assert_eq!(newest_log(dir.path(), "static/web", "main"), old);
        assert_eq!(newest_log(dir.path(), "static/none", "main"), dir.path().join("logs/static_none/main.log"));
    }
}
