//! Carries out parsed actions: authorization by identity, then the store write
//! or read, then the controller notification. The only API layer that touches
//! the store.

use std::sync::Arc;

use specs::api::{ApiError, JoinResponse, LabelSelector, List, Node, NodeCondition, NodeStatus, WatchEventType};
use specs::engine::SETTINGS_MISFIT;
use specs::job::Job;
use specs::{Pod, PodPhase, PodStatus};

use super::error::{bad_field, conflict, forbidden, not_found, store_error, unauthorized, Refused};
use super::parse::Action;
use crate::controller::{event, now_rfc3339};
use crate::leading::Leading;
use crate::store::{Change, Claim, Kind, Object, Store, Watch};
use crate::tls::{token_matches, Identity, Pki, NODE_CN_PREFIX};

/// What the API layer needs, shared by every connection.
pub struct ApiState {
    pub store: Store,
    pub controller: Arc<Leading>,
    pub pki: Arc<Pki>,
    /// The secret part of the join token (a caller may send it with or without the CA pin).
    pub join_secret: String,
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
    /// False: each container's env keeps its names and loses its values.
    pub env_values: bool,
}

impl WatchFilter {
    /// Whether a listed object is one the watcher sees (its first ADDED lines).
    fn keeps<T: Object>(&self, obj: &T) -> bool {
        self.selector.matches(&obj.meta().labels) && (self.node.is_none() || obj.node_name() == self.node.as_deref())
    }

    /// The line to send for a change, if any. A pod that leaves the watched node
    /// is DELETED for that watcher; one that arrives is ADDED.
    pub fn line(&self, c: &Change) -> Option<String> {
        if c.kind != self.kind || !self.selector.matches(&c.labels) {
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
        if self.env_values {
            Some(watch_line(ty, &c.object))
        } else {
            Some(watch_line(ty, &without_env_values(&c.object)))
        }
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

/// A BOOKMARK line: the watch has reached `version` and nothing the watcher
/// sees changed since its last line.
pub fn bookmark_line(kind: Kind, version: u64) -> String {
    let kind = match kind {
        Kind::Pod => "Pod",
        Kind::Node => "Node",
        Kind::Event => "Event",
        Kind::Job => "Job",
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
                let obj = if filter.env_values { obj } else { without_env_values(&obj) };
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

fn require_known(id: &Identity) -> Result<(), ApiError> {
    match id {
        Identity::Anonymous => {
            Err(unauthorized("a client certificate is required (admin credentials or a joined node's)"))
        }
        Identity::Other(cn) => Err(forbidden(format!("certificate {cn:?} is not an admin or node identity"))),
        _ => Ok(()),
    }
}

fn require_admin(id: &Identity, what: &str) -> Result<(), ApiError> {
    require_known(id)?;
    match id {
        Identity::Admin => Ok(()),
        Identity::Node(n) => Err(forbidden(format!("node {n:?} may not {what}"))),
        _ => Err(forbidden(format!("may not {what}"))),
    }
}

/// Admin, or the node itself.
fn require_self(id: &Identity, node: &str) -> Result<(), ApiError> {
    require_known(id)?;
    match id {
        Identity::Admin => Ok(()),
        Identity::Node(n) if n == node => Ok(()),
        Identity::Node(n) => Err(forbidden(format!("node {n:?} may not act for node {node:?}"))),
        _ => Err(forbidden("not allowed")),
    }
}

/// Admin, or the node the pod is bound to.
fn require_pod_access(id: &Identity, pod: &Pod) -> Result<(), ApiError> {
    require_known(id)?;
    match id {
        Identity::Admin => Ok(()),
        Identity::Node(n) if pod.spec.node_name.as_deref() == Some(n) => Ok(()),
        Identity::Node(n) => {
            Err(forbidden(format!("node {n:?} may not access pod {:?} (not bound to it)", pod.metadata.name)))
        }
        _ => Err(forbidden("not allowed")),
    }
}

pub async fn apply(state: &ApiState, id: &Identity, action: Action) -> Result<Reply, ApiError> {
    let store = &state.store;
    match action {
        Action::Health => json(200, &serde_json::json!({"status": "ok"})),
        Action::Version => json(200, &serde_json::json!({"version": env!("CARGO_PKG_VERSION")})),
        Action::Metrics => {
            require_admin(id, "read the metrics")?;
            Ok(Reply::Metrics(state.metrics.encode()))
        }
        Action::Join { token, request } => {
            let Some(token) = token else {
                return Err(unauthorized("join needs the bootstrap token as `Authorization: Bearer TOKEN`"));
            };
            let given = crate::tls::JoinToken::parse(&token).map(|t| t.secret).unwrap_or_default();
            if !token_matches(&given, &state.join_secret) {
                return Err(unauthorized("the join token is not valid"));
            }
            // The token admits new machines; it must not mint a second identity
            // for a node that already joined (that would be impersonation). The
            // name is claimed in one store write, so of two joins racing for it
            // (the node registers only later) exactly one gets a certificate.
            // A retry of the same attempt (its reply was lost) before the node
            // registered holds the claim already and is answered again.
            let name = request.node_name.clone();
            let attempt = request.attempt.clone().unwrap_or_default();
            let claim = store
                .write(move |t| -> Result<Claim, Refused> {
                    // A node registered before claims existed has no claim.
                    let claim = match t.get::<Node>(&name)? {
                        Some(_) => Claim::Taken,
                        None => t.claim(JOIN_CLAIMS, &name, attempt.as_bytes())?,
                    };
                    if claim == Claim::Taken {
                        return Err(Refused(conflict(format!(
                            "node {name:?} has already joined; to join a machine again under that name, delete the node first (pinion delete node {name})"
                        ))));
                    }
                    Ok(claim)
                })
                .await
                .map_err(|Refused(e)| e)?;
            let creds = match state
                .pki
                .credentials(&state.server_url, &format!("{NODE_CN_PREFIX}{}", request.node_name))
            {
                Ok(c) => c,
                Err(e) => {
                    // No certificate was issued this time: a name this
                    // request claimed is free again (a retry's claim stays:
                    // its first try may have delivered one).
                    let name = request.node_name.clone();
                    if claim == Claim::New {
                        if let Err(Refused(r)) =
                            store.write(move |t| -> Result<bool, Refused> { Ok(t.release(JOIN_CLAIMS, &name)?) }).await
                        {
                            tracing::error!(node = %request.node_name, error = %r.message, "cannot free the node name after a failed join");
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
            let node = scope_to_node(id, node)?;
            let listed = store.list::<Pod>().map_err(store_error)?;
            let mut items: Vec<Pod> = listed
                .items
                .into_iter()
                .filter(|p| selector.matches(&p.metadata.labels))
                .filter(|p| node.is_none() || p.spec.node_name == node)
                .collect();
            if !env_values {
                for var in items.iter_mut().flat_map(|p| p.spec.containers.iter_mut()).flat_map(|c| c.env.iter_mut()) {
                    var.value.clear();
                }
            }
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::WatchPods { selector, node, from, bookmarks, env_values } => {
            let node = scope_to_node(id, node)?;
            start_watch::<Pod>(store, WatchFilter { kind: Kind::Pod, selector, node, env_values }, from, bookmarks)
                .await
        }
        Action::CreatePod(pod) => {
            require_admin(id, "create pods")?;
            let uid = crate::tls::random_token().map_err(|e| super::error::internal(e.to_string()))?;
            // Decided before the write (the scheduler's lock is not taken inside
            // the store's committer); used only for a pod not stored yet. A pod
            // that names its node skips the scheduler, and this check with it.
            let waits =
                pod.metadata.annotations.get(specs::pod::WAIT_FOR_NODES_ANNOTATION).map(String::as_str) == Some("true");
            let never = if waits || pod.spec.node_name.is_some() {
                None
            } else {
                state.controller.current().and_then(|c| c.never_fits(&pod))
            };
            let (code, pod, replaced) = store
                .write(move |t| -> Result<(u16, Pod, Option<Pod>), Refused> {
                    let mut pod = (*pod).clone();
                    let name = pod.metadata.name.clone();
                    let mut replaced = None;
                    if let Some(existing) = t.get::<Pod>(&name)? {
                        if is_finished(&existing) {
                            // A finished pod's name is free again: the old pod and
                            // its events go in this same write.
                            replaced = t.delete::<Pod>(&name)?;
                        } else if same_user_spec(&existing, &pod) {
                            return Ok((200, existing, None));
                        } else {
                            return Err(Refused(conflict(format!(
                                "pod {name:?} already exists with a different spec (pods are immutable; delete it first)"
                            ))));
                        }
                    }
                    if let Some(message) = &never {
                        return Err(Refused(super::error::error(422, "Unschedulable", format!(
                            "{message} (annotate the pod {}: \"true\" to wait for such a node)",
                            specs::pod::WAIT_FOR_NODES_ANNOTATION
                        ))));
                    }
                    pod.metadata.uid = Some(uid[..16].to_string());
                    pod.metadata.creation_timestamp = Some(now_rfc3339());
                    let phase = if pod.spec.node_name.is_some() { PodPhase::Scheduled } else { PodPhase::Pending };
                    pod.status = Some(PodStatus {
                        phase,
                        node_name: pod.spec.node_name.clone(),
                        reason: pod.spec.node_name.as_ref().map(|_| "NodeNameSet".to_string()),
                        ..PodStatus::default()
                    });
                    t.put(&mut pod)?;
                    Ok((201, pod, replaced))
                })
                .await
                .map_err(|Refused(e)| e)?;
            if let Some(c) = state.controller.direct() {
                if let Some(old) = replaced {
                    c.pod_deleted(&old);
                }
                if code == 201 {
                    c.pod_created(&pod);
                }
            }
            json(code, &pod)
        }
        Action::GetPod(name) => {
            let pod = store.get::<Pod>(&name).map_err(store_error)?;
            match pod {
                Some(p) => {
                    require_pod_access(id, &p)?;
                    json(200, &p)
                }
                None => {
                    require_known(id)?;
                    Err(not_found("Pod", &name))
                }
            }
        }
        Action::DeletePod(name) => {
            require_admin(id, "delete pods")?;
            let n = name.clone();
            // An unreadable record (lists skip it) can be deleted too.
            let (pod, purged) = store
                .write(move |t| -> Result<(Option<Pod>, bool), Refused> {
                    if t.purge_unreadable::<Pod>(&n)? {
                        return Ok((None, true));
                    }
                    Ok((t.delete::<Pod>(&n)?, false))
                })
                .await
                .map_err(|Refused(e)| e)?;
            match (pod, purged) {
                (Some(p), _) => {
                    if let Some(c) = state.controller.direct() {
                        c.pod_deleted(&p);
                    }
                    json(200, &p)
                }
                // An unreadable pod was purged: only its name is known.
                (None, true) => json(200, &Pod::new(name.as_str(), Default::default())),
                (None, false) => Err(not_found("Pod", &name)),
            }
        }
        Action::UpdatePodStatus { name, status } => {
            require_known(id)?;
            let controller = state.controller.required()?;
            let id2 = id.clone();
            let (pod, finished) = store
                .write(move |t| -> Result<(Pod, bool), Refused> {
                    let Some(mut pod) = t.get::<Pod>(&name)? else { return Err(Refused(not_found("Pod", &name))) };
                    require_pod_access(&id2, &pod)?;
                    if !reported_for(&status, &pod) {
                        return Err(Refused(conflict(format!("the status is about an earlier pod {name:?}"))));
                    }
                    let was_finished = is_finished(&pod);
                    merge_status(&mut pod, (*status).clone())?;
                    t.put(&mut pod)?;
                    let finished = !was_finished && is_finished(&pod);
                    Ok((pod, finished))
                })
                .await
                .map_err(|Refused(e)| e)?;
            if finished {
                controller.pod_finished(&pod);
            }
            json(200, &pod)
        }
        Action::RejectPod { name, rejection } => {
            require_known(id)?;
            let controller = state.controller.required()?;
            let rejection_reason = format!("{}: {}", rejection.reason, rejection.message);
            let id2 = id.clone();
            let (pod, node) = store
                .write(move |t| -> Result<(Pod, String), Refused> {
                    let Some(mut pod) = t.get::<Pod>(&name)? else { return Err(Refused(not_found("Pod", &name))) };
                    require_pod_access(&id2, &pod)?;
                    let Some(node) = pod.spec.node_name.take() else {
                        return Err(Refused(conflict(format!("pod {name:?} is not bound to a node"))));
                    };
                    let s = pod.status.get_or_insert_with(PodStatus::default);
                    let message =
                        format!("node {node} rejected the binding: {}: {}", rejection.reason, rejection.message);
                    s.phase = PodPhase::Pending;
                    s.node_name = None;
                    s.plan = None;
                    s.placement = None;
                    s.reason = Some("Rejected".into());
                    s.message = Some(message.clone());
                    t.put(&mut pod)?;
                    t.add_event(event("Pod", &name, "Warning", "Rejected", message))?;
                    Ok((pod, node))
                })
                .await
                .map_err(|Refused(e)| e)?;
            controller.pod_rejected(&pod, &node, &rejection_reason);
            json(200, &pod)
        }
        Action::PodLog { name, container, follow } => {
            require_admin(id, "read pod logs")?;
            let pod = store.get::<Pod>(&name).map_err(store_error)?.ok_or_else(|| not_found("Pod", &name))?;
            let container = pick_container(&pod, container)?;
            let (node, endpoint, path) = log_target(state, &pod, &container, follow)?;
            Ok(Reply::Proxy { node, endpoint, path })
        }
        Action::AttachPod { name, container, known_version, offset } => {
            require_admin(id, "attach to pods")?;
            // The version is read before the pod: every change after the pod
            // as read is in the change log after `from`, so none is missed.
            let from = store.resource_version();
            if let Some(known) = known_version.filter(|&k| k > from) {
                // A version from the future would hold back the pod's status frames.
                return Err(store_error(crate::store::StoreError::Future { requested: known, current: from }));
            }
            let pod = store.get::<Pod>(&name).map_err(store_error)?.ok_or_else(|| not_found("Pod", &name))?;
            let container = pick_container(&pod, container)?;
            let watch = store.watch(from).await.map_err(store_error)?;
            Ok(Reply::Attach(Box::new(super::attach::Attach { pod, container, known_version, offset, watch })))
        }
        Action::ExecPod { name, mut request } => {
            require_admin(id, "exec in pods")?;
            let pod = store.get::<Pod>(&name).map_err(store_error)?.ok_or_else(|| not_found("Pod", &name))?;
            let container = pick_container(&pod, request.container.take())?;
            // The pod's state, not the request, is at fault: 409, as for logs of an unbound pod.
            let status = pod.status.clone().unwrap_or_default();
            if status.phase != PodPhase::Running {
                return Err(conflict(format!(
                    "pod {name:?} is {:?}, not Running: exec needs a running container",
                    status.phase
                )));
            }
            let shown = status.container_statuses.iter().find(|c| c.name == container).map(|c| c.state);
            if shown != Some(specs::status::ContainerState::Running) {
                let state = shown.map_or("not started".to_string(), |s| format!("{s:?}"));
                return Err(conflict(format!("container {container:?} of pod {name:?} is not running ({state})")));
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
        Action::ListNodes { selector } => {
            require_admin(id, "list nodes")?;
            let listed = store.list::<Node>().map_err(store_error)?;
            let items: Vec<Node> = listed.items.into_iter().filter(|n| selector.matches(&n.metadata.labels)).collect();
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::WatchNodes { selector, from, bookmarks } => {
            require_admin(id, "watch nodes")?;
            start_watch::<Node>(
                store,
                WatchFilter { kind: Kind::Node, selector, node: None, env_values: true },
                from,
                bookmarks,
            )
            .await
        }
        Action::RegisterNode(node) => {
            require_self(id, &node.metadata.name)?;
            let controller = state.controller.required()?;
            let (code, node) = store
                .write(move |t| -> Result<(u16, Node), Refused> {
                    let mut node = (*node).clone();
                    let name = node.metadata.name.clone();
                    let code = match t.get::<Node>(&name)? {
                        Some(existing) => {
                            // Re-registration: new topology/settings/labels, same history.
                            node.metadata.uid = existing.metadata.uid;
                            node.metadata.creation_timestamp = existing.metadata.creation_timestamp;
                            node.status.allocations = existing.status.allocations;
                            200
                        }
                        None => {
                            node.metadata.creation_timestamp = Some(now_rfc3339());
                            201
                        }
                    };
                    node.status.condition = NodeCondition::Ready;
                    node.status.last_report = Some(now_rfc3339());
                    node.status.numa = NodeStatus::numa_summary(
                        &node.spec.topology,
                        &node.spec.settings,
                        &node.status.allocations,
                        &node.status.offline_cpus,
                    );
                    t.put(&mut node)?;
                    t.add_event(event("Node", &name, "Normal", "Registered", "node registered"))?;
                    Ok((code, node))
                })
                .await
                .map_err(|Refused(e)| e)?;
            controller.node_registered(&node);
            json(code, &node)
        }
        Action::GetNode(name) => {
            require_self(id, &name)?;
            match store.get::<Node>(&name).map_err(store_error)? {
                Some(n) => json(200, &n),
                None => Err(not_found("Node", &name)),
            }
        }
        Action::DeleteNode(name) => {
            require_admin(id, "delete nodes")?;
            let n = name.clone();
            // The name's join claim goes too, so the machine can join again;
            // an unreadable record (lists skip it) is removed as well.
            let (node, claimed) = store
                .write(move |t| -> Result<(Option<Node>, bool), Refused> {
                    let purged = t.purge_unreadable::<Node>(&n)?;
                    let node = if purged { None } else { t.delete::<Node>(&n)? };
                    Ok((node, t.release(JOIN_CLAIMS, &n)? || purged))
                })
                .await
                .map_err(|Refused(e)| e)?;
            match (node, claimed) {
                (Some(node), _) => {
                    if let Some(c) = state.controller.direct() {
                        c.node_deleted(&name);
                    }
                    json(200, &node)
                }
                // Joined but never registered (only its name was held), or unreadable.
                (None, true) => json(200, &joined_only(&name)),
                (None, false) => Err(not_found("Node", &name)),
            }
        }
        Action::Heartbeat(name) => {
            require_self(id, &name)?;
            match state.controller.required()?.heartbeat(&name).await.map_err(|Refused(e)| e)? {
                false => Err(not_found("Node", &name)),
                true => json(200, &serde_json::json!({"condition": "Ready"})),
            }
        }
        Action::ReportNodeStatus { name, report } => {
            require_self(id, &name)?;
            let n = name.clone();
            let controller = state.controller.required()?;
            let _g = controller.transition_guard().await;
            let (node, confirmed, finished) = store
                .write(move |t| -> Result<(Node, Vec<String>, Vec<Pod>), Refused> {
                    let Some(mut node) = t.get::<Node>(&n)? else { return Err(Refused(not_found("Node", &n))) };
                    let (mut confirmed, mut finished) = (Vec::new(), Vec::new());
                    let was_ready = node.status.condition == NodeCondition::Ready;
                    node.status.allocations = report.allocations.clone();
                    node.status.condition = NodeCondition::Ready;
                    node.status.last_report = Some(now_rfc3339());
                    node.status.offline_cpus = report.offline_cpus.clone();
                    node.status.numa = NodeStatus::numa_summary(
                        &node.spec.topology,
                        &node.spec.settings,
                        &node.status.allocations,
                        &node.status.offline_cpus,
                    );
                    t.put(&mut node)?;
                    if !was_ready {
                        t.add_event(event("Node", &n, "Normal", "NodeReady", "status reports resumed"))?;
                    }
                    for (pod_name, status) in report.pods.clone() {
                        let Some(mut pod) = t.get::<Pod>(&pod_name)? else { continue };
                        if pod.spec.node_name.as_deref() != Some(&n) {
                            continue; // Not ours (any more): the node learns from its watch.
                        }
                        if !reported_for(&status, &pod) {
                            continue; // About an earlier pod of this name.
                        }
                        // Admitted (running or done): the binding is no longer in flight.
                        if matches!(status.phase, PodPhase::Running | PodPhase::Succeeded | PodPhase::Failed) {
                            confirmed.push(pod_name.clone());
                        }
                        let before = pod.status.clone();
                        let was_finished = is_finished(&pod);
                        if merge_status(&mut pod, status).is_ok() && pod.status != before {
                            if let Some(message) = new_misfit(before.as_ref(), pod.status.as_ref()) {
                                t.add_event(event("Pod", &pod_name, "Warning", SETTINGS_MISFIT, message))?;
                            }
                            t.put(&mut pod)?;
                            if !was_finished && is_finished(&pod) {
                                finished.push(pod);
                            }
                        }
                    }
                    Ok((node, confirmed, finished))
                })
                .await
                .map_err(|Refused(e)| e)?;
            controller.node_reported(&node, true, &confirmed);
            for pod in &finished {
                controller.pod_finished(pod);
            }
            json(200, &node.status)
        }
        Action::ListJobs { selector } => {
            require_admin(id, "list jobs")?;
            let listed = store.list::<Job>().map_err(store_error)?;
            let items: Vec<Job> = listed.items.into_iter().filter(|j| selector.matches(&j.metadata.labels)).collect();
            json(200, &List { resource_version: listed.rv, items, unreadable: listed.unreadable })
        }
        Action::GetJob(name) => {
            require_admin(id, "read jobs")?;
            match store.get::<Job>(&name).map_err(store_error)? {
                Some(j) => json(200, &j),
                None => Err(not_found("Job", &name)),
            }
        }
        Action::CreateJob(job) => {
            require_admin(id, "create jobs")?;
            let uid = crate::tls::random_token().map_err(|e| super::error::internal(e.to_string()))?;
            // As for a pod: a gang no cluster could ever hold at once is refused now.
            let never = state.controller.current().and_then(|c| c.gang_never_fits(&job));
            let (code, job, changes) = store
                .write(move |t| -> Result<(u16, Job, crate::jobs::MemberChanges), Refused> {
                    let mut job = (*job).clone();
                    let name = job.metadata.name.clone();
                    let mut changes = crate::jobs::MemberChanges::default();
                    if let Some(existing) = t.get::<Job>(&name)? {
                        let ended = existing.status.as_ref().is_some_and(|s| s.phase.is_terminal());
                        if !ended && existing.spec == job.spec && existing.metadata.labels == job.metadata.labels {
                            return Ok((200, existing, changes));
                        }
                        if !ended {
                            return Err(Refused(conflict(format!(
                                "job {name:?} already exists with a different spec and has not ended (delete it first)"
                            ))));
                        }
                        // An ended job's name is free again: it and its members go in this write.
                        if let Some((_, old)) = crate::jobs::delete(t, &name)? {
                            changes = old;
                        }
                    }
                    if let Some(message) = &never {
                        return Err(Refused(super::error::error(422, "Unschedulable", message.clone())));
                    }
                    job.metadata.uid = Some(uid[..16].to_string());
                    job.metadata.creation_timestamp = Some(now_rfc3339());
                    job.status = Some(specs::job::JobStatus::default());
                    t.put(&mut job)?;
                    let created = crate::jobs::create_members(t, &job)?;
                    changes.deleted.extend(created.deleted);
                    changes.created = created.created;
                    Ok((201, job, changes))
                })
                .await
                .map_err(|Refused(e)| e)?;
            if let Some(c) = state.controller.direct() {
                for p in &changes.deleted {
                    c.pod_deleted(p);
                }
                c.pods_created(&changes.created);
            }
            json(code, &job)
        }
        Action::DeleteJob(name) => {
            require_admin(id, "delete jobs")?;
            let n = name.clone();
            let deleted = store
                .write(move |t| -> Result<Option<(Job, crate::jobs::MemberChanges)>, Refused> {
                    crate::jobs::delete(t, &n)
                })
                .await
                .map_err(|Refused(e)| e)?;
            match deleted {
                Some((job, changes)) => {
                    if let Some(c) = state.controller.direct() {
                        for p in &changes.deleted {
                            c.pod_deleted(p);
                        }
                    }
                    json(200, &job)
                }
                None => Err(not_found("Job", &name)),
            }
        }
        Action::ListEvents { kind, name } => {
            require_admin(id, "list events")?;
            let kind = match kind.as_str() {
                "Node" => Kind::Node,
                "Job" => Kind::Job,
                _ => Kind::Pod,
            };
            let events = store.events(kind, &name).map_err(store_error)?;
            json(200, &List { resource_version: store.resource_version(), items: events, unreadable: 0 })
        }
    }
}

/// The claim space of node names taken by a join (`Txn::claim`).
const JOIN_CLAIMS: &str = "join";

/// What a delete answers for a node that joined but never registered.
fn joined_only(name: &str) -> Node {
    Node {
        api_version: specs::pod::API_VERSION.to_string(),
        kind: "Node".into(),
        metadata: specs::pod::ObjectMeta { name: name.to_string(), ..Default::default() },
        spec: Default::default(),
        status: Default::default(),
    }
}

/// The container a log or attach request means: the one named, or the pod's only one.
fn pick_container(pod: &Pod, container: Option<String>) -> Result<String, ApiError> {
    let name = &pod.metadata.name;
    let names: Vec<&str> = pod.spec.containers.iter().map(|c| c.name.as_str()).collect();
    match (container, names.as_slice()) {
        (Some(c), _) if names.contains(&c.as_str()) => Ok(c),
        (Some(c), _) => {
            Err(bad_field("container", format!("pod {name:?} has no container {c:?} (it has: {})", names.join(", "))))
        }
        (None, [only]) => Ok(only.to_string()),
        (None, _) => Err(bad_field(
            "container",
            format!("pod {name:?} has {} containers: name one ({})", names.len(), names.join(", ")),
        )),
    }
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
        return Err(conflict(format!("pod {name:?} is not on a node yet ({unbound})")));
    };
    let n = state.store.get::<Node>(&node).map_err(store_error)?.ok_or_else(|| not_found("Node", &node))?;
    let Some(endpoint) = n.spec.endpoint.clone() else {
        // Nothing upstream failed (that is 502 NodeUnreachable): the node's
        // registration lacks what this needs, a state to change, not a server fault.
        return Err(super::error::error(
            409,
            "NoNodeEndpoint",
            format!("node {node:?} registered no endpoint, so {what} cannot be reached"),
        ));
    };
    Ok((node, endpoint))
}

fn is_finished(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase.is_terminal())
}

/// Whether a create repeats the stored pod: the same user-given spec, labels
/// and annotations, ignoring what the system sets (the scheduler's
/// `spec.nodeName` unless the caller named a node, the status, uid, versions).
fn same_user_spec(stored: &Pod, given: &Pod) -> bool {
    let mut spec = stored.spec.clone();
    if given.spec.node_name.is_none() {
        spec.node_name = None;
    }
    spec == given.spec
        && stored.metadata.labels == given.metadata.labels
        && stored.metadata.annotations == given.metadata.annotations
}

/// Nodes see only their own pods: the node filter is forced to the caller.
fn scope_to_node(id: &Identity, node: Option<String>) -> Result<Option<String>, ApiError> {
    require_known(id)?;
    match id {
        Identity::Node(me) => match node {
            None => Ok(Some(me.clone())),
            Some(n) if &n == me => Ok(Some(n)),
            Some(n) => Err(forbidden(format!("node {me:?} may not read the pods of node {n:?}"))),
        },
        _ => Ok(node),
    }
}

/// A reported status replaces the observed parts; the scheduler's parts (plan,
/// attempts, placement when not reported) stay. A terminal phase is final.
fn merge_status(pod: &mut Pod, mut reported: PodStatus) -> Result<(), ApiError> {
    let current = pod.status.clone().unwrap_or_default();
    if !current.phase.can_become(reported.phase) {
        return Err(conflict(format!(
            "pod {:?} is {:?}; it cannot become {:?}",
            pod.metadata.name, current.phase, reported.phase
        )));
    }
    reported.plan = current.plan;
    reported.attempts = current.attempts;
    if reported.placement.is_none() {
        reported.placement = current.placement;
    }
    reported.node_name = pod.spec.node_name.clone();
    // The node's tag, checked by the caller; not part of the stored status.
    reported.pod_uid = None;
    pod.status = Some(reported);
    Ok(())
}

/// The message of a node's report that a pod's placement no longer fits
/// the node's settings (after the node restarted with others), when it did
/// not say so before: one event per finding, not one per report.
fn new_misfit(before: Option<&PodStatus>, now: Option<&PodStatus>) -> Option<String> {
    let now = now.filter(|s| s.reason.as_deref() == Some(SETTINGS_MISFIT))?;
    let said = |s: &PodStatus| (s.reason.clone(), s.message.clone());
    (before.map(said) != Some(said(now))).then(|| now.message.clone().unwrap_or_default())
}

/// Whether a node's status report is about this incarnation of the pod: a
/// report naming another uid (the pod was replaced under the same name) is
/// about a pod that is gone.
fn reported_for(status: &PodStatus, pod: &Pod) -> bool {
    status.pod_uid.is_none() || status.pod_uid == pod.metadata.uid
}
