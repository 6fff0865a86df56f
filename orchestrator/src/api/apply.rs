//! Carries out parsed actions: authorize (`cluster::authorize`), call the
//! cluster's command (`cluster::pods`, `nodes`, `jobs`) or read the store, and
//! answer; a `ClusterError` becomes an HTTP answer once (`error::answer`).
//! The only API layer that touches the store.

use std::sync::Arc;

use specs::api::{ApiError, JoinResponse, LabelSelector, List, Node, WatchEventType};
use specs::daemonset::DaemonSet;
use specs::deployment::Deployment;
use specs::job::Job;
use specs::partition::Partition;
use specs::{Pod, PodPhase};

use super::error::store_error;
use super::parse::Action;
use crate::cluster::{
    self, authorize, daemonsets, deployments, jobs, nodes, partitions, pods, users, Access, ClusterError, EnvValues,
    Request,
};
use crate::leading::Leading;
use crate::store::{Change, Claim, Kind, Object, Store, Watch};
use crate::tls::{Identity, Pki, NODE_CN_PREFIX};

/// What the API layer needs, shared by every connection.
pub struct ApiState {
    pub store: Store,
    pub controller: Arc<Leading>,
    pub pki: Arc<Pki>,
    /// `https://HOST:PORT` written into issued credentials.
    pub server_url: String,
    /// The cluster's servers as advertised in etcd (several servers).
    pub peers: Option<crate::peers::Peers>,
    /// The URL other machines reach this server by, when it was given.
    pub advertise_url: Option<String>,
    /// How the server calls nodelets (pod logs): a pooled client per node.
    pub proxy: super::proxy::NodeClients,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Failed joins per source address (logged, rate-limited).
    pub joins: super::joins::Joins,
    /// Host folders under which a `baseline` person's pods may mount host
    /// paths (`--allowed-host-paths`).
    pub allowed_host_paths: Vec<String>,
    /// How long the client certificates this server issues live.
    pub lifetimes: crate::tls::Lifetimes,
    /// The cluster range that nodes' pod ranges come from.
    pub pod_ranges: specs::net::PodRanges,
}

pub enum Reply {
    /// Status code and a JSON body, already encoded (a 50,000-pod list as a
    /// `serde_json::Value` tree would cost several times its bytes).
    Json(u16, Vec<u8>),
    /// A newline-delimited JSON stream: initial lines, then filtered changes.
    Watch {
        initial: Vec<String>,
        watch: Watch,
        filter: WatchFilter,
        /// The version the watch starts after (a bookmark's first value).
        from: u64,
        /// Send a BOOKMARK on an idle stream.
        bookmarks: bool,
    },
    /// Bytes streamed from a nodelet's endpoint (`GET https://ENDPOINT/PATH`,
    /// TLS name = the node's name).
    Proxy { node: String, endpoint: String, path: String },
    /// One pod followed to its end (`api::attach`).
    Attach(Box<super::attach::Attach>),
    /// A command run in a pod's container on its node (`api::proxy::exec`):
    /// `POST https://ENDPOINT/PATH` with `request`.
    Exec { node: String, endpoint: String, path: String, request: specs::api::ExecRequest },
    /// An exec's stdin passed on to its node (`api::proxy::exec_input`):
    /// `POST https://ENDPOINT/PATH` with `input`.
    ExecInput { node: String, endpoint: String, path: String, input: specs::api::ExecInput },
    /// The Prometheus scrape (`metrics::Metrics::encode`).
    Metrics(String),
}

fn json<T: serde::Serialize>(code: u16, v: &T) -> Result<Reply, ApiError> {
    serde_json::to_vec(v)
        .map(|v| Reply::Json(code, v))
        .map_err(|e| super::error::internal(format!("cannot encode the reply: {e}")))
}

/// Which changes a watcher sees (pods or nodes), and as what.
pub struct WatchFilter {
    pub kind: Kind,
    pub selector: LabelSelector,
    /// Pods only: the node whose pods are watched.
    pub node: Option<String>,
    /// Whose pods are sent whole; the others' containers keep their env's
    /// names and lose its values.
    pub env_values: EnvValues,
    /// A user's watch: only objects they own.
    pub owner: Option<String>,
    /// The person watching: a change to their record (revoked, added again)
    /// ends the stream, whose next request must prove them again.
    pub holder: Option<String>,
    /// Objects go without their `status` (nodes watched by a node:
    /// `cluster::node_status_shown`).
    pub without_status: bool,
}

impl WatchFilter {
    /// Whether a listed object is one the watcher sees (its first ADDED lines).
    fn keeps<T: Object>(&self, obj: &T) -> bool {
        self.selector.matches(&obj.meta().labels)
            && (self.node.is_none() || obj.node_name() == self.node.as_deref())
            && (self.owner.is_none() || obj.meta().owner == self.owner)
    }

    /// Whether this change ends the watch: the watcher's own record changed.
    pub fn ends(&self, c: &Change) -> bool {
        c.kind == Kind::User && self.holder.as_deref() == Some(c.name.as_str())
    }

    /// The line to send for a change, if any. A pod that leaves the watched node
    /// is DELETED for that watcher; one that arrives is ADDED.
    pub fn line(&self, c: &Change) -> Option<String> {
        if c.kind != self.kind || !self.selector.matches(&c.labels) {
            return None;
        }
        if self.without_status && c.status_only {
            return None;
        }
        if self.owner.is_some() && c.owner != self.owner {
            return None;
        }
        let ty = match &self.node {
            None => c.event_type,
            Some(n) => {
                let now = c.node_name.as_deref() == Some(n) && c.event_type != WatchEventType::Deleted;
                let before = c.prev_node_name.as_deref() == Some(n);
                match (before, now) {
                    (false, false) => return None,
                    (false, true) => WatchEventType::Added,
                    (true, false) => WatchEventType::Deleted,
                    (true, true) => c.event_type,
                }
            }
        };
        let object = if self.env_values.shows(c.owner.as_deref()) {
            std::borrow::Cow::Borrowed(c.object.as_str())
        } else {
            std::borrow::Cow::Owned(without_env_values(&c.object))
        };
        if self.without_status {
            Some(watch_line(ty, &without_status(&object)))
        } else {
            Some(watch_line(ty, &object))
        }
    }
}

/// An object's JSON without its `status`.
fn without_status(object_json: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(object_json) {
        Ok(mut v) => {
            if let Some(map) = v.as_object_mut() {
                map.remove("status");
            }
            v.to_string()
        }
        // Stored objects are JSON; an object that is not is passed on as it is.
        Err(_) => object_json.to_string(),
    }
}

/// An object's JSON with `value` taken out of every entry of every `env` list.
fn without_env_values(object_json: &str) -> String {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    match (key.as_str(), child) {
                        ("env", serde_json::Value::Array(vars)) => {
                            for var in vars.iter_mut().filter_map(|v| v.as_object_mut()) {
                                var.remove("value");
                            }
                        }
                        (_, child) => strip(child),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    match serde_json::from_str::<serde_json::Value>(object_json) {
        Ok(mut v) => {
            strip(&mut v);
            serde_json::to_string(&v).unwrap_or_default()
        }
        // Never sent as it is: an object that does not parse could hold anything.
        Err(_) => "{}".to_string(),
    }
}

/// What `id` is shown of env values on a listener that shows them
/// (`env_values`) or not (the local listener).
fn shown(id: &Identity, env_values: bool) -> EnvValues {
    if env_values {
        cluster::env_values(id)
    } else {
        EnvValues::None
    }
}

/// A pod's (or a job template's) containers with their env's names and
/// without its values.
fn hide_env_values(spec: &mut specs::pod::PodSpec) {
    for var in spec.containers.iter_mut().flat_map(|c| c.env.iter_mut()) {
        var.value.clear();
    }
}

/// The `T`s `id` sees that `selector` matches, the env values of those not
/// theirs to read hidden (`hide`).
fn list_owned<T: Object>(
    store: &Store,
    id: &Identity,
    selector: &LabelSelector,
    hide: impl Fn(&mut T),
) -> Result<Reply, ApiError> {
    let listed = store.list::<T>().map_err(store_error)?;
    let shown = cluster::env_values(id);
    let items: Vec<T> = listed
        .items
        .into_iter()
        .filter(|o| cluster::sees(id, o.meta().owner.as_deref()) && selector.matches(&o.meta().labels))
        .map(|mut o| {
            if !shown.shows(o.meta().owner.as_deref()) {
                hide(&mut o);
            }
            o
        })
        .collect();
    json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
}

/// One `T` (a `kind`) named `name`, if `id` may read it; its env values
/// hidden unless theirs to read.
fn get_owned<T: Object>(
    store: &Store,
    id: &Identity,
    kind: &'static str,
    name: &str,
    hide: impl Fn(&mut T),
) -> Result<Reply, ApiError> {
    let found = store.get::<T>(name).map_err(store_error)?;
    let mut o = found.ok_or_else(|| ClusterError::not_found(kind, name))?;
    let owner = o.meta().owner.clone();
    authorize(id, Request::Owned { kind, name, owner: owner.as_deref(), access: Access::Read })?;
    if !cluster::env_values(id).shows(owner.as_deref()) {
        hide(&mut o);
    }
    json(200, &o)
}

/// The names of the pods labelled `label=value` as listed now (a workload's
/// pods when it is deleted; one made after is the controller's to remove,
/// as a pod of a workload that is gone).
fn pods_labelled(store: &Store, label: &str, value: &str) -> Result<Vec<String>, ApiError> {
    Ok(store
        .list::<Pod>()
        .map_err(store_error)?
        .items
        .into_iter()
        .filter(|p| p.metadata.labels.get(label).map(String::as_str) == Some(value))
        .map(|p| p.metadata.name)
        .collect())
}

/// A Deployment's templates (the spec's and every kept revision's) without
/// their env values.
fn hide_deployment_env_values(d: &mut Deployment) {
    hide_env_values(&mut d.spec.template.spec);
    for r in d.status.iter_mut().flat_map(|s| s.history.iter_mut()) {
        hide_env_values(&mut r.template.spec);
    }
}

/// A BOOKMARK line: the watch has reached `version` and nothing the watcher
/// sees changed since its last line.
pub fn bookmark_line(kind: Kind, version: u64) -> String {
    let kind = match kind {
        Kind::Pod => "Pod",
        Kind::Node => "Node",
        Kind::Event => "Event",
        Kind::Job => "Job",
        Kind::User => "User",
        Kind::Token => "Token",
        Kind::Deployment => "Deployment",
        Kind::DaemonSet => "DaemonSet",
        Kind::Partition => "Partition",
        Kind::Usage => "Usage",
        Kind::AcctRecord => "AcctRecord",
    };
    watch_line(
        WatchEventType::Bookmark,
        &format!(
            "{{\"apiVersion\":\"{}\",\"kind\":\"{kind}\",\"metadata\":{{\"resourceVersion\":{version}}}}}",
            specs::pod::API_VERSION
        ),
    )
}

/// A watch of `T` from `from`, or, without it, from now with the objects the
/// watcher sees listed first as ADDED.
async fn start_watch<T: Object>(
    store: &Store,
    filter: WatchFilter,
    from: Option<u64>,
    bookmarks: bool,
) -> Result<Reply, ApiError> {
    let mut initial = Vec::new();
    let from = match from {
        Some(v) => v,
        None => {
            let listed = store.list::<T>().map_err(store_error)?;
            for o in listed.items.iter().filter(|o| filter.keeps(*o)) {
                let obj = serde_json::to_string(o).map_err(|e| super::error::internal(e.to_string()))?;
                let obj =
                    if filter.env_values.shows(o.meta().owner.as_deref()) { obj } else { without_env_values(&obj) };
                let obj = if filter.without_status { without_status(&obj) } else { obj };
                initial.push(watch_line(WatchEventType::Added, &obj));
            }
            listed.rv
        }
    };
    let watch = store.watch(from).await.map_err(store_error)?;
    Ok(Reply::Watch { initial, watch, filter, from, bookmarks })
}

pub fn watch_line(ty: WatchEventType, object_json: &str) -> String {
    let ty = match ty {
        WatchEventType::Added => "ADDED",
        WatchEventType::Modified => "MODIFIED",
        WatchEventType::Deleted => "DELETED",
        WatchEventType::Error => "ERROR",
        WatchEventType::Bookmark => "BOOKMARK",
    };
    format!("{{\"type\":\"{ty}\",\"object\":{object_json}}}\n")
}

/// A node as another node lists it: its status left out.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeWithoutStatus<'a> {
    api_version: &'a str,
    kind: &'a str,
    metadata: &'a specs::pod::ObjectMeta,
    spec: &'a specs::api::NodeSpec,
}

pub async fn apply(state: &ApiState, id: &Identity, action: Action) -> Result<Reply, ApiError> {
    let store = &state.store;
    match action {
        Action::Health => {
            authorize(id, Request::Public)?;
            json(200, &serde_json::json!({"status": "ok"}))
        }
        Action::Version => {
            authorize(id, Request::Public)?;
            json(200, &serde_json::json!({"version": env!("CARGO_PKG_VERSION")}))
        }
        Action::Metrics => {
            authorize(id, Request::ReadMetrics)?;
            Ok(Reply::Metrics(state.metrics.encode()))
        }
        Action::Join { token, request } => {
            authorize(id, Request::Join)?;
            // A token that does not parse proves nothing (its digest matches
            // no record); the join record may still.
            let token = token.map(|t| match crate::tls::JoinToken::parse(&t) {
                Ok(t) => (t.id, pinion_wire::tls::sha256_hex(t.secret.as_bytes())),
                Err(_) => (None, String::new()),
            });
            let proof = nodes::JoinProof {
                token,
                attempt: request.attempt.clone().unwrap_or_default(),
                new_incarnation: cluster::new_uid()?,
            };
            let name = request.node_name.clone();
            let joined = store.write(move |t| nodes::join(t, &name, &proof, chrono::Utc::now())).await?;
            let claim = joined.claim;
            let creds = match state.pki.credentials(
                &state.server_url,
                &format!("{NODE_CN_PREFIX}{}", request.node_name),
                Some(&joined.incarnation).filter(|i| !i.is_empty()).map(String::as_str),
                state.lifetimes.node,
            ) {
                Ok(c) => c,
                Err(e) => {
                    // No certificate was issued this time: a name this
                    // request claimed is free again (a retry's claim stays:
                    // its first try may have delivered one).
                    let name = request.node_name.clone();
                    if claim == Claim::New {
                        if let Err(r) = store.write(move |t| nodes::release_name(t, &name)).await {
                            tracing::error!(node = %request.node_name, error = %r, "cannot free the node name after a failed join");
                        }
                    }
                    return Err(super::error::internal(e.to_string()));
                }
            };
            tracing::info!(node = %request.node_name, "node joined");
            let servers = match &state.peers {
                Some(p) => p.list().await,
                None => state.advertise_url.iter().cloned().collect(),
            };
            json(
                200,
                &JoinResponse {
                    node_name: request.node_name,
                    ca_cert: creds.ca_cert,
                    client_cert: creds.client_cert,
                    client_key: creds.client_key,
                    // The advertised servers only: this server's own URL may
                    // name it on loopback, which a node elsewhere cannot use.
                    servers,
                },
            )
        }
        Action::ListPods { selector, node, env_values } => {
            authorize(id, Request::ReadPods { node: node.as_deref() })?;
            let node = cluster::pods_visible_to(id, node);
            let listed = store.list::<Pod>().map_err(store_error)?;
            let mut items: Vec<Pod> = listed
                .items
                .into_iter()
                .filter(|p| cluster::sees(id, p.metadata.owner.as_deref()))
                .filter(|p| selector.matches(&p.metadata.labels))
                .filter(|p| node.is_none() || p.spec.node_name == node)
                .collect();
            // Deleted pods their node is still stopping: they hold its CPUs
            // until then, so they are listed, `Terminating`. Not to a node:
            // it lists what it must run.
            if !matches!(id, Identity::Node(_)) {
                let stopping = match state.controller.current() {
                    Some(c) => c.terminating(),
                    None => cluster::nodes::terminating(store).map_err(store_error)?,
                };
                let listed: std::collections::BTreeSet<String> =
                    items.iter().map(|p| p.metadata.name.clone()).collect();
                let before = items.len();
                items.extend(
                    stopping
                        .iter()
                        .filter(|(n, t)| node.as_ref().is_none_or(|want| want == n) && !listed.contains(&t.name))
                        .filter(|(_, t)| cluster::sees(id, t.owner.as_deref()) && selector.matches(&t.labels))
                        .map(|(n, t)| cluster::nodes::stopping_pod(n, t)),
                );
                if items.len() > before {
                    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                }
            }
            let shown = shown(id, env_values);
            for p in items.iter_mut().filter(|p| !shown.shows(p.metadata.owner.as_deref())) {
                hide_env_values(&mut p.spec);
            }
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::WatchPods { selector, node, from, bookmarks, env_values } => {
            authorize(id, Request::ReadPods { node: node.as_deref() })?;
            let node = cluster::pods_visible_to(id, node);
            let filter = WatchFilter {
                kind: Kind::Pod,
                selector,
                node,
                env_values: shown(id, env_values),
                owner: cluster::owner_filter(id),
                holder: holder(id),
                without_status: false,
            };
            start_watch::<Pod>(store, filter, from, bookmarks).await
        }
        Action::CreatePod(mut pod) => {
            authorize(id, Request::CreatePod)?;
            pod.metadata.owner = cluster::person_name(id).map(str::to_string);
            if let Some(held) = users::Held::of(id) {
                held.apply(&mut pod.spec, "spec", &state.allowed_host_paths)?;
            }
            let uid = cluster::new_uid()?;
            // A pod that names its node skips the scheduler, and this check with it.
            let waits =
                pod.metadata.annotations.get(specs::pod::WAIT_FOR_NODES_ANNOTATION).map(String::as_str) == Some("true");
            let never = if waits || pod.spec.node_name.is_some() {
                None
            } else {
                state.controller.current().and_then(|c| c.never_fits(&pod))
            };
            let created = store.write(move |t| pods::create(t, &pod, &uid, never.as_deref())).await?;
            json(if created.new { 201 } else { 200 }, &created.pod)
        }
        Action::GetPod(name) => match store.get::<Pod>(&name).map_err(store_error)? {
            Some(mut p) => {
                authorize(id, Request::Pod(&p))?;
                if !cluster::env_values(id).shows(p.metadata.owner.as_deref()) {
                    hide_env_values(&mut p.spec);
                }
                json(200, &p)
            }
            None => {
                authorize(id, Request::Known)?;
                Err(ClusterError::not_found("Pod", &name).into())
            }
        },
        Action::DeletePod(name) => {
            authorize(id, Request::DeletePod)?;
            let (n, who) = (name.clone(), id.clone());
            match store.write(move |t| pods::delete(t, &who, &n)).await? {
                pods::Deleted::Pod(p) => json(200, &p),
                pods::Deleted::Unreadable => json(200, &Pod::new(name.as_str(), Default::default())),
            }
        }
        Action::UpdatePodStatus { name, status } => {
            authorize(id, Request::Known)?;
            let controller = state.controller.required()?;
            let id = id.clone();
            let (pod, finished) = store.write(move |t| pods::report_status(t, &id, &name, &status)).await?;
            if finished {
                controller.pod_finished(&pod);
            }
            json(200, &pod)
        }
        Action::RejectPod { name, rejection } => {
            authorize(id, Request::Known)?;
            let controller = state.controller.required()?;
            let reason = format!("{}: {}", rejection.reason, rejection.message);
            let id = id.clone();
            let (pod, node) = store.write(move |t| pods::reject(t, &id, &name, &rejection)).await?;
            if pod.spec.node_name.is_some() {
                // Still on its node, failed there (a DaemonSet's pod).
                controller.daemon_pod_rejected(&pod);
            } else {
                controller.pod_rejected(&pod, &node, &reason);
            }
            json(200, &pod)
        }
        Action::PodLog { name, container, follow } => {
            authorize(id, Request::PodLogs)?;
            let pod = stored_pod(store, &name)?;
            authorize(id, owned(&pod, Access::Read))?;
            let container = pods::pick_container(&pod, container)?;
            let (node, endpoint, path) = log_target(state, &pod, &container, follow)?;
            Ok(Reply::Proxy { node, endpoint, path })
        }
        Action::AttachPod { name, container, known_version, offset, rm } => {
            authorize(id, Request::AttachPod)?;
            // The version is read before the pod: every change after the pod
            // as read is in the change log after `from`, so none is missed.
            let from = store.resource_version();
            if let Some(known) = known_version.filter(|&k| k > from) {
                // A version from the future would hold back the pod's status frames.
                return Err(store_error(crate::store::StoreError::Future { requested: known, current: from }));
            }
            let pod = stored_pod(store, &name)?;
            authorize(id, owned(&pod, Access::Read))?;
            // Asked to delete it at its end: whether this caller may is
            // answered now, before the stream, not after the pod ran.
            let remove_as = if rm {
                authorize(id, Request::DeletePod)?;
                authorize(id, owned(&pod, Access::Write))?;
                Some(id.clone())
            } else {
                None
            };
            let container = pods::pick_container(&pod, container)?;
            let watch = store.watch(from).await.map_err(store_error)?;
            let holder = holder(id);
            let attach = super::attach::Attach { pod, container, known_version, offset, watch, holder, remove_as };
            Ok(Reply::Attach(Box::new(attach)))
        }
        Action::ExecPod { name, mut request } => {
            authorize(id, Request::ExecPod)?;
            let pod = stored_pod(store, &name)?;
            authorize(id, owned(&pod, Access::Write))?;
            let container = pods::pick_container(&pod, request.container.take())?;
            // The pod's state, not the request, is at fault: 409, as for logs of an unbound pod.
            let status = pod.status.clone().unwrap_or_default();
            if status.phase != PodPhase::Running {
                return Err(ClusterError::Conflict(format!(
                    "pod {name:?} is {:?}, not Running: exec needs a running container",
                    status.phase
                ))
                .into());
            }
            let shown = status.container_statuses.iter().find(|c| c.name == container).map(|c| c.state);
            if shown != Some(specs::status::ContainerState::Running) {
                let state = shown.map_or("not started".to_string(), |s| format!("{s:?}"));
                return Err(ClusterError::Conflict(format!(
                    "container {container:?} of pod {name:?} is not running ({state})"
                ))
                .into());
            }
            let (node, endpoint) = node_endpoint(state, &pod, "it runs nothing to exec in", "an exec")?;
            let mut path = format!(
                "/exec?pod={}&container={}",
                super::parse::percent_encode(&name),
                super::parse::percent_encode(&container)
            );
            if let Some(uid) = &pod.metadata.uid {
                path.push_str(&format!("&uid={}", super::parse::percent_encode(uid)));
            }
            request.container = Some(container);
            Ok(Reply::Exec { node, endpoint, path, request })
        }
        Action::ExecInput { name, input } => {
            // Whoever may exec in the pod may feed its exec; the node checks
            // that the session is an exec of this pod.
            authorize(id, Request::ExecPod)?;
            let pod = stored_pod(store, &name)?;
            authorize(id, owned(&pod, Access::Write))?;
            let (node, endpoint) = node_endpoint(state, &pod, "it runs nothing to exec in", "an exec")?;
            let path = format!("/exec/input?pod={}", super::parse::percent_encode(&name));
            Ok(Reply::ExecInput { node, endpoint, path, input })
        }
        Action::ListNodes { selector } => {
            authorize(id, Request::ListNodes)?;
            let listed = store.list::<Node>().map_err(store_error)?;
            let items: Vec<Node> = listed.items.into_iter().filter(|n| selector.matches(&n.metadata.labels)).collect();
            if cluster::node_status_shown(id) {
                return json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable });
            }
            let items: Vec<NodeWithoutStatus<'_>> = items
                .iter()
                .map(|n| NodeWithoutStatus {
                    api_version: &n.api_version,
                    kind: &n.kind,
                    metadata: &n.metadata,
                    spec: &n.spec,
                })
                .collect();
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::WatchNodes { selector, from, bookmarks } => {
            authorize(id, Request::WatchNodes)?;
            let filter = WatchFilter {
                kind: Kind::Node,
                selector,
                node: None,
                env_values: EnvValues::All,
                owner: None,
                holder: holder(id),
                without_status: !cluster::node_status_shown(id),
            };
            start_watch::<Node>(store, filter, from, bookmarks).await
        }
        Action::RegisterNode(node) => {
            authorize(id, Request::ActForNode(&node.metadata.name))?;
            let controller = state.controller.required()?;
            let ranges = state.pod_ranges;
            let (new, node) = store.write(move |t| nodes::register(t, &node, &ranges)).await?;
            controller.node_registered(&node);
            json(if new { 201 } else { 200 }, &node)
        }
        Action::GetNode(name) => {
            authorize(id, Request::ActForNode(&name))?;
            let node = store.get::<Node>(&name).map_err(store_error)?;
            json(200, &node.ok_or_else(|| ClusterError::not_found("Node", &name))?)
        }
        Action::DeleteNode(name) => {
            authorize(id, Request::DeleteNode)?;
            let n = name.clone();
            match store.write(move |t| nodes::delete(t, &n)).await? {
                nodes::Deleted::Node(node) => json(200, &node),
                nodes::Deleted::NameOnly => json(200, &nodes::joined_only(&name)),
            }
        }
        Action::Heartbeat(name) => {
            authorize(id, Request::ActForNode(&name))?;
            match state.controller.required()?.heartbeat(&name).await? {
                false => Err(ClusterError::not_found("Node", &name).into()),
                true => json(200, &serde_json::json!({"condition": "Ready"})),
            }
        }
        Action::ReportNodeStatus { name, report } => {
            authorize(id, Request::ActForNode(&name))?;
            let controller = state.controller.required()?;
            let _g = controller.transition_guard(&name).await;
            let reported = nodes::report_in_writes(store, &name, *report).await?;
            controller.node_reported(&reported.node, true, &reported.confirmed);
            for pod in &reported.finished {
                controller.pod_finished(pod);
            }
            json(200, &reported.node.status)
        }
        Action::ListJobs { selector } => {
            authorize(id, Request::ListJobs)?;
            list_owned::<Job>(store, id, &selector, |j| hide_env_values(&mut j.spec.template.spec))
        }
        Action::GetJob(name) => {
            authorize(id, Request::ReadJob)?;
            get_owned::<Job>(store, id, "Job", &name, |j| hide_env_values(&mut j.spec.template.spec))
        }
        Action::CreateJob(mut job) => {
            authorize(id, Request::CreateJob)?;
            job.metadata.owner = cluster::person_name(id).map(str::to_string);
            if let Some(held) = users::Held::of(id) {
                held.apply(&mut job.spec.template.spec, "spec.template.spec", &state.allowed_host_paths)?;
            }
            let uid = cluster::new_uid()?;
            // As for a pod: a gang no cluster could ever hold at once is refused now.
            let never = state.controller.current().and_then(|c| c.gang_never_fits(&job));
            let admin = authorize(id, Request::WritePartitions).is_ok();
            if job.spec.priority != 0 && !admin {
                // The server computes priority from age, size and fair share;
                // a site priority on top is an admin's (Slurm's --priority).
                return Err(ClusterError::Disallowed(vec![specs::validate::FieldError {
                    field: "spec.priority".into(),
                    message: "only an admin may set a job's priority (--priority); the server orders jobs by age, size and fair share".into(),
                }])
                .into());
            }
            let created = store
                .write(move |t| {
                    jobs::place_in_partition(t, &mut job, admin)?;
                    jobs::create(t, &job, &uid, never.as_deref())
                })
                .await?;
            json(if created.new { 201 } else { 200 }, &created.job)
        }
        Action::DeleteJob(name) => {
            authorize(id, Request::DeleteJob)?;
            let (n, who) = (name.clone(), id.clone());
            let deleted = store.write(move |t| jobs::delete_for(t, &who, &n)).await?;
            let (job, _members) = deleted.ok_or_else(|| ClusterError::not_found("Job", &name))?;
            json(200, &job)
        }
        Action::HoldJob { name, hold } => {
            authorize(id, Request::DeleteJob)?;
            let who = id.clone();
            let job = store.write(move |t| jobs::hold_for(t, &who, &name, hold)).await?;
            json(200, &job)
        }
        Action::ListDeployments { selector } => {
            authorize(id, Request::ReadDeployments)?;
            list_owned::<Deployment>(store, id, &selector, hide_deployment_env_values)
        }
        Action::GetDeployment(name) => {
            authorize(id, Request::ReadDeployments)?;
            get_owned::<Deployment>(store, id, "Deployment", &name, hide_deployment_env_values)
        }
        Action::ApplyDeployment(mut d) => {
            authorize(id, Request::WriteDeployments)?;
            d.metadata.owner = cluster::person_name(id).map(str::to_string);
            if let Some(held) = users::Held::of(id) {
                held.apply(&mut d.spec.template.spec, "spec.template.spec", &state.allowed_host_paths)?;
            }
            let uid = cluster::new_uid()?;
            let applied = store.write(move |t| deployments::apply(t, &d, &uid)).await?;
            json(if applied.new { 201 } else { 200 }, &applied.deployment)
        }
        Action::DeleteDeployment(name) => {
            authorize(id, Request::WriteDeployments)?;
            let pods = pods_labelled(store, specs::deployment::DEPLOYMENT_LABEL, &name)?;
            let (n, who) = (name.clone(), id.clone());
            let (d, _pods) = store.write(move |t| deployments::delete_for(t, &who, &n, &pods)).await?;
            json(200, &d)
        }
        Action::ChangeDeployment { name, change } => {
            authorize(id, Request::WriteDeployments)?;
            let who = id.clone();
            let d = store.write(move |t| deployments::change(t, &who, &name, &change)).await?;
            json(200, &d)
        }
        Action::ChangeDaemonSet { name, change } => {
            authorize(id, Request::WriteDaemonSets)?;
            let who = id.clone();
            let d = store.write(move |t| daemonsets::change(t, &who, &name, &change)).await?;
            json(200, &d)
        }
        Action::ListDaemonSets { selector } => {
            authorize(id, Request::ReadDaemonSets)?;
            list_owned::<DaemonSet>(store, id, &selector, |d| hide_env_values(&mut d.spec.template.spec))
        }
        Action::GetDaemonSet(name) => {
            authorize(id, Request::ReadDaemonSets)?;
            get_owned::<DaemonSet>(store, id, "DaemonSet", &name, |d| hide_env_values(&mut d.spec.template.spec))
        }
        Action::ApplyDaemonSet(mut d) => {
            authorize(id, Request::WriteDaemonSets)?;
            d.metadata.owner = cluster::person_name(id).map(str::to_string);
            if let Some(held) = users::Held::of(id) {
                held.apply(&mut d.spec.template.spec, "spec.template.spec", &state.allowed_host_paths)?;
            }
            let uid = cluster::new_uid()?;
            let applied = store.write(move |t| daemonsets::apply(t, &d, &uid)).await?;
            json(if applied.new { 201 } else { 200 }, &applied.daemonset)
        }
        Action::DeleteDaemonSet(name) => {
            authorize(id, Request::WriteDaemonSets)?;
            let pods = pods_labelled(store, specs::daemonset::DAEMONSET_LABEL, &name)?;
            let (n, who) = (name.clone(), id.clone());
            let (d, _pods) = store.write(move |t| daemonsets::delete_for(t, &who, &n, &pods)).await?;
            json(200, &d)
        }
        Action::ListPartitions => {
            authorize(id, Request::ReadPartitions)?;
            let listed = store.list::<Partition>().map_err(store_error)?;
            json(200, &List { resource_version: listed.rv, items: listed.items, unreadable: listed.unreadable })
        }
        Action::GetPartition(name) => {
            authorize(id, Request::ReadPartitions)?;
            let found = store.get::<Partition>(&name).map_err(store_error)?;
            json(200, &found.ok_or_else(|| ClusterError::not_found("Partition", &name))?)
        }
        Action::ApplyPartition(p) => {
            authorize(id, Request::WritePartitions)?;
            let uid = cluster::new_uid()?;
            let applied = store.write(move |t| partitions::apply(t, &p, &uid)).await?;
            tracing::info!(partition = %applied.partition.metadata.name, by = ?cluster::person_name(id), "partition applied");
            json(if applied.new { 201 } else { 200 }, &applied.partition)
        }
        Action::DeletePartition(name) => {
            authorize(id, Request::WritePartitions)?;
            let p = store.write(move |t| partitions::delete(t, &name)).await?;
            json(200, &p)
        }
        Action::ListShares => {
            authorize(id, Request::ReadShares)?;
            let listed = store.list::<specs::fairshare::Usage>().map_err(store_error)?;
            let now = chrono::Utc::now().timestamp();
            let ledger = specs::fairshare::Ledger::new(&listed.items, now, &specs::fairshare::DEFAULT_WEIGHTS);
            json(200, &List { resource_version: listed.rv, items: ledger.shares(), unreadable: listed.unreadable })
        }
        Action::ListAcct => {
            // Whoever may list jobs: a user sees their own records.
            authorize(id, Request::ListJobs)?;
            list_owned::<specs::acct::Record>(store, id, &LabelSelector::default(), |_| {})
        }
        Action::ListUsers => {
            authorize(id, Request::ListUsers)?;
            let listed = store.list::<specs::api::User>().map_err(store_error)?;
            json(200, &List { resource_version: listed.rv, items: listed.items, unreadable: listed.unreadable })
        }
        Action::CreateUser(user) => {
            authorize(id, Request::ManageUsers)?;
            let uid = cluster::new_uid()?;
            let user = store.write(move |t| users::add(t, &user, &uid)).await?;
            let cn = format!("{}{}", crate::tls::USER_CN_PREFIX, user.metadata.name);
            let creds = state
                .pki
                .credentials(&state.server_url, &cn, user.metadata.uid.as_deref(), state.lifetimes.user)
                .map_err(|e| super::error::internal(e.to_string()))?;
            tracing::info!(user = %user.metadata.name, role = %user.spec.role, by = ?cluster::person_name(id), "user added");
            let reply = specs::api::UserCredentials {
                user,
                ca_cert: creds.ca_cert,
                client_cert: creds.client_cert,
                client_key: creds.client_key,
            };
            json(201, &reply)
        }
        Action::RevokeUser(name) => {
            authorize(id, Request::ManageUsers)?;
            let user = store.write(move |t| users::revoke(t, &name)).await?;
            tracing::info!(user = %user.metadata.name, by = ?cluster::person_name(id), "user revoked");
            json(200, &user)
        }
        Action::Renew { incarnation } => {
            authorize(id, Request::Renew)?;
            let (cn, incarnation, lifetime) = renewal(state, id, incarnation)?;
            let (client_cert, client_key) = state
                .pki
                .issue_client(&cn, incarnation.as_deref(), lifetime)
                .map_err(|e| super::error::internal(e.to_string()))?;
            tracing::info!(identity = %cn, "certificate renewed");
            let servers = match &state.peers {
                Some(p) => p.list().await,
                None => state.advertise_url.iter().cloned().collect(),
            };
            json(
                200,
                &specs::api::Renewed {
                    common_name: cn,
                    ca_cert: state.pki.ca_cert_pem.clone(),
                    client_cert,
                    client_key,
                    servers,
                },
            )
        }
        Action::ListTokens => {
            authorize(id, Request::ListTokens)?;
            let listed = store.list::<specs::api::Token>().map_err(store_error)?;
            let items = listed.items.into_iter().map(cluster::tokens::without_secret).collect();
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::CreateToken(request) => {
            authorize(id, Request::ManageTokens)?;
            let random = crate::tls::random_token().map_err(|e| super::error::internal(e.to_string()))?;
            // The id names the record (and shows in lists); the secret is another 256 bits.
            let token = crate::tls::JoinToken {
                ca_pin: Some(
                    crate::tls::ca_pin(&state.pki.ca_cert_pem).map_err(|e| super::error::internal(e.to_string()))?,
                ),
                id: Some(random.chars().take(8).collect()),
                secret: crate::tls::random_token().map_err(|e| super::error::internal(e.to_string()))?,
            };
            let new = cluster::tokens::NewToken {
                id: token.id.clone().unwrap_or_default(),
                secret_sha256: pinion_wire::tls::sha256_hex(token.secret.as_bytes()),
                ttl: request.ttl_seconds.map(std::time::Duration::from_secs),
                uses: request.uses,
                description: request.description,
            };
            let record = store.write(move |t| cluster::tokens::create(t, &new, chrono::Utc::now())).await?;
            tracing::info!(token = %record.metadata.name, by = ?cluster::person_name(id), "join token made");
            json(
                201,
                &specs::api::TokenCreated { token: token.to_string(), record: cluster::tokens::without_secret(record) },
            )
        }
        Action::RevokeToken(token_id) => {
            authorize(id, Request::ManageTokens)?;
            let record = store.write(move |t| cluster::tokens::revoke(t, &token_id, chrono::Utc::now())).await?;
            tracing::info!(token = %record.metadata.name, by = ?cluster::person_name(id), "join token revoked");
            json(200, &cluster::tokens::without_secret(record))
        }
        Action::ListEvents { kind, name } => {
            authorize(id, Request::ReadEvents)?;
            // Events follow their object: another's pod or job is absent.
            let (kind, owner) = match kind.as_str() {
                "Node" => (Kind::Node, None),
                "Job" => (Kind::Job, store.get::<Job>(&name).map_err(store_error)?.and_then(|j| j.metadata.owner)),
                _ => (Kind::Pod, store.get::<Pod>(&name).map_err(store_error)?.and_then(|p| p.metadata.owner)),
            };
            if kind != Kind::Node {
                let what = if kind == Kind::Job { "Job" } else { "Pod" };
                authorize(
                    id,
                    Request::Owned { kind: what, name: &name, owner: owner.as_deref(), access: Access::Read },
                )?;
            }
            let events = store.events(kind, &name).map_err(store_error)?;
            json(200, &List { resource_version: store.resource_version(), items: events, unreadable: 0 })
        }
    }
}

/// What a renewal issues for this caller: the same common name and
/// incarnation, with its kind's lifetime. A node's certificate must be of
/// its name's current join (a deleted node, or one joined again since,
/// renews nothing); a person was checked against the store already.
fn renewal(
    state: &ApiState,
    id: &Identity,
    presented: Option<String>,
) -> Result<(String, Option<String>, std::time::Duration), ApiError> {
    let lifetimes = state.lifetimes;
    match id {
        Identity::Admin => Ok((crate::tls::ADMIN_CN.to_string(), None, lifetimes.admin)),
        Identity::Node(name) => {
            let current = nodes::incarnation(&state.store, name)?;
            if current.as_deref() != Some(presented.as_deref().unwrap_or("")) {
                return Err(ClusterError::Unauthorized(format!(
                    "this certificate of node {name:?} is of an earlier join (the node was deleted or joined again)"
                ))
                .into());
            }
            Ok((format!("{NODE_CN_PREFIX}{name}"), presented, lifetimes.node))
        }
        Identity::Person(p) => {
            Ok((format!("{}{}", crate::tls::USER_CN_PREFIX, p.metadata.name), p.metadata.uid.clone(), lifetimes.user))
        }
        _ => Err(ClusterError::Unauthorized("only a node, a person or the admin renews a certificate".into()).into()),
    }
}

/// A stored pod as an object its caller must own (a user) to act on.
fn owned(pod: &Pod, access: Access) -> Request<'_> {
    Request::Owned { kind: "Pod", name: &pod.metadata.name, owner: pod.metadata.owner.as_deref(), access }
}

/// The person whose record ends their watches when it changes.
fn holder(id: &Identity) -> Option<String> {
    match id {
        Identity::Person(p) => Some(p.metadata.name.clone()),
        _ => None,
    }
}

fn stored_pod(store: &Store, name: &str) -> Result<Pod, ApiError> {
    Ok(store.get::<Pod>(name).map_err(store_error)?.ok_or_else(|| ClusterError::not_found("Pod", name))?)
}

/// Where a bound pod's container log is served: its node, the node's
/// endpoint, and the path there (the store read the log proxy and attach
/// streams need, kept in this layer).
pub fn log_target(
    state: &ApiState,
    pod: &Pod,
    container: &str,
    follow: bool,
) -> Result<(String, String, String), ApiError> {
    let name = &pod.metadata.name;
    let (node, endpoint) = node_endpoint(state, pod, "it has no logs", "its logs")?;
    let mut path = format!(
        "/logs?pod={}&container={}&follow={follow}",
        super::parse::percent_encode(name),
        super::parse::percent_encode(container)
    );
    // The node keeps logs per pod uid: a pod deleted and created again
    // under the same name is another pod with another log.
    if let Some(uid) = &pod.metadata.uid {
        path.push_str(&format!("&uid={}", super::parse::percent_encode(uid)));
    }
    Ok((node, endpoint, path))
}

/// The node a pod is bound to and that node's endpoint. `unbound`: why an
/// unbound pod cannot be served; `what`: what the endpoint is needed for.
fn node_endpoint(state: &ApiState, pod: &Pod, unbound: &str, what: &str) -> Result<(String, String), ApiError> {
    let name = &pod.metadata.name;
    let Some(node) = pod.spec.node_name.clone() else {
        // The pod's state, not the request, is at fault: as for a rejection of an unbound pod.
        return Err(ClusterError::Conflict(format!("pod {name:?} is not on a node yet ({unbound})")).into());
    };
    let n =
        state.store.get::<Node>(&node).map_err(store_error)?.ok_or_else(|| ClusterError::not_found("Node", &node))?;
    let Some(endpoint) = n.spec.endpoint.clone() else {
        return Err(ClusterError::NoNodeEndpoint(format!(
            "node {node:?} registered no endpoint, so {what} cannot be reached"
        ))
        .into());
    };
    Ok((node, endpoint))
}
