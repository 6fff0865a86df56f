//! The server's proxy to a nodelet's endpoint (`pinion logs` reads a
//! container's log through it): one pooled client per node, so a second
//! `logs` call, or many following the same node, reuse the connection (and
//! HTTP/2 carries them all on it). The node's certificate must name the node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Response;
use pinion_client::{Client, ClientError};

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
