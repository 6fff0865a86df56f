//! The joined nodelet's own HTTPS endpoint: container logs, read by the
//! server's proxy (`GET /api/v1/pods/{name}/log`), as the kubelet serves them to
//! the API server.
//!
//! TLS with the node certificate from the join (it names the node); a client
//! certificate from the same CA is required, and only the server's proxy
//! identity or the admin may read. HTTP/2 or HTTP/1.1 as the caller chose over
//! ALPN (the server keeps one pooled connection per node). One route:
//! `GET /logs?pod=KEY&container=NAME&follow=BOOL` (the server also sends the
//! pod's `uid`).
//!
//! Following: the file is read to its end, then re-read when the agent
//! publishes a report or every `POLL`, until the container is no longer
//! running. The shim writes the exit record only after the last byte is in the
//! file, so "not running" seen at the end of the file means nothing is missing.
//! A rotation (the path now names another inode) is followed to the new file.
//!
//! At most `EndpointConfig::max_connections` connections are served at once
//! (the accept loop waits beyond, so a flood of callers costs a backlog, not
//! memory); a quiet connection gets an HTTP/2 PING every heartbeat and TCP
//! keepalive, so a caller whose path went silent is let go.

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
use pinion_client::query::Query;
use pinion_client::tls::{common_name, ADMIN_CN, PROXY_CN};
use specs::api::{ApiError, Liveness};
use specs::status::ContainerState;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::source::NodeReport;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);
const CHUNK: usize = 64 * 1024;

type Body = BoxBody<Bytes, Infallible>;

#[derive(Debug, Clone, Copy)]
pub struct EndpointConfig {
    pub liveness: Liveness,
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
    data_dir: PathBuf,
    reports: watch::Receiver<NodeReport>,
    stop: watch::Receiver<bool>,
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    config: EndpointConfig,
    data_dir: PathBuf,
    reports: watch::Receiver<NodeReport>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let ctx = Ctx { data_dir, reports, stop: stop.clone() };
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.wait_for(|s| *s) => return,
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
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
        pinion_client::keep_alive(&tcp, &config.liveness);
        let (acceptor, ctx) = (acceptor.clone(), ctx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "endpoint: TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "endpoint: TLS handshake timed out"),
            };
            let caller = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(common_name);
            let allowed = matches!(caller.as_deref(), Some(PROXY_CN) | Some(ADMIN_CN));
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let ctx = ctx.clone();
                let caller = caller.clone();
                async move {
                    if !allowed {
                        let who = caller.unwrap_or_default();
                        return Ok::<_, Infallible>(error_response(&error(
                            403,
                            "Forbidden",
                            format!("certificate {who:?} may not read this node's logs"),
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
            if let Err(e) = builder.serve_connection(TokioIo::new(tls), svc).await {
                tracing::debug!(error = %e, "endpoint: connection ended");
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
    if req.uri().path() != "/logs" {
        return error_response(&error(404, "NotFound", format!("no route {}", req.uri().path())));
    }
    if req.method() != Method::GET {
        return error_response(&error(405, "MethodNotAllowed", "only GET"));
    }
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
        None => crate::agent::reconcile::log_path(&ctx.data_dir, &pod, &container),
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
