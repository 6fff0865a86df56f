//! Requests to typed actions (firecracker's `parsed_request.rs`): the handler
//! only decodes and validates here; `apply` carries actions out against the
//! store. Nothing in this module touches the store.

use bytes::Bytes;
use hyper::HeaderMap;
use specs::api::ApiError;
use specs::api::{ExecRequest, JoinRequest, LabelSelector, Node, NodeStatusReport, PodRejection};
use specs::validate::FieldError;
use specs::{Pod, PodStatus};

use super::error::{bad_field, invalid};
use super::routes::RouteId;

#[derive(Debug)]
pub enum Action {
    Health,
    Version,
    Metrics,
    Join {
        token: Option<String>,
        request: JoinRequest,
    },
    /// `env_values`: false on the local listener, whose callers are every
    /// user of the machine (the env's names are kept, its values left out).
    ListPods {
        selector: LabelSelector,
        node: Option<String>,
        env_values: bool,
    },
    WatchPods {
        selector: LabelSelector,
        node: Option<String>,
        from: Option<u64>,
        bookmarks: bool,
        env_values: bool,
    },
    CreatePod(Box<Pod>),
    GetPod(String),
    DeletePod(String),
    UpdatePodStatus {
        name: String,
        status: Box<PodStatus>,
    },
    RejectPod {
        name: String,
        rejection: PodRejection,
    },
    PodLog {
        name: String,
        container: Option<String>,
        follow: bool,
    },
    AttachPod {
        name: String,
        container: Option<String>,
        known_version: Option<u64>,
        offset: u64,
        /// Delete the pod once it finished, before the exit frame (`run --rm`).
        rm: bool,
    },
    ExecPod {
        name: String,
        request: ExecRequest,
    },
    ExecInput {
        name: String,
        input: specs::api::ExecInput,
    },
    ListNodes {
        selector: LabelSelector,
    },
    WatchNodes {
        selector: LabelSelector,
        from: Option<u64>,
        bookmarks: bool,
    },
    RegisterNode(Box<Node>),
    GetNode(String),
    DeleteNode(String),
    Heartbeat(String),
    ReportNodeStatus {
        name: String,
        report: Box<NodeStatusReport>,
    },
    ListEvents {
        kind: String,
        name: String,
    },
    ListJobs {
        selector: LabelSelector,
    },
    CreateJob(Box<specs::job::Job>),
    GetJob(String),
    DeleteJob(String),
    /// `true`: hold (Slurm's `scontrol hold`); `false`: release.
    HoldJob {
        name: String,
        hold: bool,
    },
    ListDeployments {
        selector: LabelSelector,
    },
    ApplyDeployment(Box<specs::deployment::Deployment>),
    GetDeployment(String),
    DeleteDeployment(String),
    ChangeDeployment {
        name: String,
        change: crate::cluster::deployments::Change,
    },
    ListDaemonSets {
        selector: LabelSelector,
    },
    ApplyDaemonSet(Box<specs::daemonset::DaemonSet>),
    GetDaemonSet(String),
    DeleteDaemonSet(String),
    /// `rollout undo` or `restart` (a scale is refused by `cluster`).
    ChangeDaemonSet {
        name: String,
        change: crate::cluster::deployments::Change,
    },
    ListPartitions,
    ApplyPartition(Box<specs::partition::Partition>),
    GetPartition(String),
    DeletePartition(String),
    ListShares,
    ListAcct,
    ListUsers,
    CreateUser(Box<specs::api::User>),
    RevokeUser(String),
    /// A fresh certificate for the caller; `incarnation` is the presented
    /// certificate's (filled in by the handler, which knows the caller).
    Renew {
        incarnation: Option<String>,
    },
    ListTokens,
    CreateToken(specs::api::TokenRequest),
    RevokeToken(String),
}

impl Action {
    /// The same action, answered without env values (the local listener).
    pub fn without_env_values(self) -> Action {
        match self {
            Action::ListPods { selector, node, .. } => Action::ListPods { selector, node, env_values: false },
            Action::WatchPods { selector, node, from, bookmarks, .. } => {
                Action::WatchPods { selector, node, from, bookmarks, env_values: false }
            }
            other => other,
        }
    }
}

pub fn parse(
    route: RouteId,
    param: Option<String>,
    query: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Action, ApiError> {
    let q = Query::parse(query)?;
    let name = || -> Result<String, ApiError> {
        let n = param.clone().unwrap_or_default();
        match name_problem(&n) {
            None => Ok(n),
            Some(p) => Err(bad_field("name", format!("{n:?} in the path {p}"))),
        }
    };
    Ok(match route {
        RouteId::Health => Action::Health,
        RouteId::Version => Action::Version,
        RouteId::Metrics => Action::Metrics,
        RouteId::Join => {
            let token = headers
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|t| t.trim().to_string());
            let request: JoinRequest = decode_json(body)?;
            let problems = specs::validate::validate_join(&request);
            if !problems.is_empty() {
                return Err(invalid("JoinRequest", &request.node_name, problems));
            }
            Action::Join { token, request }
        }
        RouteId::ListPods => {
            let selector = selector(&q)?;
            let node = q.get("nodeName").map(str::to_string);
            // Checked for a list too (where it is unused): a bad value is the caller's mistake either way.
            let from = q.number("resourceVersion")?;
            let bookmarks = q.flag("allowWatchBookmarks")?;
            if q.flag("watch")? {
                // Opt-in, as in Kubernetes: a client older than BOOKMARK would
                // refuse the event type.
                Action::WatchPods { selector, node, from, bookmarks, env_values: true }
            } else {
                Action::ListPods { selector, node, env_values: true }
            }
        }
        RouteId::CreatePod => Action::CreatePod(Box::new(parse_pod(body, is_json(headers))?)),
        RouteId::GetPod => Action::GetPod(name()?),
        RouteId::DeletePod => Action::DeletePod(name()?),
        RouteId::UpdatePodStatus => Action::UpdatePodStatus { name: name()?, status: Box::new(decode_json(body)?) },
        RouteId::RejectPod => Action::RejectPod { name: name()?, rejection: decode_json(body)? },
        RouteId::PodLog => Action::PodLog {
            name: name()?,
            container: q.get("container").filter(|c| !c.is_empty()).map(str::to_string),
            follow: q.flag("follow")?,
        },
        RouteId::AttachPod => Action::AttachPod {
            name: name()?,
            container: q.get("container").filter(|c| !c.is_empty()).map(str::to_string),
            known_version: q.number("resourceVersion")?,
            offset: q.number("offset")?.unwrap_or(0),
            rm: q.flag("rm")?,
        },
        RouteId::ExecPod => {
            let name = name()?;
            let request: ExecRequest = decode_json(body)?;
            let problems = specs::validate::validate_exec(&request);
            if !problems.is_empty() {
                return Err(invalid("ExecRequest", "", problems));
            }
            Action::ExecPod { name, request }
        }
        RouteId::ExecInput => {
            let name = name()?;
            let input: specs::api::ExecInput = decode_json(body)?;
            let problems = specs::validate::validate_exec_input(&input);
            if !problems.is_empty() {
                return Err(invalid("ExecInput", "", problems));
            }
            Action::ExecInput { name, input }
        }
        RouteId::ListNodes => {
            let selector = selector(&q)?;
            let from = q.number("resourceVersion")?;
            let bookmarks = q.flag("allowWatchBookmarks")?;
            if q.flag("watch")? {
                Action::WatchNodes { selector, from, bookmarks }
            } else {
                Action::ListNodes { selector }
            }
        }
        RouteId::RegisterNode => Action::RegisterNode(Box::new(parse_node(body)?)),
        RouteId::GetNode => Action::GetNode(name()?),
        RouteId::DeleteNode => Action::DeleteNode(name()?),
        RouteId::Heartbeat => Action::Heartbeat(name()?),
        RouteId::ReportNodeStatus => {
            let name = name()?;
            let report: NodeStatusReport = decode_json(body)?;
            if !report.node_name.is_empty() && report.node_name != name {
                return Err(bad_field(
                    "nodeName",
                    format!("{:?} does not match the path's {name:?}", report.node_name),
                ));
            }
            Action::ReportNodeStatus { name, report: Box::new(report) }
        }
        RouteId::ListEvents => {
            let kind = q.get("kind").unwrap_or("Pod").to_string();
            if kind != "Pod" && kind != "Node" && kind != "Job" {
                return Err(bad_field("kind", format!("{kind:?}: must be Pod, Node or Job")));
            }
            let name = q.get("name").ok_or_else(|| bad_field("name", "the query parameter is required"))?;
            Action::ListEvents { kind, name: name.to_string() }
        }
        RouteId::ListJobs => Action::ListJobs { selector: selector(&q)? },
        RouteId::CreateJob => Action::CreateJob(Box::new(parse_job(body, is_json(headers))?)),
        RouteId::GetJob => Action::GetJob(name()?),
        RouteId::DeleteJob => Action::DeleteJob(name()?),
        RouteId::HoldJob => Action::HoldJob { name: name()?, hold: true },
        RouteId::ReleaseJob => Action::HoldJob { name: name()?, hold: false },
        RouteId::ListDeployments => Action::ListDeployments { selector: selector(&q)? },
        RouteId::ApplyDeployment => Action::ApplyDeployment(Box::new(parse_deployment(body, is_json(headers))?)),
        RouteId::GetDeployment => Action::GetDeployment(name()?),
        RouteId::DeleteDeployment => Action::DeleteDeployment(name()?),
        RouteId::ScaleDeployment => {
            let name = name()?;
            let scale: specs::deployment::Scale = decode_json(body)?;
            Action::ChangeDeployment { name, change: crate::cluster::deployments::Change::Scale(scale.replicas) }
        }
        RouteId::UndoDeployment => Action::ChangeDeployment { name: name()?, change: undo(body)? },
        RouteId::RestartDeployment => Action::ChangeDeployment { name: name()?, change: restart() },
        RouteId::ListDaemonSets => Action::ListDaemonSets { selector: selector(&q)? },
        RouteId::ApplyDaemonSet => Action::ApplyDaemonSet(Box::new(parse_daemonset(body, is_json(headers))?)),
        RouteId::GetDaemonSet => Action::GetDaemonSet(name()?),
        RouteId::DeleteDaemonSet => Action::DeleteDaemonSet(name()?),
        RouteId::UndoDaemonSet => Action::ChangeDaemonSet { name: name()?, change: undo(body)? },
        RouteId::RestartDaemonSet => Action::ChangeDaemonSet { name: name()?, change: restart() },
        RouteId::ListPartitions => Action::ListPartitions,
        RouteId::ApplyPartition => Action::ApplyPartition(Box::new(parse_partition(body, is_json(headers))?)),
        RouteId::GetPartition => Action::GetPartition(name()?),
        RouteId::DeletePartition => Action::DeletePartition(name()?),
        RouteId::ListShares => Action::ListShares,
        RouteId::ListAcct => Action::ListAcct,
        RouteId::ListUsers => Action::ListUsers,
        RouteId::CreateUser => {
            let user: specs::api::User = decode_json(body)?;
            if user.kind != "User" {
                return Err(bad_field("kind", format!("{:?}: must be User", user.kind)));
            }
            let problems = crate::cluster::users::validate(&user);
            if !problems.is_empty() {
                return Err(invalid("User", &user.metadata.name, problems));
            }
            Action::CreateUser(Box::new(user))
        }
        RouteId::RevokeUser => Action::RevokeUser(name()?),
        RouteId::Renew => Action::Renew { incarnation: None },
        RouteId::ListTokens => Action::ListTokens,
        RouteId::CreateToken => {
            let request: specs::api::TokenRequest = decode_json(body)?;
            if request.ttl_seconds.is_some_and(|t| t == 0 || t > specs::limits::MAX_TTL_SECONDS) {
                return Err(bad_field(
                    "ttlSeconds",
                    format!(
                        "1 to {} (a year); leave it out for a token that never expires",
                        specs::limits::MAX_TTL_SECONDS
                    ),
                ));
            }
            if request.uses == Some(0) {
                return Err(bad_field("uses", "at least 1; leave it out for unlimited uses"));
            }
            if request.description.len() > specs::limits::MAX_STRING_LEN {
                return Err(bad_field("description", format!("at most {} bytes", specs::limits::MAX_STRING_LEN)));
            }
            Action::CreateToken(request)
        }
        RouteId::RevokeToken => Action::RevokeToken(name()?),
    })
}

/// Whether the body says it is JSON: then it is decoded as JSON (linear, its
/// depth bounded by serde_json), never by the YAML parser.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The body as text, refused before any parser sees it when it nests
/// deeper than `specs::limits::MAX_NESTING` (libyaml is quadratic there;
/// JSON is checked the same way so that the refusal reads the same).
fn body_text(body: &Bytes) -> Result<&str, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| bad_field("(body)", "not UTF-8"))?;
    match specs::manifest::nesting_problem(text) {
        Some(p) => Err(bad_field("(body)", p)),
        None => Ok(text),
    }
}

/// A job, YAML or JSON: a decoding error names its field, then every
/// semantic problem (`specs::job::validate_job`, the template's as a pod's
/// under `spec.template`).
pub fn parse_job(body: &Bytes, json: bool) -> Result<specs::job::Job, ApiError> {
    let text = body_text(body)?;
    let mut job: specs::job::Job = if json {
        // serde reads a struct from a list too; a job is an object.
        if !text.trim_start().starts_with('{') {
            return Err(invalid(
                "Job",
                "",
                vec![FieldError { field: "(body)".into(), message: "a job is a JSON object".into() }],
            ));
        }
        from_json(body).map_err(|e| invalid("Job", "", vec![e]))?
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| invalid("Job", "", vec![json_field_error(&e)]))?
    };
    let problems = specs::job::validate_job(&job);
    if !problems.is_empty() {
        return Err(invalid("Job", &job.metadata.name, problems));
    }
    job.status = None;
    job.metadata.uid = None;
    job.metadata.resource_version = None;
    job.metadata.creation_timestamp = None;
    Ok(job)
}

/// A Deployment, YAML or JSON: a decoding error names its field, then every
/// semantic problem (`specs::deployment::validate_deployment`).
pub fn parse_deployment(body: &Bytes, json: bool) -> Result<specs::deployment::Deployment, ApiError> {
    let text = body_text(body)?;
    let mut d: specs::deployment::Deployment = if json {
        if !text.trim_start().starts_with('{') {
            return Err(invalid(
                "Deployment",
                "",
                vec![FieldError { field: "(body)".into(), message: "a deployment is a JSON object".into() }],
            ));
        }
        from_json(body).map_err(|e| invalid("Deployment", "", vec![e]))?
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| invalid("Deployment", "", vec![json_field_error(&e)]))?
    };
    let problems = specs::deployment::validate_deployment(&d);
    if !problems.is_empty() {
        return Err(invalid("Deployment", &d.metadata.name, problems));
    }
    d.status = None;
    d.metadata.uid = None;
    d.metadata.resource_version = None;
    d.metadata.creation_timestamp = None;
    d.metadata.generation = None;
    Ok(d)
}

/// A DaemonSet, YAML or JSON: a decoding error names its field, then every
/// semantic problem (`specs::daemonset::validate_daemonset`).
pub fn parse_daemonset(body: &Bytes, json: bool) -> Result<specs::daemonset::DaemonSet, ApiError> {
    let mut d: specs::daemonset::DaemonSet = decode_manifest(body, json, "DaemonSet", "a daemonset")?;
    let problems = specs::daemonset::validate_daemonset(&d);
    if !problems.is_empty() {
        return Err(invalid("DaemonSet", &d.metadata.name, problems));
    }
    d.status = None;
    d.metadata.uid = None;
    d.metadata.resource_version = None;
    d.metadata.creation_timestamp = None;
    d.metadata.generation = None;
    Ok(d)
}

/// A Partition, YAML or JSON, as a DaemonSet is read
/// (`specs::partition::validate_partition`); the server sets its metadata.
pub fn parse_partition(body: &Bytes, json: bool) -> Result<specs::partition::Partition, ApiError> {
    let mut p: specs::partition::Partition = decode_manifest(body, json, "Partition", "a partition")?;
    let problems = specs::partition::validate_partition(&p);
    if !problems.is_empty() {
        return Err(invalid("Partition", &p.metadata.name, problems));
    }
    p.metadata.uid = None;
    p.metadata.resource_version = None;
    p.metadata.creation_timestamp = None;
    p.metadata.generation = None;
    p.metadata.owner = None;
    Ok(p)
}

/// One object of `kind` from a YAML or JSON body, a decoding error at its field.
fn decode_manifest<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    json: bool,
    kind: &str,
    what: &str,
) -> Result<T, ApiError> {
    let text = body_text(body)?;
    if json {
        if !text.trim_start().starts_with('{') {
            return Err(invalid(
                kind,
                "",
                vec![FieldError { field: "(body)".into(), message: format!("{what} is a JSON object") }],
            ));
        }
        from_json(body).map_err(|e| invalid(kind, "", vec![e]))
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| invalid(kind, "", vec![json_field_error(&e)]))
    }
}

/// `rollout undo` of a Deployment or a DaemonSet: the revision the body
/// names, or (an empty body) the one before the current.
fn undo(body: &Bytes) -> Result<crate::cluster::deployments::Change, ApiError> {
    let undo: specs::deployment::Undo =
        if body.iter().all(u8::is_ascii_whitespace) { Default::default() } else { decode_json(body)? };
    Ok(crate::cluster::deployments::Change::Undo(undo.to_revision))
}

/// `rollout restart`: the time of the request, in the template's annotation.
fn restart() -> crate::cluster::deployments::Change {
    crate::cluster::deployments::Change::Restart(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// A JSON body; an error names the field at fault (`pods.web.phase`), or
/// `(body)` when the body as a whole is not JSON of the right shape.
/// A JSON object body; serde would read a struct from a list too
/// (`[null, null]`), which no route's contract accepts.
fn decode_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(bad_field("(body)", "want a JSON object"));
    }
    from_json(body).map_err(|FieldError { field, message }| bad_field(field, message))
}

fn from_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, FieldError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| json_field_error(&e))?;
    de.end().map_err(|e| FieldError { field: "(body)".into(), message: e.to_string() })?;
    Ok(value)
}

/// The field a JSON decoding error is about: its path, else for a missing
/// field that field's name, else `(body)`.
fn json_field_error<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> FieldError {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = e.inner().to_string();
    let missing = message.strip_prefix("missing field `").and_then(|m| m.split_once('`')).map(|(name, _)| name);
    let field = match (path.is_empty(), missing) {
        (true, Some(name)) => name.to_string(),
        (false, Some(name)) => format!("{path}.{name}"),
        (false, None) => path,
        (true, None) => "(body)".to_string(),
    };
    FieldError { field, message }
}

/// The YAML parser reads JSON too; its message starts with the field path when
/// the error is inside a field (`spec.containers[0]: unknown field ...`).
fn decode_error(e: &serde_yaml_ng::Error) -> FieldError {
    let text = e.to_string();
    match text.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') && !path.is_empty() => {
            FieldError { field: path.to_string(), message: rest.to_string() }
        }
        _ => FieldError { field: "(body)".into(), message: text },
    }
}

/// One pod from a YAML or JSON body, every problem with its field path.
pub fn parse_pod(body: &Bytes, json: bool) -> Result<Pod, ApiError> {
    let text = body_text(body)?;
    let value: serde_yaml_ng::Value = if json {
        let v: serde_json::Value = from_json(body).map_err(|e| invalid("Pod", "", vec![e]))?;
        serde_yaml_ng::to_value(v).map_err(|e| invalid("Pod", "", vec![decode_error(&e)]))?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| invalid("Pod", "", vec![decode_error(&e)]))?
    };
    // Structural problems first (all of them), then the semantic ones.
    let mut decoded = specs::manifest::decode_pod(&value);
    // A problem with the document as a whole (a list, a string) has the empty path.
    for e in decoded.errors.iter_mut().filter(|e| e.field.is_empty()) {
        e.field = "(body)".into();
    }
    let Some(mut pod) = decoded.pod.take() else {
        return Err(invalid("Pod", "", decoded.errors));
    };
    // The bounds are the validator's alone (`specs::limits`), so the API and
    // `pinion apply`'s own check refuse exactly the same pods.
    decoded.add_semantic(specs::validate::validate_pod(&pod));
    if !decoded.errors.is_empty() {
        return Err(invalid("Pod", &pod.metadata.name, decoded.errors));
    }
    // Server-owned fields are never taken from the client.
    pod.status = None;
    pod.metadata.uid = None;
    pod.metadata.resource_version = None;
    pod.metadata.creation_timestamp = None;
    Ok(pod)
}

/// A node's registration. Its topology is bounded and coherent like a pod is
/// (`specs::validate::validate_node`): the controller indexes it under its lock
/// and every placement on it is stored, so an id the store cannot read back, or
/// a CPU on a NUMA node that is not listed, never gets in.
pub fn parse_node(body: &Bytes) -> Result<Node, ApiError> {
    let node: Node = from_json(body).map_err(|e| invalid("Node", "", vec![e]))?;
    let errs = specs::validate::validate_node(&node);
    if !errs.is_empty() {
        return Err(invalid("Node", &node.metadata.name, errs));
    }
    Ok(node)
}

/// Names in paths, node names and join requests: one rule, in `specs`.
pub use specs::validate::name_problem;

pub use pinion_wire::query::{percent_encode, Query};

/// The `labelSelector` parameter.
fn selector(q: &Query) -> Result<LabelSelector, ApiError> {
    LabelSelector::parse(q.get("labelSelector").unwrap_or("")).map_err(|e| bad_field("labelSelector", e.reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_pod(manifest: &str, expected_fields: &[&str]) {
        let got = parse_pod(&Bytes::from(manifest.to_string()), false);
        let fields: Vec<String> = match got {
            Ok(_) => Vec::new(),
            Err(e) => e.details.iter().map(|d| d.field.clone()).collect(),
        };
        assert_eq!(fields, expected_fields, "{manifest}");
    }

    #[test]
    fn pod_problems_name_their_fields() {
        let good = "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, rootfs: host}]}\n";
        check_pod(good, &[]);
        check_pod(
            "apiVersion: v1\nkind: Pd\nmetadata: {name: Web_1}\nspec: {containers: [{name: c, rootfs: host, resources: {requests: {cpu: \"100000\", memory: 5Ei}}}]}\n",
            &[
                "apiVersion",
                "kind",
                "metadata.name",
                "spec.containers[0].resources.requests.cpu",
                "spec.containers[0].resources.requests.memory",
            ],
        );
        check_pod(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, imag: x}]}\n",
            &["spec.containers[0].imag", "spec.containers[0].image"],
        );
        // Structural and semantic problems together: all of them, in one reply.
        check_pod(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: Bad_Name}\nspec: {containers: [{name: c, rootfs: host, bogus: 1, resources: {limits: {cpu: \"-2\", memory: 10Qi}}}]}\n",
            &[
                "spec.containers[0].bogus",
                "spec.containers[0].resources.limits.memory",
                "metadata.name",
                "spec.containers[0].resources.limits.cpu",
            ],
        );
        check_pod("{not yaml", &["(body)"]);
    }

    /// One set of limits: the API's parser, `specs`' validator (what `pinion
    /// apply` checks before sending) and the engine accept exactly up to each
    /// limit and refuse one past it. Rows: what is varied, the value at the
    /// limit, whether one past it is refused by each.
    #[test]
    fn parser_validator_and_engine_refuse_at_the_same_boundary() {
        use specs::limits::{MAX_CPUS, MAX_DEVICES, MAX_ID, MAX_NAME_LEN, MAX_NUMA_NODES, MAX_POD_MEMORY_BYTES};

        fn pod_yaml(name: &str, resources: &str) -> String {
            format!(
                "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{containers: [{{name: c, rootfs: host, resources: {resources}}}]}}\n"
            )
        }
        // (the pod at a limit, the pod one past it)
        let both = |res: &str, n: u128| {
            let r = |n: u128| format!("{{requests: {{{res}: \"{n}\"}}, limits: {{{res}: \"{n}\"}}}}");
            (pod_yaml("p", &r(n)), pod_yaml("p", &r(n + 1)))
        };
        let pods = [
            ("name", (pod_yaml(&"a".repeat(MAX_NAME_LEN), "{}"), pod_yaml(&"a".repeat(MAX_NAME_LEN + 1), "{}"))),
            ("cpu", both("cpu", MAX_CPUS as u128)),
            ("memory", both("memory", u128::from(MAX_POD_MEMORY_BYTES))),
            ("devices", both("example.com/gpu", MAX_DEVICES as u128)),
        ];
        let check_pod = |what: &str, yaml: &str, ok: bool| {
            let parsed = parse_pod(&Bytes::from(yaml.to_string()), false);
            let pod = specs::Pod::from_yaml(yaml).expect(what);
            let validated = specs::validate::validate_pod(&pod);
            assert_eq!(parsed.is_ok(), ok, "{what}: parser: {:?}", parsed.err());
            assert_eq!(validated.is_empty(), ok, "{what}: validator: {validated:?}");
        };
        for (what, (at, over)) in &pods {
            check_pod(what, at, true);
            check_pod(what, over, false);
        }

        // Topologies: NUMA nodes, and the largest CPU and NUMA id.
        let topo = |numa_ids: &[u32], cpu_id: u32| {
            let cpus: Vec<_> = numa_ids
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let id = if i == 0 { cpu_id } else { i as u32 - 1 };
                    serde_json::json!({"id": id, "core": id, "socket": 0, "numa": n})
                })
                .collect();
            let mut cpus = cpus;
            cpus.sort_by_key(|c| c["id"].as_u64());
            let nodes: Vec<_> = numa_ids
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let id = if i == 0 { cpu_id } else { i as u32 - 1 };
                    // A set cannot even hold an id past MAX_ID: leave it out there.
                    let cpus = if id > MAX_ID { vec![] } else { vec![id] };
                    serde_json::json!({"id": n, "cpus": cpus, "memoryBytes": 1u64 << 30, "distances": []})
                })
                .collect();
            serde_json::json!({"apiVersion": API, "kind": "Node", "metadata": {"name": "n"},
                "spec": {"topology": {"cpus": cpus, "numaNodes": nodes}}})
        };
        const API: &str = specs::pod::API_VERSION;
        let ids = |n: usize| (0..n as u32).collect::<Vec<_>>();
        let high_numa = |last: u32| {
            let mut v = ids(2);
            v[1] = last;
            v
        };
        let nodes = [
            ("numa nodes", topo(&ids(MAX_NUMA_NODES), MAX_NUMA_NODES as u32), topo(&ids(MAX_NUMA_NODES + 1), 4096)),
            ("cpu id", topo(&ids(1), MAX_ID), topo(&ids(1), MAX_ID + 1)),
            ("numa id", topo(&high_numa(MAX_ID), 5), topo(&high_numa(MAX_ID + 1), 5)),
        ];
        let small = specs::Pod::from_yaml(&pod_yaml("p", "{requests: {cpu: \"1\"}}")).expect("pod");
        let check_node = |what: &str, json: &serde_json::Value, ok: bool| {
            let parsed = parse_node(&Bytes::from(json.to_string()));
            assert_eq!(parsed.is_ok(), ok, "{what}: parser: {:?}", parsed.err());
            let node: Node = serde_json::from_value(json.clone()).expect(what);
            let validated = specs::validate::validate_topology(&node.spec.topology);
            assert_eq!(validated.is_empty(), ok, "{what}: validator: {validated:?}");
            let t = &node.spec.topology;
            let admitted = specs::admit(t, &Default::default(), &Default::default(), "p", &small);
            match admitted {
                Ok(_) => assert!(ok, "{what}: the engine admits a pod there"),
                Err(r) => {
                    assert!(!ok, "{what}: engine: {r:?}");
                    assert_eq!(r.reason, specs::RejectReason::InvalidRequest, "{what}: {r:?}");
                }
            }
        };
        for (what, at, over) in &nodes {
            check_node(what, at, true);
            check_node(what, over, false);
        }
    }

    #[test]
    fn names_and_queries() {
        assert_eq!(name_problem("web-1.a"), None);
        assert!(name_problem("-web").is_some());
        assert!(name_problem(&"a".repeat(64)).is_some());
        let q = Query::parse(&format!("s={}", percent_encode("a=b,c!=d"))).ok();
        assert_eq!(q.as_ref().and_then(|q| q.get("s")), Some("a=b,c!=d"));
        assert!(Query::parse("s=%zz").is_err());
    }
}
