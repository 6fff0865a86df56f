//! Requests to typed actions (firecracker's `parsed_request.rs`): the handler
//! only decodes and validates here; `apply` carries actions out against the
//! store. Nothing in this module touches the store.

use bytes::Bytes;
use hyper::HeaderMap;
use specs::api::ApiError;
use specs::api::{JoinRequest, LabelSelector, Node, NodeStatusReport, PodRejection};
use specs::pod::API_VERSION;
use specs::validate::FieldError;
use specs::{Pod, PodStatus};

use super::error::{bad_field, invalid};
use super::routes::RouteId;

#[derive(Debug)]
pub enum Action {
    Health,
    Version,
    Join { token: Option<String>, request: JoinRequest },
    ListPods { selector: LabelSelector, node: Option<String> },
    WatchPods { selector: LabelSelector, node: Option<String>, from: Option<u64> },
    CreatePod(Box<Pod>),
    GetPod(String),
    DeletePod(String),
    UpdatePodStatus { name: String, status: Box<PodStatus> },
    RejectPod { name: String, rejection: PodRejection },
    PodLog { name: String, container: Option<String>, follow: bool },
    AttachPod { name: String, container: Option<String>, known_version: Option<u64>, offset: u64 },
    ListNodes { selector: LabelSelector },
    RegisterNode(Box<Node>),
    GetNode(String),
    DeleteNode(String),
    Heartbeat(String),
    ReportNodeStatus { name: String, report: Box<NodeStatusReport> },
    ListEvents { kind: String, name: String },
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
        RouteId::Join => {
            let token = headers
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|t| t.trim().to_string());
            let request: JoinRequest = decode_json(body)?;
            if let Some(p) = name_problem(&request.node_name) {
                return Err(invalid(
                    "JoinRequest",
                    &request.node_name,
                    vec![FieldError { field: "nodeName".into(), message: p }],
                ));
            }
            Action::Join { token, request }
        }
        RouteId::ListPods => {
            let selector = selector(&q)?;
            let node = q.get("nodeName").map(str::to_string);
            // Checked for a list too (where it is unused): a bad value is the caller's mistake either way.
            let from = q.number("resourceVersion")?;
            if q.flag("watch")? {
                Action::WatchPods { selector, node, from }
            } else {
                Action::ListPods { selector, node }
            }
        }
        RouteId::CreatePod => Action::CreatePod(Box::new(parse_pod(body)?)),
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
        },
        RouteId::ListNodes => Action::ListNodes { selector: selector(&q)? },
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
            if kind != "Pod" && kind != "Node" {
                return Err(bad_field("kind", format!("{kind:?}: must be Pod or Node")));
            }
            let name = q.get("name").ok_or_else(|| bad_field("name", "the query parameter is required"))?;
            Action::ListEvents { kind, name: name.to_string() }
        }
    })
}

/// A JSON body; an error names the field at fault (`pods.web.phase`), or
/// `(body)` when the body as a whole is not JSON of the right shape.
fn decode_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
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
fn json_field_error(e: &serde_path_to_error::Error<serde_json::Error>) -> FieldError {
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

fn check_header(api_version: &str, kind: &str, want_kind: &str, errs: &mut Vec<FieldError>) {
    if api_version != API_VERSION {
        errs.push(FieldError { field: "apiVersion".into(), message: format!("must be {API_VERSION:?}") });
    }
    if kind != want_kind {
        errs.push(FieldError { field: "kind".into(), message: format!("must be {want_kind:?}") });
    }
}

/// One pod from a YAML or JSON body, every problem with its field path.
pub fn parse_pod(body: &Bytes) -> Result<Pod, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| bad_field("(body)", "not UTF-8"))?;
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| invalid("Pod", "", vec![decode_error(&e)]))?;
    // Structural problems first (all of them), then the semantic ones.
    let mut decoded = specs::manifest::decode_pod(&value);
    // A problem with the document as a whole (a list, a string) has the empty path.
    for e in decoded.errors.iter_mut().filter(|e| e.field.is_empty()) {
        e.field = "(body)".into();
    }
    let Some(mut pod) = decoded.pod.take() else {
        return Err(invalid("Pod", "", decoded.errors));
    };
    let mut errs = Vec::new();
    check_header(&pod.api_version, &pod.kind, "Pod", &mut errs);
    if let Some(p) = name_problem(&pod.metadata.name) {
        errs.push(FieldError { field: "metadata.name".into(), message: p });
    }
    check_labels(&pod.metadata.labels, &mut errs);
    check_quantities(&pod, &mut errs);
    for e in specs::validate::validate_pod(&pod) {
        if !errs.iter().any(|x| x.field == e.field) {
            errs.push(e);
        }
    }
    decoded.add_semantic(errs);
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

pub fn parse_node(body: &Bytes) -> Result<Node, ApiError> {
    let node: Node = from_json(body).map_err(|e| invalid("Node", "", vec![e]))?;
    let mut errs = Vec::new();
    check_header(&node.api_version, &node.kind, "Node", &mut errs);
    if let Some(p) = name_problem(&node.metadata.name) {
        errs.push(FieldError { field: "metadata.name".into(), message: p });
    }
    check_labels(&node.metadata.labels, &mut errs);
    // The same rule as a pod's: annotation keys are qualified names.
    for k in node.metadata.annotations.keys().filter(|k| !specs::validate::is_label_key(k)) {
        errs.push(FieldError {
            field: format!("metadata.annotations[{k}]"),
            message: "invalid key: want [prefix/]name".into(),
        });
    }
    let t = &node.spec.topology;
    if t.cpus.is_empty() {
        errs.push(FieldError { field: "spec.topology.cpus".into(), message: "must not be empty".into() });
    }
    if t.cpus.len() > specs::idset::MAX_ID as usize + 1 {
        errs.push(FieldError { field: "spec.topology.cpus".into(), message: "more CPUs than Linux supports".into() });
    }
    if t.numa_nodes.is_empty() || t.numa_nodes.len() > 1024 {
        errs.push(FieldError {
            field: "spec.topology.numaNodes".into(),
            message: "must list 1 to 1024 NUMA nodes".into(),
        });
    }
    for (i, c) in t.cpus.iter().enumerate() {
        if t.numa_node(c.numa).is_none() {
            errs.push(FieldError {
                field: format!("spec.topology.cpus[{i}].numa"),
                message: format!("NUMA node {} is not in numaNodes", c.numa),
            });
        }
    }
    if !errs.is_empty() {
        return Err(invalid("Node", &node.metadata.name, errs));
    }
    Ok(node)
}

/// DNS-label names: they become store keys, cgroup and file names.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > 63 {
        return Some(format!("must be at most 63 characters (has {})", name.len()));
    }
    if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.') {
        return Some("must consist of lower-case letters, digits, '-' and '.'".into());
    }
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ends_ok(name.chars().next()) || !ends_ok(name.chars().last()) {
        return Some("must start and end with a letter or digit".into());
    }
    None
}

fn check_labels(labels: &std::collections::BTreeMap<String, String>, errs: &mut Vec<FieldError>) {
    let ok = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    for (k, v) in labels {
        if k.is_empty() || k.len() > 253 || !ok(k) {
            errs.push(FieldError { field: format!("metadata.labels.{k}"), message: "invalid label key".into() });
        }
        if v.len() > 63 || !ok(v) {
            errs.push(FieldError { field: format!("metadata.labels.{k}"), message: "invalid label value".into() });
        }
    }
}

/// Quantities no machine has: caught here so they never reach the scheduler.
fn check_quantities(pod: &Pod, errs: &mut Vec<FieldError>) {
    const MAX_CPU_MILLIS: i128 = 8192 * 1000;
    const MAX_BYTES: i128 = 1 << 50; // 1 PiB
    for (i, c) in pod.spec.containers.iter().enumerate() {
        for (section, map) in [("requests", &c.resources.requests), ("limits", &c.resources.limits)] {
            for (res, q) in map {
                let field = format!("spec.containers[{i}].resources.{section}.{res}");
                if q.is_negative() {
                    errs.push(FieldError { field, message: format!("{} must not be negative", q.as_str()) });
                } else if res == "cpu" && q.millis_ceil() > MAX_CPU_MILLIS {
                    errs.push(FieldError { field, message: format!("{} CPUs is more than any node has", q.as_str()) });
                } else if res != "cpu"
                    && q.units_ceil() > MAX_BYTES
                    && (res == "memory" || res.starts_with("hugepages-"))
                {
                    errs.push(FieldError { field, message: format!("{} is more than any node has", q.as_str()) });
                } else if res.contains('/') && q.units_ceil() > 1024 {
                    errs.push(FieldError {
                        field,
                        message: format!("{} devices is more than any node has", q.as_str()),
                    });
                }
            }
        }
    }
}

pub use pinion_client::query::{percent_encode, Query};

/// The `labelSelector` parameter.
fn selector(q: &Query) -> Result<LabelSelector, ApiError> {
    LabelSelector::parse(q.get("labelSelector").unwrap_or("")).map_err(|e| bad_field("labelSelector", e.reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_pod(manifest: &str, expected_fields: &[&str]) {
        let got = parse_pod(&Bytes::from(manifest.to_string()));
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
