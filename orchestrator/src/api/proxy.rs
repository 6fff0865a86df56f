//! The server's proxy to a nodelet's endpoint (`pinion logs` reads a
//! container's log through it, `pinion exec` runs a command through it): one
//! pooled client per node, so a second `logs` call, or many following the
//! same node, reuse the connection (and HTTP/2 carries them all on it). The
//! node's certificate must name the node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Response;
use pinion_wire::{Client, ClientError};

use specs::api::{ExecFrame, ExecRequest, Liveness};
use tokio::sync::{mpsc, watch};

use super::error::error;
use super::{error_response, Body, ChannelBody};

/// How long the node has to send the reply's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(15);

/// A pooled client per node, rebuilt when the node registers another endpoint.
pub struct NodeClients {
    tls: Arc<rustls::ClientConfig>,
    /// The server's own: a node connection that goes silent is found dead
    /// within the same bound as a client's.
    liveness: specs::api::Liveness,
    clients: Mutex<HashMap<String, (String, Client)>>,
}

impl NodeClients {
    /// `tls`: trusts only our CA and presents the proxy identity.
    pub fn new(tls: Arc<rustls::ClientConfig>, liveness: specs::api::Liveness) -> NodeClients {
        NodeClients { tls, liveness, clients: Mutex::new(HashMap::new()) }
    }

    fn client(&self, node: &str, endpoint: &str) -> Result<Client, ClientError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, c)) = clients.get(node) {
            if at == endpoint {
                return Ok(c.clone());
            }
        }
        // Clones of one rustls configuration share its session cache.
        let c = Client::with_tls(&[format!("https://{endpoint}")], Some(node), (*self.tls).clone())?
            .with_liveness(self.liveness);
        clients.insert(node.to_string(), (endpoint.to_string(), c.clone()));
        Ok(c)
    }
}

/// A nodelet's reply whose body is still to be read.
pub struct NodeStream {
    pub status: hyper::StatusCode,
    pub content_type: Option<hyper::header::HeaderValue>,
    pub body: hyper::body::Incoming,
}

/// `GET https://endpoint/path` on a nodelet, whose certificate must name
/// `node`, over the node's pooled connection; the reply's head has a timeout.
/// Shared by the log proxy and attach.
pub async fn open_node_stream(
    clients: &NodeClients,
    node: &str,
    endpoint: &str,
    path: &str,
) -> Result<NodeStream, specs::api::ApiError> {
    let unreachable = |what: String| error(502, "NodeUnreachable", format!("node {node:?} at {endpoint}: {what}"));
    let client = clients.client(node, endpoint).map_err(|e| unreachable(e.to_string()))?;
    let resp = match tokio::time::timeout(HEAD_TIMEOUT, client.get(path)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Err(_) => return Err(unreachable("no reply in time".into())),
    };
    let status = resp.status();
    let content_type = resp.headers().get(hyper::header::CONTENT_TYPE).cloned();
    Ok(NodeStream { status, content_type, body: resp.into_body() })
}

/// Streams `GET https://endpoint/path` from a nodelet, whose certificate must
/// name `node`. Refusals from the nodelet pass through with their status. A
/// node stream that breaks (or the server shutting down) ends the reply with
/// an error, never cleanly: `logs -f` must resume, not take it for the end.
pub async fn proxy(
    clients: &NodeClients,
    node: &str,
    endpoint: &str,
    path: &str,
    mut shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    let upstream = match open_node_stream(clients, node, endpoint, path).await {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    let NodeStream { status, content_type, body } = upstream;
    let mut body = body;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let broke = loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = shutdown.changed() => break "the server is shutting down".to_string(),
                _ = tx.closed() => return,
            };
            match frame {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        if tx.send(Ok(data)).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "log stream from the node broke");
                    break format!("the stream from the node broke: {e}");
                }
                None => return,
            }
        };
        let _ = tx.send(Err(std::io::Error::other(broke))).await;
    });
    let mut r = Response::new(BodyExt::boxed(ChannelBody::new(rx)));
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, ct);
    }
    r
}

/// `POST https://endpoint/path` with an exec's `input` on a nodelet: `{}`
/// once the node queued it for the command, or the node's refusal as it
/// gave it (404 when that exec is over).
pub async fn exec_input(
    clients: &NodeClients,
    node: &str,
    endpoint: &str,
    path: &str,
    input: &specs::api::ExecInput,
) -> Response<Body> {
    let unreachable = |what: String| error(502, "NodeUnreachable", format!("node {node:?} at {endpoint}: {what}"));
    let client = match clients.client(node, endpoint) {
        Ok(c) => c,
        Err(e) => return error_response(&unreachable(e.to_string())),
    };
    let body = match serde_json::to_vec(input) {
        Ok(b) => Bytes::from(b),
        Err(e) => return error_response(&error(500, "Internal", format!("encoding the input: {e}"))),
    };
    let sent = client.call::<serde_json::Value>(hyper::Method::POST, path, Some(("application/json", body)));
    match tokio::time::timeout(HEAD_TIMEOUT, sent).await {
        Ok(Ok(_)) => super::json_response(200, b"{}".to_vec()),
        Ok(Err(ClientError::Api(e))) => error_response(&e),
        Ok(Err(e)) => error_response(&unreachable(e.to_string())),
        Err(_) => error_response(&unreachable("no reply in time".into())),
    }
}

/// `POST https://endpoint/path` with `request` on a nodelet: the exec's
/// frames relayed as they come. A hop of its own for liveness: the node's
/// heartbeats are read (its silence past the bound ends the exec with an
/// error frame) and dropped, and this server sends its own to the caller
/// every `liveness.heartbeat` while nothing else goes out. The caller going
/// away drops the node's stream, which ends the command on the node. A
/// refusal from the node passes through with its status.
pub async fn exec(
    clients: &NodeClients,
    node: &str,
    endpoint: &str,
    path: &str,
    request: &ExecRequest,
    liveness: Liveness,
    mut shutdown: watch::Receiver<bool>,
) -> Response<Body> {
    let unreachable = |what: String| error(502, "NodeUnreachable", format!("node {node:?} at {endpoint}: {what}"));
    let client = match clients.client(node, endpoint) {
        Ok(c) => c,
        Err(e) => return error_response(&unreachable(e.to_string())),
    };
    let mut upstream = match tokio::time::timeout(HEAD_TIMEOUT, client.post_frames::<_, ExecFrame>(path, request)).await
    {
        Ok(Ok(s)) => s,
        Ok(Err(ClientError::Api(e))) => return error_response(&e),
        Ok(Err(e)) => return error_response(&unreachable(e.to_string())),
        Err(_) => return error_response(&unreachable("no reply in time".into())),
    };
    // Read in a task of its own: a read cut short by a heartbeat would start
    // the silence bound over.
    let (frames_tx, mut frames) = mpsc::channel::<Result<Option<ExecFrame>, ClientError>>(16);
    let reader = tokio::spawn(async move {
        loop {
            let next = upstream.next().await;
            let last = !matches!(next, Ok(Some(_)));
            if frames_tx.send(next).await.is_err() || last {
                return;
            }
        }
    });
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let node = node.to_string();
    tokio::spawn(async move {
        let send = |frame: &ExecFrame| {
            let mut line = serde_json::to_vec(frame).unwrap_or_default();
            line.push(b'\n');
            tx.send(Ok(Bytes::from(line)))
        };
        let broke = |why: String| ExecFrame::Error {
            error: error(
                502,
                "NodeUnreachable",
                format!("the exec stream from node {node:?} {why}; the command is ended there"),
            ),
        };
        let mut last = tokio::time::Instant::now();
        loop {
            let frame = tokio::select! {
                f = frames.recv() => match f {
                    // The node's heartbeat: this hop sends its own.
                    Some(Ok(Some(ExecFrame::Heartbeat))) => continue,
                    Some(Ok(Some(f))) => f,
                    Some(Ok(None)) | None => broke("ended without an exit code".into()),
                    Some(Err(e)) => broke(format!("broke: {e}")),
                },
                _ = tokio::time::sleep_until(last + liveness.heartbeat) => ExecFrame::Heartbeat,
                _ = tx.closed() => break,
                _ = shutdown.changed() => {
                    let error = error(503, "ShuttingDown", "the server is shutting down; the command is ended");
                    let _ = send(&ExecFrame::Error { error }).await;
                    break;
                }
            };
            let done = matches!(frame, ExecFrame::Exit { .. } | ExecFrame::Error { .. });
            if send(&frame).await.is_err() || done {
                break;
            }
            last = tokio::time::Instant::now();
        }
        reader.abort();
    });
    let mut r = Response::new(BodyExt::boxed(ChannelBody::new(rx)));
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-ndjson"));
    r
}
