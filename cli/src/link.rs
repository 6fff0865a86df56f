//! The nodelet's link to an orchestrator: join once with the bootstrap token,
//! register the node, then three loops for as long as the agent runs:
//! - bindings: list the node's pods, then watch from that version (a stream, so a
//!   bound pod reaches the agent at once); every reconnect starts with a full
//!   `Resync`, so nothing missed while away survives as a ghost;
//! - reports: every `NodeReport` the agent publishes goes to the node's status,
//!   and an engine rejection of a bound pod is reported once;
//! - heartbeats.
//!
//! Lives in `cli` because it joins `nodelet` (no network code) with
//! `orchestrator`'s client (no agent code). While the server is unreachable the
//! agent keeps running its pods; the loops retry with a capped backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use hyper::Method;
use nodelet::source::{BoundPlan, DesiredChange, NodeReport, SourceKind};
use orchestrator::client::{Client, ClientError};
use orchestrator::tls::{ca_pin, Credentials, JoinToken};
use specs::api::{List, Node, NodeSpec, NodeStatus, NodeStatusReport, PodRejection, WatchEventType};
use specs::pod::{ObjectMeta, API_VERSION};
use specs::{NodeSettings, NodeTopology, Pod, PodPhase};
use tokio::sync::{mpsc, watch};

// Well inside the server's default 40 s grace, and inside short test graces.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(3);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

pub struct LinkConfig {
    pub server: String,
    pub token: Option<String>,
    /// The server's CA certificate (PEM file); needed only for the first join.
    pub ca: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub node_name: String,
    pub topology: NodeTopology,
    pub settings: NodeSettings,
    pub labels: BTreeMap<String, String>,
    /// `HOST:PORT` of this node's HTTPS endpoint, registered for the server.
    pub endpoint: Option<String>,
}

/// The node's credentials file under the agent's data dir.
pub fn credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.conf")
}

/// Loads the node's credentials, joining with the token on first start.
pub async fn credentials(cfg: &LinkConfig) -> anyhow::Result<Credentials> {
    let path = credentials_path(&cfg.data_dir);
    if path.exists() {
        let creds = Credentials::load(&path)?;
        if creds.server != cfg.server {
            bail!(
                "{} belongs to server {}, not {}; remove it to join another server",
                path.display(),
                creds.server,
                cfg.server
            );
        }
        return Ok(creds);
    }
    let Some(token) = &cfg.token else {
        bail!("--token is required for the first join (no {} yet)", path.display());
    };
    let parsed = JoinToken::parse(token).context("--token")?;
    let client = match (&cfg.ca, parsed.ca_pin) {
        (Some(ca_path), pin) => {
            let ca = std::fs::read_to_string(ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
            if pin.is_some_and(|p| ca_pin(&ca).ok() != Some(p)) {
                bail!("--ca {} is not the CA the join token pins", ca_path.display());
            }
            Client::anonymous(&cfg.server, &ca)?
        }
        (None, Some(pin)) => Client::pinned(&cfg.server, pin)?,
        (None, None) => bail!(
            "this join token has no CA pin (PIN.SECRET, as `pinion server` prints it): give the server's CA with --ca FILE"
        ),
    };
    let joined = client
        .join(token, &cfg.node_name)
        .await
        .with_context(|| format!("joining {} as node {}", cfg.server, cfg.node_name))?;
    if parsed.ca_pin.is_some_and(|p| ca_pin(&joined.ca_cert).ok() != Some(p)) {
        bail!("the server sent a CA that the join token does not pin");
    }
    let creds = Credentials {
        server: cfg.server.clone(),
        ca_cert: joined.ca_cert,
        client_cert: joined.client_cert,
        client_key: joined.client_key,
    };
    creds.save(&path)?;
    tracing::info!(node = %cfg.node_name, server = %cfg.server, "joined");
    Ok(creds)
}

/// Runs the link until `stop` fires. Returns an error only for what retrying
/// cannot fix (bad credentials on disk); network trouble is retried.
pub async fn run(
    cfg: LinkConfig,
    creds: Credentials,
    changes: mpsc::Sender<DesiredChange>,
    reports: watch::Receiver<NodeReport>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let client = Client::new(&creds)?;
    let node = Node {
        api_version: API_VERSION.into(),
        kind: "Node".into(),
        metadata: ObjectMeta { name: cfg.node_name.clone(), labels: cfg.labels.clone(), ..Default::default() },
        spec: NodeSpec {
            topology: cfg.topology.clone(),
            settings: cfg.settings.clone(),
            endpoint: cfg.endpoint.clone(),
        },
        status: NodeStatus::default(),
    };
    let name = cfg.node_name.clone();
    let rejected = Rejected::default();
    let bindings = bindings_loop(client.clone(), node, changes, rejected.clone(), stop.clone());
    let reports = reports_loop(client.clone(), name.clone(), reports, rejected, stop.clone());
    let heartbeats = heartbeat_loop(client, name, stop.clone());
    tokio::select! {
        _ = stop.wait_for(|s| *s) => {}
        _ = bindings => {}
        _ = reports => {}
        _ = heartbeats => {}
    }
    Ok(())
}

/// (pod, message) pairs already reported as rejections, shared by the two
/// loops: a binding that arrives again (the server retried the pod here) clears
/// its pod's entries, so a second refusal is reported too.
#[derive(Clone, Default)]
struct Rejected(std::sync::Arc<std::sync::Mutex<BTreeSet<(String, String)>>>);

impl Rejected {
    fn set(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, pod: &str) {
        self.set().retain(|(p, _)| p != pod);
    }
}

fn next_delay(d: Duration) -> Duration {
    (d * 2).min(RETRY_MAX)
}

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
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
    node: Node,
    changes: mpsc::Sender<DesiredChange>,
    rejected: Rejected,
    mut stop: watch::Receiver<bool>,
) {
    let name = node.metadata.name.clone();
    let body = match serde_json::to_vec(&node) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the node");
            return;
        }
    };
    let mut delay = RETRY_MIN;
    loop {
        match session(&client, &name, body.clone(), &changes, &rejected, &mut stop).await {
            Ok(()) => return, // stopped
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), retry_in = ?delay, "link to the server lost; pods keep running");
            }
        }
        if sleep_or_stop(delay, &mut stop).await {
            return;
        }
        delay = next_delay(delay);
    }
}

/// One connected session: register, list (resync), then follow the watch.
async fn session(
    client: &Client,
    name: &str,
    node_body: Bytes,
    changes: &mpsc::Sender<DesiredChange>,
    rejected: &Rejected,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    client.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", node_body))).await?;
    let path = format!("/api/v1/pods?nodeName={name}");
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
    changes.send(DesiredChange::Resync { source: SourceKind::Orchestrator, pods }).await?;
    let mut w = client.watch_pods(Some(name), None, Some(list.resource_version)).await?;
    loop {
        let next = tokio::select! {
            n = w.next() => n,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let Some((ty, pod)) = next? else { bail!("the watch stream ended") };
        let key = pod.metadata.name.clone();
        match ty {
            WatchEventType::Added | WatchEventType::Modified => match desired(&pod, name) {
                Some((plan, s)) => {
                    if sent.get(&key) != Some(&s) {
                        sent.insert(key.clone(), s);
                        rejected.forget(&key);
                        changes.send(DesiredChange::Apply { key, pod: Box::new(pod), plan }).await?;
                    }
                }
                None => {
                    if sent.remove(&key).is_some() {
                        rejected.forget(&key);
                        changes.send(DesiredChange::Remove { key }).await?;
                    }
                }
            },
            WatchEventType::Deleted => {
                sent.remove(&key);
                rejected.forget(&key);
                changes.send(DesiredChange::Remove { key }).await?;
            }
            WatchEventType::Error => bail!("the server ended the watch"),
        }
    }
}

async fn reports_loop(
    client: Client,
    name: String,
    mut reports: watch::Receiver<NodeReport>,
    rejected: Rejected,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = RETRY_MIN;
    loop {
        let report = reports.borrow_and_update().clone();
        let outcome = push_report(&client, &name, report, &rejected).await;
        let failed = outcome.is_err();
        if let Err(e) = outcome {
            tracing::debug!(error = %e, "status report not delivered; retrying");
            if sleep_or_stop(delay, &mut stop).await {
                return;
            }
            delay = next_delay(delay);
        } else {
            delay = RETRY_MIN;
        }
        if failed {
            continue;
        }
        tokio::select! {
            r = reports.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn push_report(client: &Client, name: &str, report: NodeReport, rejected: &Rejected) -> Result<(), ClientError> {
    if report.node_name.is_empty() {
        return Ok(()); // the agent has not published yet
    }
    let pods: BTreeMap<_, _> =
        report.pods.into_iter().filter(|(k, _)| SourceKind::of_key(k) == SourceKind::Orchestrator).collect();
    // A bound pod the engine refused on this node's truth goes back to the queue.
    let mut refusals = Vec::new();
    for (pod, status) in &pods {
        if status.phase == PodPhase::Pending {
            if let (Some(reason), Some(message)) = (&status.reason, &status.message) {
                if rejected.set().insert((pod.clone(), message.clone())) {
                    refusals.push((pod.clone(), PodRejection { reason: reason.clone(), message: message.clone() }));
                }
            }
        }
    }
    let body = NodeStatusReport { node_name: name.to_string(), allocations: report.allocations, pods };
    let body = serde_json::to_vec(&body).map_err(|e| ClientError::Decode(e.to_string()))?;
    let path = format!("/api/v1/nodes/{name}/status");
    client.call::<NodeStatus>(Method::PUT, &path, Some(("application/json", Bytes::from(body)))).await?;
    for (pod, r) in refusals {
        let body = serde_json::to_vec(&r).map_err(|e| ClientError::Decode(e.to_string()))?;
        let path = format!("/api/v1/pods/{pod}/rejection");
        if let Err(e) = client.request(Method::POST, &path, Some(("application/json", Bytes::from(body)))).await {
            rejected.set().remove(&(pod, r.message));
            return Err(e);
        }
    }
    Ok(())
}

async fn heartbeat_loop(client: Client, name: String, mut stop: watch::Receiver<bool>) {
    let path = format!("/api/v1/nodes/{name}/heartbeat");
    loop {
        if let Err(e) = client.request(Method::POST, &path, None).await {
            tracing::debug!(error = %e, "heartbeat not delivered");
        }
        if sleep_or_stop(HEARTBEAT_EVERY, &mut stop).await {
            return;
        }
    }
}
