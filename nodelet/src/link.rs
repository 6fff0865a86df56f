//! The nodelet's link to an orchestrator: join once with the bootstrap token,
//! register the node, then three loops for as long as the agent runs, all over
//! one pooled client (one connection when the server speaks HTTP/2; no new
//! handshake per report or heartbeat):
//! - bindings: list the node's pods, then watch from that version (a stream, so a
//!   bound pod reaches the agent at once); every reconnect starts with a full
//!   `Resync`, so nothing missed while away survives as a ghost;
//! - reports: as soon as the agent publishes a new `NodeReport` (what it
//!   publishes while a report is in flight goes in the next one), what changed since the last acknowledged report goes
//!   to the node's status: the pods whose status changed and the node's
//!   allocations; every (re)registration starts over with a full report. An
//!   engine rejection of a bound pod is reported once;
//! - heartbeats, only as liveness;
//! - peers: the other nodes' pod ranges and addresses, from their watch
//!   (`peers`), and the node's own range from each registration's reply;
//! - renewal: two thirds into the node certificate's life a fresh one is
//!   asked for (`POST /api/v1/renew`), written to `node.conf` and presented
//!   by every new connection from then on, with no restart; a certificate
//!   that expired while the node was cut off is replaced by joining again
//!   with the node's join record (`DATA_DIR/join-attempt`), under its name.
//!
//! While the server is unreachable the agent keeps running its pods; the loops
//! retry with a capped backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::Method;
use pinion_wire::backoff::Doubling;
use pinion_wire::tls::{ca_pin, CertificateFacts, Credentials, JoinToken, LiveIdentity, TlsError};
use pinion_wire::{percent_encode, Client, ClientError};
use specs::api::{List, Node, NodeSpec, NodeStatus, NodeStatusReport, PodRejection, WatchEventType};
use specs::pod::{ObjectMeta, API_VERSION};
use specs::{Allocations, NodeSettings, NodeTopology, Pod, PodPhase, PodStatus};
use tokio::sync::{mpsc, watch};

use crate::peers::NetView;
use crate::source::{BoundPlan, DesiredChange, NodeReport, SourceKind};

// Well inside the server's default 40 s grace, and inside short test graces.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(3);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);
const RETRY: Doubling = Doubling::new(RETRY_MIN, RETRY_MAX);
/// How long a first join keeps retrying a server that does not answer.
const JOIN_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(
        "{path} belongs to the servers {has:?}, none of {wanted:?}; give one of its servers too, or remove it to join another cluster"
    )]
    OtherServer { path: PathBuf, has: Vec<String>, wanted: Vec<String> },
    #[error("--token is required for the first join (no {} yet)", path.display())]
    NoToken { path: PathBuf },
    #[error("--token: {0}")]
    BadToken(TlsError),
    #[error("--ca {}: {source}", path.display())]
    ReadCa { path: PathBuf, source: std::io::Error },
    #[error("--ca {} is not the CA the join token pins", path.display())]
    CaNotPinned { path: PathBuf },
    #[error(
        "this join token has no CA pin (PIN.SECRET, as `pinion server` prints it): give the server's CA with --ca FILE"
    )]
    NoPin,
    #[error("joining {servers:?} as node {node}: {source}")]
    Join { servers: Vec<String>, node: String, source: Box<ClientError> },
    #[error("{}: the join attempt id: {source}", path.display())]
    JoinAttempt { path: PathBuf, source: std::io::Error },
    #[error("the server sent a CA that the join token does not pin")]
    WrongCa,
    #[error(transparent)]
    Credentials(#[from] TlsError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the watch stream ended")]
    WatchEnded,
    #[error("the agent stopped taking changes")]
    AgentGone,
    #[error("cannot encode the node: {0}")]
    Encode(serde_json::Error),
    #[error("{}: recording the node's pod range: {source}", path.display())]
    OwnRange { path: PathBuf, source: std::io::Error },
}

/// What the link needs to join and to register the node.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// `https://HOST:PORT` of each server of the cluster, tried in this order
    /// (before any others the node's credentials list).
    pub servers: Vec<String>,
    /// The bootstrap token (`PIN.SECRET` or a bare secret); first join only.
    pub token: Option<String>,
    /// The server's CA certificate (PEM file); needed only for a token without a pin.
    pub ca: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub node_name: String,
    pub topology: NodeTopology,
    pub settings: NodeSettings,
    pub labels: BTreeMap<String, String>,
    /// `HOST:PORT` of this node's HTTPS endpoint, registered for the server.
    pub endpoint: Option<String>,
    /// The address the other nodes reach this one on (`spec.address`).
    pub address: Option<std::net::IpAddr>,
    /// The watch's bound on silence (the server's heartbeat, times three).
    pub liveness: specs::api::Liveness,
}

/// The node's credentials file under the agent's data dir.
pub fn credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.conf")
}

/// Loads the node's credentials, joining with the token on first start.
/// The servers given come first in the list the node keeps; servers the
/// file knows that were not given stay after them. A list that shares no
/// server with the file's is taken for another cluster's.
pub async fn credentials(cfg: &LinkConfig) -> Result<Credentials, LinkError> {
    let path = credentials_path(&cfg.data_dir);
    if path.exists() {
        let mut creds = Credentials::load(&path)?;
        if !cfg.servers.is_empty() && !cfg.servers.iter().any(|s| creds.servers.contains(s)) {
            return Err(LinkError::OtherServer { path, has: creds.servers, wanted: cfg.servers.clone() });
        }
        let servers = Credentials::merge_servers(&cfg.servers, &creds.servers);
        if servers != creds.servers {
            creds.servers = servers;
            creds.save(&path)?;
            tracing::info!(servers = ?creds.servers, "the node's list of servers changed");
        }
        return Ok(creds);
    }
    let Some(token) = &cfg.token else { return Err(LinkError::NoToken { path }) };
    let parsed = JoinToken::parse(token).map_err(LinkError::BadToken)?;
    let client = match (&cfg.ca, parsed.ca_pin) {
        (Some(ca_path), pin) => {
            let ca = std::fs::read_to_string(ca_path)
                .map_err(|source| LinkError::ReadCa { path: ca_path.clone(), source })?;
            if pin.is_some_and(|p| ca_pin(&ca).ok() != Some(p)) {
                return Err(LinkError::CaNotPinned { path: ca_path.clone() });
            }
            Client::anonymous(&cfg.servers, &ca)?
        }
        (None, Some(pin)) => Client::pinned(&cfg.servers, pin)?,
        (None, None) => return Err(LinkError::NoPin),
    };
    let attempt = join_attempt(&cfg.data_dir)?;
    let joined = join_with_retries(&client, token, &cfg.node_name, &attempt).await.map_err(|source| {
        LinkError::Join { servers: cfg.servers.clone(), node: cfg.node_name.clone(), source: Box::new(source) }
    })?;
    if parsed.ca_pin.is_some_and(|p| ca_pin(&joined.ca_cert).ok() != Some(p)) {
        return Err(LinkError::WrongCa);
    }
    let creds = Credentials {
        servers: Credentials::merge_servers(&cfg.servers, &joined.servers),
        ca_cert: joined.ca_cert,
        client_cert: joined.client_cert,
        client_key: joined.client_key,
    };
    creds.save(&path)?;
    // The join record stays: it joins this node again, under its name,
    // should its certificate expire while it is cut off.
    tracing::info!(node = %cfg.node_name, servers = ?creds.servers, "joined");
    Ok(creds)
}

fn join_attempt_path(data_dir: &Path) -> PathBuf {
    data_dir.join("join-attempt")
}

/// This machine's join record, kept on disk (durably, 0600, before the first
/// try) for as long as the node's data dir: a join whose reply was lost,
/// retried here or by running the agent again, and a node whose certificate
/// expired while it was cut off, join again with it under the same name. It
/// is a secret: while the node holds its name, it stands in for a token.
fn join_attempt(data_dir: &Path) -> Result<String, LinkError> {
    let path = join_attempt_path(data_dir);
    let io = |source| LinkError::JoinAttempt { path: path.clone(), source };
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let attempt = pinion_wire::tls::new_join_attempt()?;
    std::fs::create_dir_all(data_dir).map_err(io)?;
    crate::fsutil::write_atomic(&path, attempt.as_bytes()).map_err(io)?;
    Ok(attempt)
}

/// Joins, retrying what the network or a restarting server may fix (no
/// answer, 5xx) for up to `JOIN_DEADLINE`; a refusal (4xx) is final.
async fn join_with_retries(
    client: &Client,
    token: &str,
    node: &str,
    attempt: &str,
) -> Result<specs::api::JoinResponse, ClientError> {
    let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
    let mut wait = RETRY_MIN;
    loop {
        match client.join(token, node, Some(attempt)).await {
            Err(ClientError::Api(e)) if e.code < 500 => return Err(ClientError::Api(e)),
            Err(e) if tokio::time::Instant::now() + wait < deadline => {
                tracing::warn!(node, error = %e, retry_in = ?wait, "join failed; retrying");
                tokio::time::sleep(wait).await;
                wait = RETRY.after(wait);
            }
            result => return result,
        }
    }
}

/// Runs the link until `stop` turns true. Returns an error only for what
/// retrying cannot fix (bad credentials on disk); network trouble is retried.
/// The node's labels: its boot profile's (`pinion.io/kernel-rt`), then the
/// operator's own (`--labels`), which win.
fn node_labels(cfg: &LinkConfig) -> BTreeMap<String, String> {
    let mut labels = cfg.topology.kernel.labels();
    labels.extend(cfg.labels.clone());
    labels
}

pub async fn run(
    cfg: LinkConfig,
    creds: Credentials,
    live: Arc<LiveIdentity>,
    changes: mpsc::Sender<DesiredChange>,
    reports: watch::Receiver<NodeReport>,
    net_view: watch::Sender<NetView>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), LinkError> {
    let client = Client::with_identity(&creds, live.clone())?.with_liveness(cfg.liveness);
    let renewal = renewal_loop(client.clone(), cfg.clone(), creds.clone(), live, stop.clone());
    let node = Node {
        api_version: API_VERSION.into(),
        kind: "Node".into(),
        metadata: ObjectMeta { name: cfg.node_name.clone(), labels: node_labels(&cfg), ..Default::default() },
        spec: NodeSpec {
            topology: cfg.topology.clone(),
            settings: cfg.settings.clone(),
            endpoint: cfg.endpoint.clone(),
            address: cfg.address.map(|a| a.to_string()),
            ..Default::default()
        },
        status: NodeStatus::default(),
    };
    let body = Bytes::from(serde_json::to_vec(&node).map_err(LinkError::Encode)?);
    let registration = Registration { body, view: net_view.clone(), data_dir: cfg.data_dir.clone() };
    let name = cfg.node_name.clone();
    let rejected = Rejected::default();
    // Bumped by every registration and by a heartbeat that gets through after
    // failing ones: reports and heartbeats wait for the first (the server knows
    // no node before it), and each bump makes the next report a full one (the
    // server may have marked pods Unknown meanwhile).
    let (full, registered) = watch::channel(0u64);
    let full = Arc::new(full);
    let bindings = bindings_loop(
        client.clone(),
        name.clone(),
        registration,
        changes,
        rejected.clone(),
        full.clone(),
        stop.clone(),
    );
    let reports = reports_loop(client.clone(), name.clone(), reports, rejected, registered.clone(), stop.clone());
    let peers = {
        let (client, name, mut registered, mut stop) = (client.clone(), name.clone(), registered.clone(), stop.clone());
        async move {
            if registered_or_stop(&mut registered, &mut stop).await {
                crate::peers::follow(client, name, net_view, stop).await;
            }
        }
    };
    let heartbeats = heartbeat_loop(client, name, full, registered, stop.clone());
    tokio::select! {
        _ = stop.wait_for(|s| *s) => {}
        _ = bindings => {}
        _ = reports => {}
        _ = heartbeats => {}
        _ = renewal => {}
        _ = peers => {}
    }
    Ok(())
}

/// What a registration sends, and where its reply's pod range goes.
#[derive(Clone)]
struct Registration {
    body: Bytes,
    view: watch::Sender<NetView>,
    data_dir: PathBuf,
}

/// The longest sleep between looks at the certificate: its renewal time is on
/// the realtime clock, which may jump; a sleep is on the monotonic one.
const RENEWAL_RECHECK: Duration = Duration::from_secs(600);

/// Renews the node's certificate two thirds into its life, for as long as
/// the link runs (as the kubelet rotates its client certificate): the new
/// one is written to `node.conf` (atomically, 0600) before new connections
/// present it. A failure is retried with a capped backoff, each try bounded
/// by the client's request timeout; one that expired meanwhile is replaced
/// by joining again with the node's join record.
async fn renewal_loop(
    client: Client,
    cfg: LinkConfig,
    mut creds: Credentials,
    live: Arc<LiveIdentity>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = RETRY_MIN;
    loop {
        let facts = match CertificateFacts::from_pem(&creds.client_cert, "node.conf") {
            Ok(f) => f,
            Err(e) => return tracing::error!(error = %e, "the node certificate cannot be read; it is not renewed"),
        };
        let now = SystemTime::now();
        if let Ok(wait) = facts.renew_at().duration_since(now) {
            if sleep_or_stop(wait.min(RENEWAL_RECHECK), &mut stop).await {
                return;
            }
            continue;
        }
        let expired = now >= facts.not_after;
        let renewed = if expired { rejoin(&cfg, &creds).await } else { renew(&client, &creds).await };
        match renewed.and_then(|next| {
            next.save(&credentials_path(&cfg.data_dir))?;
            live.replace(&next)?;
            Ok(next)
        }) {
            Ok(next) => {
                let until = CertificateFacts::from_pem(&next.client_cert, "renewed").ok().map(|f| f.not_after);
                tracing::info!(node = %cfg.node_name, rejoined = expired, ?until, "node certificate renewed");
                creds = next;
                delay = RETRY_MIN;
            }
            Err(e) => {
                tracing::warn!(node = %cfg.node_name, error = %e, retry_in = ?delay, "cannot renew the node certificate; pods keep running");
                if sleep_or_stop(delay, &mut stop).await {
                    return;
                }
                delay = next_delay(delay);
            }
        }
    }
}

/// A fresh certificate for the same node and incarnation.
async fn renew(client: &Client, creds: &Credentials) -> Result<Credentials, LinkError> {
    let (_, r): (u16, specs::api::Renewed) = client.call(Method::POST, "/api/v1/renew", None).await?;
    Ok(Credentials {
        servers: Credentials::merge_servers(&creds.servers, &r.servers),
        ca_cert: r.ca_cert,
        client_cert: r.client_cert,
        client_key: r.client_key,
    })
}

/// Joins again under the node's name with its join record (and the token, if
/// one was given: the record alone suffices while the node holds its name),
/// trusting the CA the node already has.
async fn rejoin(cfg: &LinkConfig, creds: &Credentials) -> Result<Credentials, LinkError> {
    let attempt = join_attempt(&cfg.data_dir)?;
    let client = Client::anonymous(&creds.servers, &creds.ca_cert)?;
    let joined = client.join(cfg.token.as_deref().unwrap_or(""), &cfg.node_name, Some(&attempt)).await?;
    if ca_pin(&joined.ca_cert)? != ca_pin(&creds.ca_cert)? {
        return Err(LinkError::WrongCa);
    }
    Ok(Credentials {
        servers: Credentials::merge_servers(&creds.servers, &joined.servers),
        ca_cert: joined.ca_cert,
        client_cert: joined.client_cert,
        client_key: joined.client_key,
    })
}

/// (pod, message) pairs already reported as rejections, shared by the two
/// loops: a binding that arrives again (the server retried the pod here) clears
/// its pod's entries, so a second refusal is reported too.
#[derive(Clone, Default)]
struct Rejected(Arc<Mutex<BTreeSet<(String, String)>>>);

impl Rejected {
    fn set(&self) -> MutexGuard<'_, BTreeSet<(String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, pod: &str) {
        self.set().retain(|(p, _)| p != pod);
    }
}

fn next_delay(d: Duration) -> Duration {
    RETRY.after(d)
}

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

/// Waits for the first registration; false when stopping first.
async fn registered_or_stop(registered: &mut watch::Receiver<u64>, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        r = registered.wait_for(|n| *n > 0) => r.is_ok(),
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// What the agent was last told about one orchestrator pod, so that status-only
/// changes (the server echoing our own reports) are not sent again.
#[derive(PartialEq)]
struct Sent {
    spec: String,
    plan_epoch: Option<u64>,
}

fn desired(pod: &Pod, node: &str) -> Option<(Option<BoundPlan>, Sent)> {
    if pod.spec.node_name.as_deref() != Some(node) {
        return None;
    }
    let status = pod.status.as_ref();
    let plan = status.and_then(|s| s.plan.clone()).map(|p| BoundPlan { epoch: p.epoch, placement: p.placement });
    let spec = serde_json::to_string(&pod.spec).unwrap_or_default();
    let sent = Sent { spec, plan_epoch: plan.as_ref().map(|p| p.epoch) };
    Some((plan, sent))
}

async fn bindings_loop(
    client: Client,
    name: String,
    registration: Registration,
    changes: mpsc::Sender<DesiredChange>,
    rejected: Rejected,
    registered: Arc<watch::Sender<u64>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = RETRY_MIN;
    loop {
        match session(&client, &name, &registration, &changes, &rejected, &registered, &mut stop).await {
            Ok(()) => return, // stopped
            Err(LinkError::AgentGone) => return,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "link to the server lost; pods keep running");
            }
        }
        if sleep_or_stop(delay, &mut stop).await {
            return;
        }
        delay = next_delay(delay);
    }
}

/// One connected session: register (and record the pod range the reply
/// brings, before any binding), list (resync), then follow the watch,
/// resuming it from the version it reached when it dies (on the next server,
/// when the client knows several: they share the versions, so nothing is
/// missed or seen twice) and listing again only when that version is gone.
async fn session(
    client: &Client,
    name: &str,
    registration: &Registration,
    changes: &mpsc::Sender<DesiredChange>,
    rejected: &Rejected,
    registered: &watch::Sender<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), LinkError> {
    let body = Some(("application/json", registration.body.clone()));
    let (_, me) = client.call::<Node>(Method::POST, "/api/v1/nodes", body).await?;
    let Registration { view, data_dir, .. } = registration;
    crate::peers::learn_own(view, data_dir, &me)
        .map_err(|source| LinkError::OwnRange { path: crate::peers::own_cidr_path(data_dir), source })?;
    registered.send_modify(|n| *n += 1);
    loop {
        match follow(client, name, changes, rejected, stop).await {
            Err(LinkError::Client(ClientError::Api(e))) if e.code == 410 => {
                tracing::info!(error = %e.message, "the binding watch's version is gone; listing again");
            }
            other => return other,
        }
    }
}

/// List (resync), then follow the watch until it cannot be resumed.
async fn follow(
    client: &Client,
    name: &str,
    changes: &mpsc::Sender<DesiredChange>,
    rejected: &Rejected,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), LinkError> {
    let path = format!("/api/v1/pods?nodeName={}", percent_encode(name));
    let (_, list): (u16, List<Pod>) = client.call(Method::GET, &path, None).await?;
    let mut sent: BTreeMap<String, Sent> = BTreeMap::new();
    let mut pods = Vec::new();
    for pod in list.items {
        if let Some((plan, s)) = desired(&pod, name) {
            sent.insert(pod.metadata.name.clone(), s);
            pods.push((pod.metadata.name.clone(), pod, plan));
        }
    }
    tracing::info!(pods = pods.len(), version = list.resource_version, "connected to the server");
    let send = |ch: DesiredChange| async move { changes.send(ch).await.map_err(|_| LinkError::AgentGone) };
    send(DesiredChange::Resync { source: SourceKind::Orchestrator, pods }).await?;
    let mut w = client.watch_pods(Some(name), None, Some(list.resource_version)).await?;
    let mut resumed_from = None;
    loop {
        let next = tokio::select! {
            n = w.next() => n,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let lost = match next {
            Ok(Some(change)) => Ok(change),
            Ok(None) => Err(LinkError::WatchEnded),
            Err(e) if e.is_dead_stream() => Err(e.into()),
            Err(e) => return Err(e.into()),
        };
        let (ty, pod) = match lost {
            Ok(change) => change,
            // A dead path (silence past the bound, a broken connection) or a
            // server that ended the stream (shutting down): resume from the
            // version reached, on a new connection, at once if the stream
            // made progress since the last resume, else through the
            // session's backoff (a stream that dies at once every time must
            // not be reopened in a tight loop); a refusal (410 Gone) lists
            // again.
            Err(e) => {
                let from = w.resource_version().unwrap_or(list.resource_version);
                if resumed_from == Some(from) {
                    return Err(e);
                }
                resumed_from = Some(from);
                tracing::warn!(error = %e, from, "binding watch lost; resuming");
                w = client.watch_pods(Some(name), None, Some(from)).await?;
                continue;
            }
        };
        let key = pod.metadata.name.clone();
        match ty {
            WatchEventType::Added | WatchEventType::Modified => match desired(&pod, name) {
                Some((plan, s)) => {
                    if sent.get(&key) != Some(&s) {
                        sent.insert(key.clone(), s);
                        rejected.forget(&key);
                        send(DesiredChange::Apply { key, pod: Box::new(pod), plan }).await?;
                    }
                }
                None => {
                    if sent.remove(&key).is_some() {
                        rejected.forget(&key);
                        send(DesiredChange::Remove { key }).await?;
                    }
                }
            },
            WatchEventType::Deleted => {
                sent.remove(&key);
                rejected.forget(&key);
                send(DesiredChange::Remove { key }).await?;
            }
            WatchEventType::Error => return Err(LinkError::WatchEnded),
            // Read inside the client; never returned.
            WatchEventType::Bookmark => {}
        }
    }
}

/// What the server acknowledged last, within one registration.
#[derive(Default)]
struct Acked {
    registration: u64,
    allocations: Allocations,
    pods: BTreeMap<String, PodStatus>,
    offline_cpus: specs::CpuSet,
    conditions: Vec<specs::api::Condition>,
    terminating: Vec<specs::api::TerminatingPod>,
}

/// The report to send: the pods whose status differs from the acknowledged
/// one and the node's allocations; `None` when nothing changed.
fn delta(acked: &Acked, name: &str, current: &NodeReport) -> Option<NodeStatusReport> {
    let pods: BTreeMap<String, PodStatus> = orchestrator_pods(current)
        .filter(|(k, s)| acked.pods.get(*k) != Some(*s))
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    if pods.is_empty()
        && current.allocations == acked.allocations
        && current.offline_cpus == acked.offline_cpus
        && current.conditions == acked.conditions
        && current.terminating == acked.terminating
        && acked.registration > 0
    {
        return None;
    }
    Some(NodeStatusReport {
        node_name: name.to_string(),
        allocations: current.allocations.clone(),
        pods,
        offline_cpus: current.offline_cpus.clone(),
        conditions: current.conditions.clone(),
        terminating: current.terminating.clone(),
    })
}

fn orchestrator_pods(report: &NodeReport) -> impl Iterator<Item = (&String, &PodStatus)> {
    report.pods.iter().filter(|(k, _)| SourceKind::of_key(k) == SourceKind::Orchestrator)
}

async fn reports_loop(
    client: Client,
    name: String,
    mut reports: watch::Receiver<NodeReport>,
    rejected: Rejected,
    mut registered: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    if !registered_or_stop(&mut registered, &mut stop).await {
        return;
    }
    let mut acked = Acked::default();
    let mut delay = RETRY_MIN;
    loop {
        let report = reports.borrow_and_update().clone();
        let registration = *registered.borrow_and_update();
        if registration != acked.registration {
            // A new registration: the server may have missed anything, send it all.
            acked = Acked::default();
        }
        // The agent has not published yet when the report has no node name.
        let outcome = if report.node_name.is_empty() {
            Ok(())
        } else {
            let refusals = new_refusals(&report, &rejected);
            push_report(&client, &name, delta(&acked, &name, &report), refusals, &rejected).await
        };
        match outcome {
            Ok(()) => {
                if !report.node_name.is_empty() {
                    acked = Acked {
                        registration,
                        allocations: report.allocations.clone(),
                        pods: orchestrator_pods(&report).map(|(k, s)| (k.clone(), s.clone())).collect(),
                        offline_cpus: report.offline_cpus.clone(),
                        conditions: report.conditions.clone(),
                        terminating: report.terminating.clone(),
                    };
                }
                delay = RETRY_MIN;
            }
            Err(e) => {
                tracing::debug!(error = %e, "status report not delivered; retrying");
                if sleep_or_stop(delay, &mut stop).await {
                    return;
                }
                delay = next_delay(delay);
                continue;
            }
        }
        // No timer here: a report goes as soon as the agent publishes, and
        // what it publishes while one is in flight goes together in the next
        // (the watch keeps only the latest), so a burst costs few reports and
        // no change waits for a clock.
        tokio::select! {
            r = reports.changed() => if r.is_err() { return },
            r = registered.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The engine's refusals of bound pods not reported yet (each (pod, message)
/// once), marked as reported. Only the report's typed `rejections` count: a
/// pending pod whose status carries a reason and a message because a local
/// step failed (a checkpoint write, a start) stays bound while the agent
/// retries it.
fn new_refusals(current: &NodeReport, rejected: &Rejected) -> Vec<(String, PodRejection)> {
    let mut refusals = Vec::new();
    for (pod, r) in &current.rejections {
        if SourceKind::of_key(pod) != SourceKind::Orchestrator {
            continue;
        }
        if current.pods.get(pod).is_some_and(|s| s.phase != PodPhase::Pending) {
            continue;
        }
        if rejected.set().insert((pod.clone(), r.message.clone())) {
            refusals
                .push((pod.clone(), PodRejection { reason: format!("{:?}", r.reason), message: r.message.clone() }));
        }
    }
    refusals
}

/// Sends the status report (when something changed), then the refusals: a
/// bound pod the engine refused on this node's truth goes back to the queue.
/// Refusals not delivered are unmarked, so the next attempt sends them.
async fn push_report(
    client: &Client,
    name: &str,
    report: Option<NodeStatusReport>,
    refusals: Vec<(String, PodRejection)>,
    rejected: &Rejected,
) -> Result<(), ClientError> {
    let mut refusals = refusals.into_iter();
    let unmark = |rest: &mut dyn Iterator<Item = (String, PodRejection)>| {
        for (pod, r) in rest {
            rejected.set().remove(&(pod, r.message));
        }
    };
    if let Some(report) = report {
        let body = serde_json::to_vec(&report).map_err(|e| ClientError::Decode(e.to_string()))?;
        let path = format!("/api/v1/nodes/{}/status", percent_encode(name));
        let sent = client.call::<NodeStatus>(Method::PUT, &path, Some(("application/json", Bytes::from(body)))).await;
        if let Err(e) = sent {
            unmark(&mut refusals);
            return Err(e);
        }
    }
    while let Some((pod, r)) = refusals.next() {
        let body = serde_json::to_vec(&r).map_err(|e| ClientError::Decode(e.to_string()))?;
        let path = format!("/api/v1/pods/{}/rejection", percent_encode(&pod));
        match client.request(Method::POST, &path, Some(("application/json", Bytes::from(body)))).await {
            Ok(_) => {}
            // The binding it refuses is gone (the pod was deleted, unbound or
            // bound elsewhere since the report it came from): nothing to
            // refuse, and no reason to hold back every later report retrying it.
            Err(ClientError::Api(e)) if matches!(e.code, 403 | 404 | 409) => {
                tracing::debug!(pod, code = e.code, "refusal of a binding that is gone; dropped");
            }
            Err(e) => {
                rejected.set().remove(&(pod, r.message));
                unmark(&mut refusals);
                return Err(e);
            }
        }
    }
    Ok(())
}

async fn heartbeat_loop(
    client: Client,
    name: String,
    full: Arc<watch::Sender<u64>>,
    mut registered: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    if !registered_or_stop(&mut registered, &mut stop).await {
        return;
    }
    let path = format!("/api/v1/nodes/{}/heartbeat", percent_encode(&name));
    let mut missed = false;
    loop {
        match client.call::<serde_json::Value>(Method::POST, &path, None).await {
            Ok(_) if missed => {
                missed = false;
                full.send_modify(|n| *n += 1);
            }
            Ok(_) => {}
            Err(e) => {
                missed = true;
                tracing::debug!(error = %e, "heartbeat not delivered");
            }
        }
        if sleep_or_stop(HEARTBEAT_EVERY, &mut stop).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specs::status::PodStatus;

    fn status(phase: PodPhase) -> PodStatus {
        PodStatus { phase, ..Default::default() }
    }

    /// A node that joined keeps its credentials: the servers given now come
    /// first and those it knew stay after them; a list that shares no server
    /// with the file's is another cluster's and is refused.
    #[tokio::test]
    async fn a_joined_nodes_servers_are_the_given_ones_then_those_it_knew() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let saved = Credentials {
            servers: l(&["https://a:1", "https://b:1"]),
            ca_cert: "C".into(),
            client_cert: "X".into(),
            client_key: "K".into(),
        };
        saved.save(&credentials_path(dir.path())).expect("save");
        let cfg = |servers: &[&str]| LinkConfig {
            servers: l(servers),
            token: None,
            ca: None,
            data_dir: dir.path().to_path_buf(),
            node_name: "n".into(),
            topology: specs::topology::synthetic::parse("pack:1 numa:1 core:1 pu:1").expect("topology"),
            settings: NodeSettings::default(),
            labels: BTreeMap::new(),
            endpoint: None,
            address: None,
            liveness: Default::default(),
        };
        let got = credentials(&cfg(&["https://c:1", "https://b:1"])).await.expect("credentials");
        assert_eq!(got.servers, l(&["https://c:1", "https://b:1", "https://a:1"]));
        let on_disk = Credentials::load(&credentials_path(dir.path())).expect("load");
        assert_eq!(on_disk.servers, got.servers, "the new list is kept");
        // No server given (the file's list as it is), then another cluster's.
        assert_eq!(credentials(&cfg(&[])).await.expect("credentials").servers, got.servers);
        match credentials(&cfg(&["https://z:1"])).await {
            Err(e @ LinkError::OtherServer { .. }) => assert!(e.to_string().contains("https://z:1"), "{e}"),
            other => panic!("expected OtherServer, got {other:?}"),
        }
    }

    #[test]
    fn a_realtime_kernel_labels_the_node_unless_the_operator_says_otherwise() {
        let cfg = |realtime: bool, own: &[(&str, &str)]| {
            let mut topology = specs::topology::synthetic::parse("pack:1 numa:1 core:1 pu:1").expect("topology");
            topology.kernel.realtime = realtime;
            LinkConfig {
                servers: Vec::new(),
                token: None,
                ca: None,
                data_dir: PathBuf::from("/nonexistent"),
                node_name: "n".into(),
                topology,
                settings: NodeSettings::default(),
                labels: own.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                endpoint: None,
                address: None,
                liveness: Default::default(),
            }
        };
        let rt = specs::topology::KERNEL_RT_LABEL;
        type Labels = Vec<(&'static str, &'static str)>;
        // (realtime, the operator's labels, the node's)
        let cases: Vec<(bool, Labels, Labels)> = vec![
            (false, vec![], vec![]),
            (true, vec![], vec![(rt, "true")]),
            (true, vec![("zone", "a")], vec![(rt, "true"), ("zone", "a")]),
            (true, vec![(rt, "false")], vec![(rt, "false")]),
        ];
        for (realtime, own, want) in cases {
            let got = node_labels(&cfg(realtime, &own));
            let want: BTreeMap<String, String> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(got, want, "{realtime} {own:?}");
        }
    }

    /// The join record outlives the process: an agent run again after a lost
    /// reply, or after its certificate expired, joins with the same one. It
    /// is long, random and private.
    #[test]
    fn the_join_record_is_kept_private_and_long() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = join_attempt(dir.path()).expect("attempt");
        assert_eq!(first.len(), 64, "256 bits in hex: {first}");
        assert_eq!(join_attempt(dir.path()).expect("again"), first);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(join_attempt_path(dir.path())).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_file(join_attempt_path(dir.path())).expect("remove");
        assert_ne!(join_attempt(dir.path()).expect("a new record"), first);
    }

    fn report(pods: &[(&str, PodPhase)]) -> NodeReport {
        NodeReport {
            node_name: "n".into(),
            allocations: Allocations::default(),
            pods: pods.iter().map(|(k, p)| (k.to_string(), status(*p))).collect(),
            rejections: BTreeMap::new(),
            offline_cpus: Default::default(),
            running: BTreeMap::new(),
            conditions: Vec::new(),
            terminating: Vec::new(),
        }
    }

    #[test]
    fn only_the_engines_rejections_are_reported_as_refusals() {
        use specs::{RejectReason, Rejection};
        let failed_step = |message: &str| PodStatus {
            phase: PodPhase::Pending,
            reason: Some("ContainerCreating".into()),
            message: Some(message.into()),
            ..Default::default()
        };
        let refused = Rejection { reason: RejectReason::InsufficientCpu, message: "no 4 free CPUs".into() };
        // (what, report, expected refusals as (pod, reason, message))
        type Case = (&'static str, NodeReport, Vec<(&'static str, &'static str, &'static str)>);
        let mut with_rejection = report(&[("a", PodPhase::Pending), ("static/s", PodPhase::Pending)]);
        with_rejection.rejections.insert("a".into(), refused.clone());
        with_rejection.rejections.insert("static/s".into(), refused.clone());
        let mut failed = report(&[]);
        failed.pods.insert("a".into(), failed_step("checkpoint.json: Is a directory (os error 21)"));
        let cases: Vec<Case> = vec![
            ("an engine refusal of a bound pod", with_rejection, vec![("a", "InsufficientCpu", "no 4 free CPUs")]),
            ("a failed checkpoint write", failed, vec![]),
        ];
        for (what, current, want) in cases {
            let got = new_refusals(&current, &Rejected::default());
            let got: Vec<(&str, &str, &str)> =
                got.iter().map(|(p, r)| (p.as_str(), r.reason.as_str(), r.message.as_str())).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn a_report_carries_only_what_changed_since_the_acknowledged_one() {
        let first = report(&[("a", PodPhase::Running), ("b", PodPhase::Pending), ("static/s", PodPhase::Running)]);
        // Nothing acknowledged in this registration: everything of the orchestrator's.
        let full = delta(&Acked::default(), "n", &first).expect("a first report");
        assert_eq!(full.pods.keys().collect::<Vec<_>>(), ["a", "b"]);
        let acked = Acked {
            registration: 1,
            allocations: first.allocations.clone(),
            pods: orchestrator_pods(&first).map(|(k, s)| (k.clone(), s.clone())).collect(),
            offline_cpus: Default::default(),
            conditions: Vec::new(),
            terminating: Vec::new(),
        };
        assert_eq!(delta(&acked, "n", &first), None, "nothing changed, nothing sent");
        let next = report(&[("a", PodPhase::Running), ("b", PodPhase::Running), ("c", PodPhase::Pending)]);
        let d = delta(&acked, "n", &next).expect("b and c changed");
        assert_eq!(d.pods.keys().collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(d.node_name, "n");
        // A CPU going offline is news on its own.
        let mut offline = first.clone();
        offline.offline_cpus = specs::CpuSet::single(3).expect("cpus");
        let d = delta(&acked, "n", &offline).expect("a CPU went offline");
        assert!(d.pods.is_empty());
        assert_eq!(d.offline_cpus, specs::CpuSet::single(3).expect("cpus"));
        // So is a condition, and so is its end.
        let mut down = first.clone();
        down.conditions
            .push(crate::netcheck::Unfit::PluginMissing { plugin: "bridge".into(), dirs: "/x".into() }.condition());
        let d = delta(&acked, "n", &down).expect("the pod network is down");
        assert!(d.pods.is_empty());
        assert_eq!(d.conditions, down.conditions);
        // And so is a pod the node starts stopping (it holds its CPUs until
        // it has stopped), sent whole.
        let mut stopping = first.clone();
        stopping.terminating.push(specs::api::TerminatingPod { name: "gone".into(), ..Default::default() });
        let d = delta(&acked, "n", &stopping).expect("a pod is being stopped");
        assert_eq!(d.terminating, stopping.terminating);
        let acked_down = Acked { conditions: down.conditions.clone(), ..acked };
        let d = delta(&acked_down, "n", &first).expect("the pod network is back");
        assert!(d.conditions.is_empty());
    }
}
