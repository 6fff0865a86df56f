//! Semantic validation of API objects: every problem with its field path.
//!
//! Serde already rejects unknown fields and unknown enum values; this module
//! checks what the types cannot express (names, bounds, resource arithmetic) and
//! returns all problems at once so a user fixes a manifest in one round.

use std::collections::BTreeSet;

use crate::pod::{
    Container, CpuPolicy, Pod, RootfsSource, API_VERSION, HUGEPAGES_PREFIX, RESOURCE_CPU, RESOURCE_MEMORY,
};
use crate::quantity::Quantity;

/// One problem: `spec.containers[1].resources.limits.cpu: must be >= requests.cpu`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

pub use crate::limits::{
    MAX_ANNOTATIONS_BYTES, MAX_ARGS, MAX_CONTAINERS, MAX_CPUS, MAX_DEVICES, MAX_ENV, MAX_HUGEPAGE_BYTES, MAX_IMAGE_LEN,
    MAX_LABELS, MAX_NAME_LEN, MAX_NODE_MEMORY_BYTES, MAX_NUMA_NODES, MAX_POD_MEMORY_BYTES, MAX_STRING_LEN,
    MAX_TTL_SECONDS,
};

/// The request bounds in nano-units (a `Quantity`'s scale): no node can hold more.
const NANO: i128 = 1_000_000_000;
pub const MAX_CPU_NANOS: i128 = MAX_CPUS as i128 * NANO;
pub const MAX_MEMORY_NANOS: i128 = MAX_POD_MEMORY_BYTES as i128 * NANO;
pub const MAX_DEVICE_NANOS: i128 = MAX_DEVICES as i128 * NANO;

struct Errs(Vec<FieldError>);

impl Errs {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError { field: field.into(), message: message.into() });
    }
}

/// The rule for names in request paths, node names and join requests: they
/// become store keys, certificate names, cgroup and file names. Node names come
/// from host names, so dots are allowed; a pod's name is stricter (a DNS-1123
/// label, `validate_pod`). Both are at most `MAX_NAME_LEN` long.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!("must be at most {MAX_NAME_LEN} characters (has {})", name.len()));
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

/// Every problem in a node's registration: its header, name, labels and topology
/// (field paths as in the `Node` object, `spec.topology.cpus[3].numa`).
/// A join's request: the node name, and the attempt id if any.
pub fn validate_join(request: &crate::api::JoinRequest) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    if let Some(p) = name_problem(&request.node_name) {
        e.push("nodeName", p);
    }
    if let Some(a) = &request.attempt {
        let ok = !a.is_empty()
            && a.len() <= crate::limits::MAX_JOIN_ATTEMPT_LEN
            && a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            e.push("attempt", format!("must be 1 to {} letters, digits or '-'", crate::limits::MAX_JOIN_ATTEMPT_LEN));
        }
    }
    e.0
}

/// An exec request: a named container must be a valid name (whether the pod
/// has it is the server's check), and the command is bounded as a
/// container's command is.
pub fn validate_exec(request: &crate::api::ExecRequest) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    if let Some(p) = request.container.as_deref().and_then(name_problem) {
        e.push("container", p);
    }
    if request.tty && !request.stdin {
        e.push("tty", "needs stdin (a terminal is read from as well)");
    }
    match request.command.first() {
        None => e.push("command", "must name the program to run"),
        Some(program) if program.is_empty() => e.push("command[0]", "the program must not be empty"),
        Some(_) => {}
    }
    if request.command.len() > MAX_ARGS {
        e.push("command", format!("at most {MAX_ARGS} entries, got {}", request.command.len()));
    } else {
        for (j, s) in request.command.iter().enumerate() {
            if s.len() > MAX_STRING_LEN {
                e.push(format!("command[{j}]"), format!("longer than {MAX_STRING_LEN} bytes"));
            }
            if s.contains('\0') {
                e.push(format!("command[{j}]"), "must not contain NUL");
            }
        }
    }
    e.0
}

/// An exec's input: a session id as the node makes them, at most
/// `MAX_EXEC_INPUT_BYTES` of data.
pub fn validate_exec_input(input: &crate::api::ExecInput) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    let s = &input.session;
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        e.push("session", "must be the session of the exec's started frame (letters, digits, -; at most 64)");
    }
    if input.data.len() > crate::limits::MAX_EXEC_INPUT_BYTES {
        e.push("data", format!("longer than {} bytes", crate::limits::MAX_EXEC_INPUT_BYTES));
    }
    e.0
}

pub fn validate_node(node: &crate::api::Node) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    if node.api_version != API_VERSION {
        e.push("apiVersion", format!("must be {API_VERSION:?}, got {:?}", node.api_version));
    }
    if node.kind != "Node" {
        e.push("kind", format!("must be \"Node\", got {:?}", node.kind));
    }
    if let Some(p) = name_problem(&node.metadata.name) {
        e.push("metadata.name", p);
    }
    check_string_map(&mut e, "metadata.labels", &node.metadata.labels);
    // The same rule as a pod's: annotation keys are qualified names.
    for k in node.metadata.annotations.keys().filter(|k| !is_label_key(k)) {
        e.push(format!("metadata.annotations[{k}]"), "invalid key: want [prefix/]name");
    }
    for t in validate_topology(&node.spec.topology) {
        e.push(format!("spec.topology.{}", t.field), t.message);
    }
    if let Err(err) = node.spec.settings.validate() {
        e.push("spec.settings.cpuManager", err.to_string());
    }
    if let Some(address) = &node.spec.address {
        if let Some(p) = address_problem(address) {
            e.push("spec.address", p);
        }
    }
    e.0
}

/// A node's address is one IP that other machines can send to.
fn address_problem(address: &str) -> Option<String> {
    match address.parse::<std::net::IpAddr>() {
        Err(_) => Some(format!("{address:?} is not an IP address")),
        Ok(ip) if ip.is_unspecified() || ip.is_multicast() => {
            Some(format!("{address}: want the address of one machine, not an unspecified or multicast one"))
        }
        Ok(std::net::IpAddr::V4(v4)) if v4.is_broadcast() => Some(format!("{address}: a broadcast address")),
        Ok(_) => None,
    }
}

/// True for a DNS-1123 label: 1..=63 chars of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// True for a DNS-1123 subdomain: dot-separated labels, at most 253 chars.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Kubernetes "qualified name" part: 1..=63 of `[A-Za-z0-9_.-]`, alnum at both ends.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Label key: `[prefix/]name`, prefix a DNS-1123 subdomain.
pub fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

/// Label value: empty, or a qualified name part.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// Env var name (Kubernetes C identifier rule, relaxed like recent versions:
/// printable ASCII without `=`; we keep the stricter C identifier rule).
fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Image reference `NAME[:TAG][@sha256:HEX]`: NAME is `/`-separated
/// components of `[a-z0-9]+([._-][a-z0-9]+)*` (an optional `host[:port]/`
/// first), TAG is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`, HEX 64 lower-case hex
/// digits (a pinned manifest digest).
pub fn image_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > MAX_IMAGE_LEN {
        return Some(format!("must be at most {MAX_IMAGE_LEN} characters"));
    }
    let s = match s.split_once('@') {
        Some((name, digest)) => {
            let hex = digest.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Some(format!("invalid digest {digest:?}: want sha256: and 64 lower-case hex digits"));
            }
            name
        }
        None => s,
    };
    let last_slash = s.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match s[last_slash..].rfind(':') {
        Some(i) => (&s[..last_slash + i], Some(&s[last_slash + i + 1..])),
        None => (s, None),
    };
    if let Some(tag) = tag {
        let tb = tag.as_bytes();
        let ok = !tb.is_empty()
            && tb.len() <= 128
            && (tb[0].is_ascii_alphanumeric() || tb[0] == b'_')
            && tb.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if !ok {
            return Some(format!("invalid tag {tag:?}: want [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"));
        }
    }
    let mut comps: Vec<&str> = name.split('/').collect();
    // A registry host may carry a port and upper case is still refused below.
    if comps.len() > 1 && (comps[0].contains('.') || comps[0].contains(':') || comps[0] == "localhost") {
        let host = comps.remove(0);
        let (h, port) = host.split_once(':').map_or((host, None), |(h, p)| (h, Some(p)));
        if !is_dns1123_subdomain(h) || port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
            return Some(format!("invalid registry host {host:?}"));
        }
    }
    for c in comps {
        let segs_ok = !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
            && c.as_bytes()[0].is_ascii_alphanumeric()
            && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
            && !c.contains("..")
            && !c.contains("--.");
        if !segs_ok {
            return Some(format!("invalid name component {c:?}: want lower-case [a-z0-9] separated by . _ -"));
        }
    }
    None
}

/// Valid hugepage sizes for `hugepages-<size>`: a power of two bytes, 4Ki..=16Gi.
fn hugepage_size_ok(size: &str) -> bool {
    let Ok(q) = Quantity::parse(size) else { return false };
    if !q.is_whole() || q.is_negative() {
        return false;
    }
    let bytes = q.units_ceil();
    (4096..=(16i128 << 30)).contains(&bytes) && (bytes & (bytes - 1)) == 0
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ResKind {
    Cpu,
    Memory,
    Hugepages,
    Device,
}

fn resource_kind(name: &str) -> Result<ResKind, String> {
    if name == RESOURCE_CPU {
        return Ok(ResKind::Cpu);
    }
    if name == RESOURCE_MEMORY {
        return Ok(ResKind::Memory);
    }
    if let Some(size) = name.strip_prefix(HUGEPAGES_PREFIX) {
        return if hugepage_size_ok(size) {
            Ok(ResKind::Hugepages)
        } else {
            Err(format!("invalid hugepage size {size:?}: want a power of two between 4Ki and 16Gi"))
        };
    }
    if is_device_resource_name(name) {
        Ok(ResKind::Device)
    } else {
        Err("unknown resource: want cpu, memory, hugepages-<size> or a domain/name device resource".into())
    }
}

/// How many devices of `resource` the pod's containers request together.
fn pod_device_count(pod: &Pod, resource: &str) -> u64 {
    let n: i128 =
        pod.spec.containers.iter().filter_map(|c| c.resources.request(resource)).map(|q| q.units_ceil()).sum();
    u64::try_from(n.max(0)).unwrap_or(u64::MAX)
}

/// Every problem in a pod, in field order. Empty means valid.
pub fn validate_pod(pod: &Pod) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    if pod.api_version != API_VERSION {
        e.push("apiVersion", format!("must be {API_VERSION:?}, got {:?}", pod.api_version));
    }
    if pod.kind != "Pod" {
        e.push("kind", format!("must be \"Pod\", got {:?}", pod.kind));
    }
    let m = &pod.metadata;
    if !is_dns1123_label(&m.name) {
        e.push(
            "metadata.name",
            format!("{:?} is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)", m.name),
        );
    }
    check_meta(&mut e, m);
    check_string_map(&mut e, "spec.nodeSelector", &pod.spec.node_selector);
    for (key, what) in [
        (crate::pod::ARRAY_TASK_ANNOTATION, "an array task index (a whole number)"),
        (crate::pod::ARRAY_PARALLELISM_ANNOTATION, "a positive whole number"),
    ] {
        if let Some(v) = m.annotations.get(key) {
            let ok = v.parse::<u64>().is_ok_and(|n| n > 0 || key == crate::pod::ARRAY_TASK_ANNOTATION);
            if !ok {
                e.push(format!("metadata.annotations[{key}]"), format!("{v:?} is not {what}"));
            }
        }
    }
    if let Some(v) = m.annotations.get(crate::pod::INTERFACES_ANNOTATION) {
        let key = crate::pod::INTERFACES_ANNOTATION;
        match crate::pod::interface_names(v) {
            Err(why) => e.push(format!("metadata.annotations[{key}]"), why),
            Ok(pairs) => {
                for (resource, _) in &pairs {
                    let asked = pairs.iter().filter(|(r, _)| r == resource).count() as u64;
                    let requested = pod_device_count(pod, resource);
                    if asked > requested {
                        e.push(
                            format!("metadata.annotations[{key}]"),
                            format!("names {asked} interfaces of {resource} but the pod requests {requested}"),
                        );
                        break;
                    }
                }
            }
        }
    }
    if let Some(v) = m.annotations.get(crate::pod::WAIT_FOR_NODES_ANNOTATION) {
        if v != "true" && v != "false" {
            let key = crate::pod::WAIT_FOR_NODES_ANNOTATION;
            e.push(format!("metadata.annotations[{key}]"), format!("{v:?} must be \"true\" or \"false\""));
        }
    }
    if pod.spec.ttl_seconds_after_finished.is_some_and(|t| t > MAX_TTL_SECONDS) {
        e.push("spec.ttlSecondsAfterFinished", format!("at most {MAX_TTL_SECONDS} seconds (a year)"));
    }
    if let Some(n) = pod.spec.pids_limit {
        if !(1..=crate::limits::MAX_PIDS_LIMIT).contains(&n) {
            e.push("spec.pidsLimit", format!("from 1 to {} processes, got {n}", crate::limits::MAX_PIDS_LIMIT));
        }
    }
    if let Some(crate::node_lost::ReplaceAfter::Seconds(n)) = pod.spec.node_lost_replace_after_seconds {
        if n > MAX_TTL_SECONDS {
            e.push("spec.nodeLostReplaceAfterSeconds", format!("at most {MAX_TTL_SECONDS} seconds (a year), or never"));
        }
    }
    if pod.spec.node_name.as_deref().is_some_and(|n| !is_dns1123_subdomain(n)) {
        e.push("spec.nodeName", "must be a DNS-1123 subdomain");
    }
    // A user namespace owns the pod's network namespace: the host's is not
    // one the pod's root may use (Kubernetes refuses the pair too).
    if pod.spec.host_users == Some(false) && pod.spec.host_network {
        e.push("spec.hostUsers", "false cannot go with hostNetwork: true (the host's network is not the pod's own)");
    }
    let cs = &pod.spec.containers;
    if cs.is_empty() {
        e.push("spec.containers", "must have at least one container");
    }
    if cs.len() > MAX_CONTAINERS {
        e.push("spec.containers", format!("at most {MAX_CONTAINERS} containers, got {}", cs.len()));
    }
    let mut names = BTreeSet::new();
    for (i, c) in cs.iter().enumerate() {
        let p = format!("spec.containers[{i}]");
        unique_label(&mut e, &p, &c.name, &mut names, "container");
        validate_container(&mut e, &p, c);
    }
    if let Some(t) = &pod.spec.topology {
        validate_topology_spec(&mut e, pod, t);
    }
    validate_volumes(&mut e, pod);
    if let Some(t) = &pod.spec.tuning {
        validate_tuning(&mut e, pod, t);
    }
    if let Some(sc) = &pod.spec.security_context {
        validate_pod_security_context(&mut e, sc);
    }
    e.0
}

/// A uid or gid a process can hold (see [`crate::limits::MAX_UNIX_ID`]).
fn check_unix_id(e: &mut Errs, field: impl Into<String>, id: Option<u32>) {
    if let Some(id) = id.filter(|id| *id > crate::limits::MAX_UNIX_ID) {
        e.push(field, format!("{id} is not a valid id: (uid_t) -1 means \"unchanged\" to the kernel"));
    }
}

/// The portable Unix user name rule (POSIX's portable file name characters,
/// not starting with `-` so that no tool reads it as an option, at most
/// `MAX_USER_NAME_LEN` as `useradd` allows): the node looks it up in its
/// passwd database.
pub fn user_name_problem(name: &str) -> Option<String> {
    use crate::limits::MAX_USER_NAME_LEN;
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > MAX_USER_NAME_LEN {
        return Some(format!("must be at most {MAX_USER_NAME_LEN} characters (has {})", name.len()));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Some(format!("{name:?} is not a portable user name: want letters, digits, '_', '-' and '.'"));
    }
    if name.starts_with('-') {
        return Some(format!("{name:?} must not start with '-'"));
    }
    None
}

/// `spec.securityContext`: who the pod's processes are.
fn validate_pod_security_context(e: &mut Errs, sc: &crate::pod::PodSecurityContext) {
    use crate::limits::MAX_SUPPLEMENTAL_GROUPS;
    let p = "spec.securityContext";
    check_unix_id(e, format!("{p}.runAsUser"), sc.run_as_user);
    check_unix_id(e, format!("{p}.runAsGroup"), sc.run_as_group);
    let groups = &sc.supplemental_groups;
    if groups.len() > MAX_SUPPLEMENTAL_GROUPS {
        e.push(
            format!("{p}.supplementalGroups"),
            format!("at most {MAX_SUPPLEMENTAL_GROUPS} groups, got {}", groups.len()),
        );
    } else {
        for (i, gid) in groups.iter().enumerate() {
            check_unix_id(e, format!("{p}.supplementalGroups[{i}]"), Some(*gid));
        }
    }
    if let Some(why) = sc.run_as_user_name.as_deref().and_then(user_name_problem) {
        e.push(format!("{p}.runAsUserName"), why);
    }
}

/// `{at}.name`: a DNS-1123 label not used by an earlier `what` of the list.
fn unique_label<'a>(e: &mut Errs, at: &str, name: &'a str, seen: &mut BTreeSet<&'a str>, what: &str) {
    if !is_dns1123_label(name) {
        e.push(format!("{at}.name"), format!("{name:?} is not a DNS-1123 label"));
    } else if !seen.insert(name) {
        e.push(format!("{at}.name"), format!("duplicate {what} name {name:?}"));
    }
}

/// An absolute, normalised path: `/` then names, no `.`, `..` or empty parts.
fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must be an absolute path");
    }
    if path.len() > crate::limits::MAX_PATH_LEN {
        return Some("longer than PATH_MAX (4096 bytes)");
    }
    if path.contains('\0') {
        return Some("contains a NUL byte");
    }
    let trimmed = path.trim_end_matches('/');
    if !trimmed.is_empty() && trimmed[1..].split('/').any(|p| p.is_empty() || p == "." || p == "..") {
        return Some("must be normalised (no empty, . or .. parts)");
    }
    None
}

/// `spec.volumes` (hostPath) and each container's `volumeMounts`.
fn validate_volumes(e: &mut Errs, pod: &Pod) {
    let vs = &pod.spec.volumes;
    if vs.len() > crate::limits::MAX_VOLUMES {
        e.push("spec.volumes", format!("at most {} volumes, got {}", crate::limits::MAX_VOLUMES, vs.len()));
    }
    let mut names = BTreeSet::new();
    for (i, v) in vs.iter().enumerate() {
        let p = format!("spec.volumes[{i}]");
        unique_label(e, &p, &v.name, &mut names, "volume");
        if let Some(why) = path_problem(&v.host_path.path) {
            e.push(format!("{p}.hostPath.path"), format!("{:?} {why}", v.host_path.path));
        }
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let mut paths = BTreeSet::new();
        for (j, m) in c.volume_mounts.iter().enumerate() {
            let p = format!("spec.containers[{i}].volumeMounts[{j}]");
            if !names.contains(m.name.as_str()) {
                e.push(format!("{p}.name"), format!("{:?} is not a volume of the pod (spec.volumes)", m.name));
            }
            match path_problem(&m.mount_path) {
                Some(why) => e.push(format!("{p}.mountPath"), format!("{:?} {why}", m.mount_path)),
                None => {
                    let dest = m.mount_path.trim_end_matches('/');
                    // The container's own system folders are the runtime's to set up.
                    let reserved = ["", "/proc", "/sys", "/dev"];
                    if reserved.iter().any(|r| dest == *r || (!r.is_empty() && dest.starts_with(&format!("{r}/")))) {
                        e.push(
                            format!("{p}.mountPath"),
                            format!("{:?}: /, /proc, /sys and /dev are the runtime's", m.mount_path),
                        );
                    } else if !paths.insert(dest.to_string()) {
                        e.push(format!("{p}.mountPath"), format!("{:?} is mounted twice", m.mount_path));
                    }
                }
            }
        }
    }
}

/// Whether some container of the pod holds CPUs of its own (a Guaranteed
/// pod's container with whole CPUs, or `cpuPolicy: exclusive`).
pub fn has_exclusive_cpus(pod: &Pod) -> bool {
    let qos = crate::qos::qos_class(pod);
    pod.spec.containers.iter().any(|c| crate::qos::effective_cpu_policy(qos, c) == CpuPolicy::Exclusive)
}

use crate::limits::MAX_GOVERNOR_LEN;

/// `spec.tuning`: only CPUs no other pod runs on can be quieted, and a
/// governor is a name the kernel could know.
fn validate_tuning(e: &mut Errs, pod: &Pod, t: &crate::pod::Tuning) {
    if !t.is_empty() && !has_exclusive_cpus(pod) {
        e.push(
            "spec.tuning",
            "needs exclusive CPUs: a Guaranteed pod (cpu and memory limits equal to requests in every container) \
             with a whole number of CPUs in a container; shared CPUs are other pods' too",
        );
    }
    if let Some(g) = &t.cpu_freq_governor {
        let ok = !g.is_empty()
            && g.len() <= MAX_GOVERNOR_LEN
            && g.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok {
            e.push(
                "spec.tuning.cpuFreqGovernor",
                format!("{g:?} is not a governor name (1 to {MAX_GOVERNOR_LEN} of a-z 0-9 _ -)"),
            );
        }
    }
}

/// `spec.topology.memory` and `spec.topology.relaxed`.
fn validate_topology_spec(e: &mut Errs, pod: &Pod, t: &crate::pod::TopologySpec) {
    let tier = t.memory == crate::pod::MemoryPlacement::NearestMemoryOnly;
    if tier && crate::qos::qos_class(pod) != crate::qos::QosClass::Guaranteed {
        e.push(
            "spec.topology.memory",
            "nearest-memory-only needs a Guaranteed pod (cpu and memory limits equal to requests in every \
             container): only a Guaranteed pod's memory is placed on NUMA nodes",
        );
    }
    let requested: BTreeSet<&str> = pod
        .spec
        .containers
        .iter()
        .flat_map(|c| c.resources.requests.keys().chain(c.resources.limits.keys()))
        .map(String::as_str)
        .collect();
    let mut seen = BTreeSet::new();
    for (i, name) in t.relaxed.iter().enumerate() {
        let field = format!("spec.topology.relaxed[{i}]");
        if !seen.insert(name.as_str()) {
            e.push(field, format!("{name:?} is listed twice"));
        } else if name == RESOURCE_CPU {
            e.push(field, "cpu cannot be relaxed: the pod's CPUs are what the other resources align to");
        } else if !requested.contains(name.as_str()) {
            e.push(field, format!("{name:?} is not a resource any container requests"));
        } else if tier && (name == RESOURCE_MEMORY || name.starts_with(HUGEPAGES_PREFIX)) {
            e.push(
                field,
                format!(
                    "{name} is placed on memory-only nodes, apart from the CPUs, by spec.topology.memory: \
                     nearest-memory-only; it cannot be relaxed as well"
                ),
            );
        }
    }
}

/// The problems of an object's `metadata.labels` and `metadata.annotations`
/// (every kind's: a pod's, a workload's, a job's, a partition's).
pub fn meta_problems(m: &crate::pod::ObjectMeta) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    check_meta(&mut e, m);
    e.0
}

fn check_meta(e: &mut Errs, m: &crate::pod::ObjectMeta) {
    check_string_map(e, "metadata.labels", &m.labels);
    let ann: usize = m.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if ann > MAX_ANNOTATIONS_BYTES {
        e.push("metadata.annotations", format!("total size {ann} bytes exceeds {MAX_ANNOTATIONS_BYTES}"));
    }
    for k in m.annotations.keys() {
        if !is_label_key(k) {
            e.push(format!("metadata.annotations[{k}]"), "invalid key: want [prefix/]name");
        }
    }
}

fn check_string_map(e: &mut Errs, path: &str, map: &std::collections::BTreeMap<String, String>) {
    if map.len() > MAX_LABELS {
        e.push(path, format!("at most {MAX_LABELS} entries, got {}", map.len()));
    }
    for (k, v) in map {
        if !is_label_key(k) {
            e.push(format!("{path}[{k}]"), "invalid key: want [prefix/]name, name 1-63 of A-Z a-z 0-9 - _ .");
        }
        if !is_label_value(v) {
            e.push(format!("{path}[{k}]"), format!("invalid value {v:?}: want 0-63 of A-Z a-z 0-9 - _ ."));
        }
    }
}

fn validate_container(e: &mut Errs, p: &str, c: &Container) {
    match (&c.image, &c.rootfs) {
        (Some(_), Some(_)) => e.push(format!("{p}.image"), "set exactly one of image or rootfs, not both"),
        (None, None) => e.push(format!("{p}.image"), "set exactly one of image or rootfs: host"),
        (Some(img), None) => {
            if let Some(why) = image_problem(img) {
                e.push(format!("{p}.image"), why);
            }
        }
        (None, Some(RootfsSource::Host)) => {}
    }
    if c.image.is_none() && c.image_pull_policy.is_some() {
        e.push(format!("{p}.imagePullPolicy"), "only for a container with an image (rootfs: host pulls nothing)");
    }
    let n_args = c.command.len() + c.args.len();
    if n_args > MAX_ARGS {
        e.push(format!("{p}.args"), format!("command and args together at most {MAX_ARGS} entries, got {n_args}"));
    }
    for (field, list) in [("command", &c.command), ("args", &c.args)] {
        for (j, s) in list.iter().enumerate() {
            if s.len() > MAX_STRING_LEN {
                e.push(format!("{p}.{field}[{j}]"), format!("longer than {MAX_STRING_LEN} bytes"));
            }
            if s.contains('\0') {
                e.push(format!("{p}.{field}[{j}]"), "must not contain NUL");
            }
        }
    }
    if c.env.len() > MAX_ENV {
        e.push(format!("{p}.env"), format!("at most {MAX_ENV} entries, got {}", c.env.len()));
    }
    let mut env_names = BTreeSet::new();
    for (j, v) in c.env.iter().enumerate() {
        if !is_env_name(&v.name) {
            e.push(
                format!("{p}.env[{j}].name"),
                format!("{:?} is not a valid name: want [A-Za-z_][A-Za-z0-9_]*", v.name),
            );
        } else if !env_names.insert(v.name.as_str()) {
            e.push(format!("{p}.env[{j}].name"), format!("duplicate name {:?}", v.name));
        }
        if v.value.len() > MAX_STRING_LEN || v.value.contains('\0') {
            e.push(format!("{p}.env[{j}].value"), format!("must be at most {MAX_STRING_LEN} bytes without NUL"));
        }
    }
    if let Some(wd) = &c.working_dir {
        if !wd.starts_with('/') || wd.contains('\0') || wd.len() > 4096 {
            e.push(format!("{p}.workingDir"), "must be an absolute path");
        }
    }
    if let Some(caps) = c.security_context.as_ref().and_then(|s| s.capabilities.as_ref()) {
        let base = format!("{p}.securityContext.capabilities");
        for (field, list) in [("add", &caps.add), ("drop", &caps.drop)] {
            if list.len() > crate::pod::CAPABILITIES.len() + 1 {
                e.push(format!("{base}.{field}"), format!("at most {} entries", crate::pod::CAPABILITIES.len() + 1));
                continue;
            }
            for (j, name) in list.iter().enumerate() {
                let all = name.eq_ignore_ascii_case("ALL");
                if all && field == "add" {
                    e.push(
                        format!("{base}.add[{j}]"),
                        "ALL is not accepted here: name each capability the container needs",
                    );
                } else if !all && crate::pod::capability_name(name).is_none() {
                    e.push(
                        format!("{base}.{field}[{j}]"),
                        format!("unknown capability {name:?} (names like NET_ADMIN, SYS_NICE, IPC_LOCK)"),
                    );
                }
            }
        }
    }
    if let Some(sc) = &c.security_context {
        check_unix_id(e, format!("{p}.securityContext.runAsUser"), sc.run_as_user);
        check_unix_id(e, format!("{p}.securityContext.runAsGroup"), sc.run_as_group);
    }
    use crate::probe::ProbeKind;
    for (kind, probe) in [
        (ProbeKind::Liveness, &c.liveness_probe),
        (ProbeKind::Readiness, &c.readiness_probe),
        (ProbeKind::Startup, &c.startup_probe),
    ] {
        if let Some(probe) = probe {
            e.0.extend(crate::probe::validate(kind, probe, &format!("{p}.{}", kind.field())));
        }
    }
    validate_resources(e, p, c);
}

fn validate_resources(e: &mut Errs, p: &str, c: &Container) {
    let r = &c.resources;
    for (section, map) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (name, q) in map {
            let f = format!("{p}.resources.{section}.{name}");
            let kind = match resource_kind(name) {
                Ok(k) => k,
                Err(why) => {
                    e.push(f, why);
                    continue;
                }
            };
            if q.is_negative() {
                e.push(f, "must not be negative");
                continue;
            }
            let (max, what) = match kind {
                ResKind::Cpu => (MAX_CPU_NANOS, format!("{MAX_CPUS} CPUs, more than any node has")),
                ResKind::Memory | ResKind::Hugepages => (MAX_MEMORY_NANOS, "1Pi bytes".to_string()),
                ResKind::Device => (MAX_DEVICE_NANOS, format!("{MAX_DEVICES} devices, more than any node has")),
            };
            if q.nanos() > max {
                e.push(f.clone(), format!("{q} is more than {what}"));
            }
            if kind == ResKind::Device && !q.is_whole() {
                e.push(f.clone(), "device resources must be whole numbers");
            }
            if kind == ResKind::Memory && !q.is_whole() {
                e.push(f, "memory must be a whole number of bytes");
            }
        }
    }
    // limits >= requests for every resource that has both.
    for (name, req) in &r.requests {
        if let Some(lim) = r.limits.get(name) {
            if lim < req {
                e.push(format!("{p}.resources.limits.{name}"), format!("must be >= requests.{name}"));
            }
        }
    }
    let mut any_hugepages = false;
    let all_names: BTreeSet<&String> = r.requests.keys().chain(r.limits.keys()).collect();
    for name in all_names {
        let kind = resource_kind(name).ok();
        if kind == Some(ResKind::Hugepages) || kind == Some(ResKind::Device) {
            // Kubernetes: hugepages and extended resources cannot be overcommitted.
            match (r.requests.get(name), r.limits.get(name)) {
                (Some(req), Some(lim)) if req != lim => {
                    e.push(format!("{p}.resources.requests.{name}"), "must equal limits (no overcommit)");
                }
                (Some(_), None) if kind == Some(ResKind::Hugepages) => {
                    e.push(format!("{p}.resources.limits.{name}"), "hugepages need a limit equal to the request");
                }
                _ => {}
            }
            any_hugepages |= kind == Some(ResKind::Hugepages);
        }
    }
    if any_hugepages && r.request(RESOURCE_CPU).is_none() && r.request(RESOURCE_MEMORY).is_none() {
        e.push(format!("{p}.resources.requests"), "hugepages need a cpu or memory request");
    }
    let cpu_req = r.request(RESOURCE_CPU);
    let guaranteed_style = |name: &str| r.limits.get(name).is_some_and(|l| r.request(name) == Some(l));
    match c.cpu_policy {
        Some(CpuPolicy::Exclusive) | Some(CpuPolicy::Immovable) => {
            // immovable pins fixed cores chosen like exclusive ones, so it needs the
            // same whole-CPU count; it stays in the shared pool, so no request==limit.
            let pol = if c.cpu_policy == Some(CpuPolicy::Exclusive) { "exclusive" } else { "immovable" };
            if !cpu_req.is_some_and(|q| q.is_whole() && !q.is_zero() && !q.is_negative()) {
                e.push(
                    format!("{p}.resources.requests.cpu"),
                    format!("cpuPolicy {pol} needs an integer cpu request > 0"),
                );
            }
            if c.cpu_policy == Some(CpuPolicy::Exclusive) {
                for name in [RESOURCE_CPU, RESOURCE_MEMORY] {
                    if !guaranteed_style(name) {
                        e.push(
                            format!("{p}.resources.limits.{name}"),
                            format!("cpuPolicy exclusive needs limits.{name} equal to requests.{name}"),
                        );
                    }
                }
            }
        }
        // numa: shares the chosen nodes' CPUs; a cpu request tells the engine how
        // many it needs to fit, but none is required (it then takes one node).
        Some(CpuPolicy::Numa) | Some(CpuPolicy::Shared) | None => {}
    }
}

/// Internal consistency of a topology. The admission engine relies on this: a
/// topology that passes never makes it panic (ids are bounded, cross-references
/// resolve, sums cannot overflow).
pub fn validate_topology(t: &crate::topology::NodeTopology) -> Vec<FieldError> {
    use crate::idset::{CpuSet, MAX_ID};
    let mut e = Errs(Vec::new());
    if t.cpus.is_empty() {
        e.push("cpus", "must list at least one CPU");
    }
    if t.numa_nodes.is_empty() {
        e.push("numaNodes", "must list at least one NUMA node");
    }
    if t.numa_nodes.len() > MAX_NUMA_NODES {
        e.push("numaNodes", format!("at most {MAX_NUMA_NODES} NUMA nodes, got {}", t.numa_nodes.len()));
    }
    let numa_ids: BTreeSet<u32> = t.numa_nodes.iter().map(|n| n.id).collect();
    // core id -> (socket, numa) of its first CPU: a core lives in one socket and node.
    let mut cores: std::collections::BTreeMap<u32, (u32, Option<u32>)> = std::collections::BTreeMap::new();
    for (i, c) in t.cpus.iter().enumerate() {
        let p = format!("cpus[{i}]");
        if c.id > MAX_ID {
            e.push(format!("{p}.id"), format!("{} is larger than {MAX_ID}", c.id));
        }
        if i > 0 && t.cpus[i - 1].id >= c.id {
            e.push(format!("{p}.id"), "cpu ids must be unique and sorted ascending");
        }
        if c.core > MAX_ID {
            e.push(format!("{p}.core"), format!("{} is larger than {MAX_ID}", c.core));
        }
        if c.socket > MAX_ID {
            e.push(format!("{p}.socket"), format!("{} is larger than {MAX_ID}", c.socket));
        }
        if let Some(numa) = c.numa.filter(|n| !numa_ids.contains(n)) {
            e.push(format!("{p}.numa"), format!("NUMA node {numa} is not in numaNodes"));
        }
        match cores.get(&c.core) {
            Some(&(s, n)) if (s, n) != (c.socket, c.numa) => {
                e.push(format!("{p}.core"), format!("core {} spans sockets or NUMA nodes", c.core));
            }
            Some(_) => {}
            None => {
                cores.insert(c.core, (c.socket, c.numa));
            }
        }
    }
    let with_distances = t.numa_nodes.iter().filter(|n| !n.distances.is_empty()).count();
    for (i, n) in t.numa_nodes.iter().enumerate() {
        let p = format!("numaNodes[{i}]");
        if n.id > MAX_ID {
            e.push(format!("{p}.id"), format!("{} is larger than {MAX_ID}", n.id));
        }
        if i > 0 && t.numa_nodes[i - 1].id >= n.id {
            e.push(format!("{p}.id"), "NUMA node ids must be unique and sorted ascending");
        }
        // Ids beyond MAX_ID are reported above; left out here.
        let claimed = t.cpus.iter().filter(|c| c.numa == Some(n.id)).fold(CpuSet::new(), |mut s, c| {
            let _ = s.insert(c.id);
            s
        });
        if n.cpus != claimed {
            e.push(format!("{p}.cpus"), format!("is {} but the cpus on node {} are {}", n.cpus, n.id, claimed));
        }
        if n.kind == crate::topology::NumaKind::MemoryOnly && !(n.cpus.is_empty() && claimed.is_empty()) {
            e.push(
                format!("{p}.kind"),
                format!("node {} is memory-only but has cpus {}", n.id, n.cpus.union(&claimed)),
            );
        }
        if n.memory_bytes > MAX_NODE_MEMORY_BYTES {
            e.push(format!("{p}.memoryBytes"), format!("more than {MAX_NODE_MEMORY_BYTES} bytes"));
        }
        if !n.distances.is_empty() && n.distances.len() != t.numa_nodes.len() {
            e.push(
                format!("{p}.distances"),
                format!("has {} entries, want {} (one per NUMA node) or none", n.distances.len(), t.numa_nodes.len()),
            );
        } else if n.distances.is_empty() && with_distances > 0 {
            e.push(format!("{p}.distances"), "missing while other nodes have a distance row");
        }
        let mut sizes = BTreeSet::new();
        for (j, h) in n.hugepages.iter().enumerate() {
            let hp = format!("{p}.hugepages[{j}]");
            let sz = h.page_size_bytes;
            if !sz.is_power_of_two() || !(4096..=MAX_HUGEPAGE_BYTES).contains(&sz) {
                e.push(format!("{hp}.pageSizeBytes"), format!("{sz} is not a power of two between 4096 and 16Gi"));
            } else if h.total.checked_mul(sz).is_none_or(|b| b > MAX_NODE_MEMORY_BYTES) {
                e.push(
                    format!("{hp}.total"),
                    format!("{} pages of {sz} bytes is more than {MAX_NODE_MEMORY_BYTES} bytes", h.total),
                );
            }
            if !sizes.insert(sz) {
                e.push(format!("{hp}.pageSizeBytes"), format!("duplicate page size {sz}"));
            }
        }
    }
    let all = t.all_cpus();
    let outside = t.reserved_cpus.difference(&all);
    if !outside.is_empty() {
        e.push("reservedCpus", format!("{outside} are not cpus of this machine"));
    }
    if t.devices.len() > MAX_DEVICES {
        e.push("devices", format!("{} devices, more than {MAX_DEVICES}", t.devices.len()));
    }
    let mut addrs = BTreeSet::new();
    for (i, d) in t.devices.iter().enumerate() {
        let p = format!("devices[{i}]");
        if d.address.is_empty() {
            e.push(format!("{p}.address"), "must not be empty");
        } else if !addrs.insert(d.address.as_str()) {
            e.push(format!("{p}.address"), format!("duplicate address {}", d.address));
        }
        if let Some(n) = d.numa {
            if !numa_ids.contains(&n) {
                e.push(format!("{p}.numa"), format!("NUMA node {n} is not in numaNodes"));
            }
        }
        if let Some(r) = &d.resource {
            if !is_device_resource_name(r) {
                e.push(format!("{p}.resource"), format!("{r:?} is not a device resource name (want domain/name)"));
            }
        }
        for (j, node) in d.device_nodes.iter().enumerate() {
            if !node.is_absolute() {
                e.push(format!("{p}.deviceNodes[{j}]"), format!("{} is not an absolute path", node.display()));
            }
        }
        // The DRA list starts with the device's own node and names nodes of this machine.
        if d.numa_node.first().is_some_and(|first| Some(*first) != d.numa) {
            e.push(format!("{p}.numaNode"), "must start with the device's numa".to_string());
        } else if let Some(n) = d.numa_node.iter().find(|n| !numa_ids.contains(n)) {
            e.push(format!("{p}.numaNode"), format!("NUMA node {n} is not in numaNodes"));
        }
    }
    e.0
}

/// A device resource's name as pods request it: `domain/name`, the domain
/// a DNS-1123 subdomain, the name a qualified name part (`nvidia.com/gpu`).
pub fn is_device_resource_name(name: &str) -> bool {
    matches!(name.split_once('/'), Some((domain, n)) if is_dns1123_subdomain(domain) && is_qualified_name_part(n))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    const BASE: &str = r#"
apiVersion: pinion.io/v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: main
    rootfs: host
    command: [sleep, "1"]
    resources:
      requests: {cpu: "2", memory: 1Gi}
      limits: {cpu: "2", memory: 1Gi}
"#;

    /// Applies `edit` to a valid pod and asserts the exact set of failing fields.
    fn check(edit: impl FnOnce(&mut Pod), expected: &[&str]) {
        let mut pod = Pod::from_yaml(BASE).unwrap();
        edit(&mut pod);
        let got: Vec<String> = validate_pod(&pod).into_iter().map(|e| e.field).collect();
        assert_eq!(got, expected, "errors: {:?}", validate_pod(&pod));
    }

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn c0(p: &mut Pod) -> &mut Container {
        &mut p.spec.containers[0]
    }

    #[test]
    fn a_nodes_address_is_one_ip() {
        let node = |address: Option<&str>| crate::api::Node {
            api_version: API_VERSION.into(),
            kind: "Node".into(),
            metadata: crate::pod::ObjectMeta { name: "n1".into(), ..Default::default() },
            spec: crate::api::NodeSpec { address: address.map(str::to_string), ..Default::default() },
            status: Default::default(),
        };
        let cases: [(Option<&str>, Option<&str>); 9] = [
            (None, None),
            (Some("192.0.2.7"), None),
            (Some("2001:db8::7"), None),
            (Some("127.0.0.1"), None),
            (Some("node-1.example"), Some("\"node-1.example\" is not an IP address")),
            (Some("192.0.2.7:10250"), Some("\"192.0.2.7:10250\" is not an IP address")),
            (Some("0.0.0.0"), Some("0.0.0.0: want the address of one machine, not an unspecified or multicast one")),
            (Some("ff02::1"), Some("ff02::1: want the address of one machine, not an unspecified or multicast one")),
            (Some("255.255.255.255"), Some("255.255.255.255: a broadcast address")),
        ];
        for (address, want) in cases {
            let got: Vec<(String, String)> =
                // The empty topology's own problems are not this test's.
                validate_node(&node(address))
                    .into_iter()
                    .filter(|e| !e.field.starts_with("spec.topology"))
                    .map(|e| (e.field, e.message))
                    .collect();
            let want: Vec<(String, String)> =
                want.iter().map(|m| ("spec.address".to_string(), m.to_string())).collect();
            assert_eq!(got, want, "{address:?}");
        }
    }

    #[test]
    fn interface_names() {
        let check = |v: &str, want: Result<&[(&str, &str)], &str>| {
            let got = crate::pod::interface_names(v);
            match want {
                Ok(pairs) => {
                    let pairs: Vec<(String, String)> =
                        pairs.iter().map(|(r, n)| (r.to_string(), n.to_string())).collect();
                    assert_eq!(got, Ok(pairs), "{v}");
                }
                Err(part) => assert!(got.as_ref().is_err_and(|e| e.contains(part)), "{v}: {got:?}"),
            }
        };
        check("example.com/vf=net1", Ok(&[("example.com/vf", "net1")]));
        check(" a.io/x = n1 ,a.io/x=n2", Ok(&[("a.io/x", "n1"), ("a.io/x", "n2")]));
        check("example.com/vf", Err("want RESOURCE=IFNAME"));
        check("vf=net1", Err("not a device resource name"));
        check("a.io/x=", Err("1 to 15 bytes"));
        check("a.io/x=abcdefghijklmnop", Err("1 to 15 bytes"));
        check("a.io/x=net 1", Err("without '/'"));
        check("a.io/x=..", Err("not . or .."));
        check("a.io/x=eth0", Err("pod network's own"));
        check("a.io/x=n1,a.io/y=n1", Err("named twice"));
    }

    #[test]
    fn rules() {
        type Edit = Box<dyn FnOnce(&mut Pod)>;
        let cases: Vec<(Edit, Vec<&str>)> = vec![
            (Box::new(|_| {}), vec![]),
            (Box::new(|p| p.api_version = "v1".into()), vec!["apiVersion"]),
            (Box::new(|p| p.kind = "Deployment".into()), vec!["kind"]),
            (Box::new(|p| p.metadata.name = "Web".into()), vec!["metadata.name"]),
            (Box::new(|p| p.metadata.name = "-web".into()), vec!["metadata.name"]),
            (Box::new(|p| p.metadata.name = "a".repeat(64)), vec!["metadata.name"]),
            (Box::new(|p| p.metadata.name = "a".repeat(63)), vec![]),
            (
                Box::new(|p| {
                    p.metadata.labels.insert("bad key!".into(), "x".into());
                }),
                vec!["metadata.labels[bad key!]"],
            ),
            (
                Box::new(|p| {
                    p.metadata.labels.insert("pinion.io/tier".into(), "-x".into());
                }),
                vec!["metadata.labels[pinion.io/tier]"],
            ),
            (
                Box::new(|p| {
                    p.metadata.labels.insert("Pinion.io/tier".into(), "x".into());
                }),
                vec!["metadata.labels[Pinion.io/tier]"],
            ),
            (
                Box::new(|p| {
                    p.metadata.annotations.insert("big".into(), "x".repeat(MAX_ANNOTATIONS_BYTES));
                }),
                vec!["metadata.annotations"],
            ),
            (Box::new(|p| p.spec.ttl_seconds_after_finished = Some(MAX_TTL_SECONDS)), vec![]),
            (Box::new(|p| p.spec.pids_limit = Some(1)), vec![]),
            (Box::new(|p| p.spec.pids_limit = Some(crate::limits::MAX_PIDS_LIMIT)), vec![]),
            (Box::new(|p| p.spec.pids_limit = Some(0)), vec!["spec.pidsLimit"]),
            (Box::new(|p| p.spec.host_users = Some(true)), vec![]),
            (Box::new(|p| p.spec.host_users = Some(false)), vec![]),
            (
                Box::new(|p| {
                    p.spec.host_users = Some(false);
                    p.spec.host_network = true;
                }),
                vec!["spec.hostUsers"],
            ),
            (Box::new(|p| p.spec.pids_limit = Some(crate::limits::MAX_PIDS_LIMIT + 1)), vec!["spec.pidsLimit"]),
            (
                Box::new(|p| p.spec.ttl_seconds_after_finished = Some(MAX_TTL_SECONDS + 1)),
                vec!["spec.ttlSecondsAfterFinished"],
            ),
            (
                Box::new(|p| {
                    p.metadata.annotations.insert(crate::pod::ARRAY_TASK_ANNOTATION.into(), "0".into());
                    p.metadata.annotations.insert(crate::pod::ARRAY_PARALLELISM_ANNOTATION.into(), "0".into());
                    p.metadata.annotations.insert(crate::pod::WAIT_FOR_NODES_ANNOTATION.into(), "yes".into());
                }),
                vec![
                    "metadata.annotations[pinion.io/array-parallelism]",
                    "metadata.annotations[pinion.io/wait-for-nodes]",
                ],
            ),
            (
                Box::new(|p| {
                    p.metadata.annotations.insert(crate::pod::ARRAY_TASK_ANNOTATION.into(), "-1".into());
                    p.metadata.annotations.insert(crate::pod::ARRAY_PARALLELISM_ANNOTATION.into(), "4".into());
                }),
                vec!["metadata.annotations[pinion.io/array-task]"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("example.com/vf".into(), q("2"));
                    let v = "example.com/vf=net1, example.com/vf=net2";
                    p.metadata.annotations.insert(crate::pod::INTERFACES_ANNOTATION.into(), v.into());
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("example.com/vf".into(), q("1"));
                    let v = "example.com/vf=net1,example.com/vf=net2";
                    p.metadata.annotations.insert(crate::pod::INTERFACES_ANNOTATION.into(), v.into());
                }),
                vec!["metadata.annotations[pinion.io/interfaces]"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("example.com/vf".into(), q("1"));
                    let v = "example.com/vf=a/b";
                    p.metadata.annotations.insert(crate::pod::INTERFACES_ANNOTATION.into(), v.into());
                }),
                vec!["metadata.annotations[pinion.io/interfaces]"],
            ),
            (Box::new(|p| p.spec.containers.clear()), vec!["spec.containers"]),
            (
                Box::new(|p| {
                    let c = p.spec.containers[0].clone();
                    p.spec.containers.resize(MAX_CONTAINERS + 1, c);
                    for (i, c) in p.spec.containers.iter_mut().enumerate() {
                        c.name = format!("c{i}");
                    }
                }),
                vec!["spec.containers"],
            ),
            (
                Box::new(|p| {
                    let c = p.spec.containers[0].clone();
                    p.spec.containers.push(c);
                }),
                vec!["spec.containers[1].name"],
            ),
            (Box::new(|p| c0(p).name = "Main".into()), vec!["spec.containers[0].name"]),
            (Box::new(|p| c0(p).image = Some("busybox:1.36".into())), vec!["spec.containers[0].image"]),
            (Box::new(|p| c0(p).rootfs = None), vec!["spec.containers[0].image"]),
            (
                Box::new(|p| c0(p).image_pull_policy = Some(crate::pod::PullPolicy::Always)),
                vec!["spec.containers[0].imagePullPolicy"],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some("registry.local:5000/lib/busybox:1.36".into());
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some("BusyBox:latest".into());
                }),
                vec!["spec.containers[0].image"],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some(format!("registry.local:5000/upf:1.2@sha256:{}", "ab".repeat(32)));
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some("upf@sha256:ABC".into());
                }),
                vec!["spec.containers[0].image"],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some(format!("upf@md5:{}", "ab".repeat(32)));
                }),
                vec!["spec.containers[0].image"],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some("busybox:".into());
                }),
                vec!["spec.containers[0].image"],
            ),
            (
                Box::new(|p| {
                    c0(p).rootfs = None;
                    c0(p).image = Some("busybox@sha256:abc".into());
                }),
                vec!["spec.containers[0].image"],
            ),
            (Box::new(|p| c0(p).args = vec!["x".into(); MAX_ARGS]), vec!["spec.containers[0].args"]),
            (Box::new(|p| c0(p).args = vec!["a\0b".into()]), vec!["spec.containers[0].args[0]"]),
            (
                Box::new(|p| {
                    c0(p).env = vec![crate::pod::EnvVar { name: "1X".into(), value: String::new() }];
                }),
                vec!["spec.containers[0].env[0].name"],
            ),
            (
                Box::new(|p| {
                    let v = crate::pod::EnvVar { name: "X".into(), value: String::new() };
                    c0(p).env = vec![v.clone(), v];
                }),
                vec!["spec.containers[0].env[1].name"],
            ),
            (
                Box::new(|p| {
                    c0(p).env = (0..=MAX_ENV)
                        .map(|i| crate::pod::EnvVar { name: format!("V{i}"), value: String::new() })
                        .collect();
                }),
                vec!["spec.containers[0].env"],
            ),
            (Box::new(|p| c0(p).working_dir = Some("tmp".into())), vec!["spec.containers[0].workingDir"]),
            (
                Box::new(|p| c0(p).readiness_probe = Some(crate::probe::Probe::default())),
                vec!["spec.containers[0].readinessProbe"],
            ),
            (
                Box::new(|p| {
                    p.spec.node_lost_replace_after_seconds =
                        Some(crate::node_lost::ReplaceAfter::Seconds(MAX_TTL_SECONDS + 1))
                }),
                vec!["spec.nodeLostReplaceAfterSeconds"],
            ),
            (
                Box::new(|p| {
                    c0(p).security_context = Some(crate::pod::SecurityContext {
                        capabilities: Some(crate::pod::Capabilities {
                            add: vec!["SYS_NICE".into(), "cap_ipc_lock".into(), "NET_ADMIN".into()],
                            drop: vec!["ALL".into()],
                        }),
                        ..Default::default()
                    })
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).security_context = Some(crate::pod::SecurityContext {
                        capabilities: Some(crate::pod::Capabilities {
                            add: vec!["SYS_NICE".into(), "ALL".into(), "SYS_NICER".into()],
                            drop: vec!["NOPE".into()],
                        }),
                        ..Default::default()
                    })
                }),
                vec![
                    "spec.containers[0].securityContext.capabilities.add[1]",
                    "spec.containers[0].securityContext.capabilities.add[2]",
                    "spec.containers[0].securityContext.capabilities.drop[0]",
                ],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.limits.insert("cpu".into(), q("1"));
                }),
                vec!["spec.containers[0].resources.limits.cpu"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("cpu".into(), q("-1"));
                }),
                vec!["spec.containers[0].resources.requests.cpu"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("gpu".into(), q("1"));
                }),
                vec!["spec.containers[0].resources.requests.gpu"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("cpu".into(), q("8193"));
                    c0(p).resources.limits.insert("cpu".into(), q("8193"));
                }),
                vec!["spec.containers[0].resources.requests.cpu", "spec.containers[0].resources.limits.cpu"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("cpu".into(), q("8192"));
                    c0(p).resources.limits.insert("cpu".into(), q("8192"));
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.limits.insert("memory".into(), q("2Pi"));
                }),
                vec!["spec.containers[0].resources.limits.memory"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("hugepages-3Mi".into(), q("6Mi"));
                    c0(p).resources.limits.insert("hugepages-3Mi".into(), q("6Mi"));
                }),
                vec![
                    "spec.containers[0].resources.requests.hugepages-3Mi",
                    "spec.containers[0].resources.limits.hugepages-3Mi",
                ],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("hugepages-2Mi".into(), q("4Mi"));
                    c0(p).resources.limits.insert("hugepages-2Mi".into(), q("4Mi"));
                }),
                vec![],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("hugepages-2Mi".into(), q("4Mi"));
                }),
                vec!["spec.containers[0].resources.limits.hugepages-2Mi"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources = Default::default();
                    c0(p).resources.limits.insert("hugepages-2Mi".into(), q("4Mi"));
                }),
                vec!["spec.containers[0].resources.requests"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("pinion.io/sriov-vf".into(), q("1"));
                    c0(p).resources.limits.insert("pinion.io/sriov-vf".into(), q("2"));
                }),
                vec!["spec.containers[0].resources.requests.pinion.io/sriov-vf"],
            ),
            (
                Box::new(|p| {
                    c0(p).resources.requests.insert("pinion.io/sriov-vf".into(), q("500m"));
                }),
                vec!["spec.containers[0].resources.requests.pinion.io/sriov-vf"],
            ),
            (Box::new(|p| c0(p).cpu_policy = Some(CpuPolicy::Exclusive)), vec![]),
            (
                Box::new(|p| {
                    c0(p).cpu_policy = Some(CpuPolicy::Exclusive);
                    c0(p).resources.requests.insert("cpu".into(), q("1500m"));
                    c0(p).resources.limits.insert("cpu".into(), q("1500m"));
                }),
                vec!["spec.containers[0].resources.requests.cpu"],
            ),
            (
                Box::new(|p| {
                    c0(p).cpu_policy = Some(CpuPolicy::Exclusive);
                    c0(p).resources.limits.insert("memory".into(), q("2Gi"));
                }),
                vec!["spec.containers[0].resources.limits.memory"],
            ),
            (
                Box::new(|p| {
                    c0(p).cpu_policy = Some(CpuPolicy::Immovable);
                    c0(p).resources.requests.remove("cpu");
                    c0(p).resources.limits.remove("cpu");
                }),
                vec!["spec.containers[0].resources.requests.cpu"],
            ),
        ];
        for (edit, expected) in cases {
            check(edit, &expected);
        }
    }

    #[test]
    fn volume_rules() {
        use crate::pod::{HostPathVolume, Volume, VolumeMount};
        let vol =
            |name: &str, path: &str| Volume { name: name.into(), host_path: HostPathVolume { path: path.into() } };
        let at = |name: &str, path: &str| VolumeMount { name: name.into(), mount_path: path.into(), read_only: true };
        type Edit = Box<dyn FnOnce(&mut Pod)>;
        let with = |vols: Vec<Volume>, mounts: Vec<VolumeMount>| -> Edit {
            Box::new(move |p: &mut Pod| {
                p.spec.volumes = vols;
                p.spec.containers[0].volume_mounts = mounts;
            })
        };
        let cases: Vec<(Edit, Vec<&str>)> = vec![
            (with(vec![vol("data", "/srv/data")], vec![at("data", "/data")]), vec![]),
            (with(vec![vol("data", "/srv/data/")], vec![at("data", "/data/")]), vec![]),
            (with(vec![vol("data", "srv")], vec![]), vec!["spec.volumes[0].hostPath.path"]),
            (with(vec![vol("data", "/srv/../etc")], vec![]), vec!["spec.volumes[0].hostPath.path"]),
            (with(vec![vol("data", "/srv//x")], vec![]), vec!["spec.volumes[0].hostPath.path"]),
            (with(vec![vol("Data", "/srv")], vec![]), vec!["spec.volumes[0].name"]),
            (with(vec![vol("d", "/a"), vol("d", "/b")], vec![]), vec!["spec.volumes[1].name"]),
            (with(vec![vol("d", "/a")], vec![at("e", "/x")]), vec!["spec.containers[0].volumeMounts[0].name"]),
            (with(vec![vol("d", "/a")], vec![at("d", "x")]), vec!["spec.containers[0].volumeMounts[0].mountPath"]),
            (with(vec![vol("d", "/a")], vec![at("d", "/")]), vec!["spec.containers[0].volumeMounts[0].mountPath"]),
            (
                with(vec![vol("d", "/a")], vec![at("d", "/proc/x")]),
                vec!["spec.containers[0].volumeMounts[0].mountPath"],
            ),
            (with(vec![vol("d", "/a")], vec![at("d", "/devices")]), vec![]),
            (
                with(vec![vol("d", "/a")], vec![at("d", "/x"), at("d", "/x/")]),
                vec!["spec.containers[0].volumeMounts[1].mountPath"],
            ),
        ];
        for (edit, expected) in cases {
            check(edit, &expected);
        }
    }

    #[test]
    fn tuning_rules() {
        use crate::pod::{CStates, Disabled, IrqLoadBalancing, Tuning};
        let all = Tuning {
            irq_load_balancing: Some(IrqLoadBalancing::Housekeeping),
            cpu_quota: Some(Disabled::Disabled),
            cpu_load_balancing: Some(Disabled::Disabled),
            cpu_c_states: Some(CStates::MaxLatencyUs(10)),
            cpu_freq_governor: Some("performance".into()),
        };
        let governor = |g: &str| Tuning { cpu_freq_governor: Some(g.into()), ..Default::default() };
        let irq = Tuning { irq_load_balancing: Some(IrqLoadBalancing::Disabled), ..Default::default() };
        type Edit = Box<dyn Fn(&mut Pod)>;
        let cases: Vec<(Tuning, Edit, Vec<&str>)> = vec![
            (all.clone(), Box::new(|_| {}), vec![]),
            (irq.clone(), Box::new(|_| {}), vec![]),
            // Asking for nothing needs nothing.
            (Tuning::default(), Box::new(|p| c0(p).resources.limits.clear()), vec![]),
            // Fractional CPUs are shared.
            (
                irq.clone(),
                Box::new(|p| {
                    c0(p).resources.requests.insert("cpu".into(), q("1500m"));
                    c0(p).resources.limits.insert("cpu".into(), q("1500m"));
                }),
                vec!["spec.tuning"],
            ),
            // Burstable: shared.
            (all.clone(), Box::new(|p| c0(p).resources.limits.clear()), vec!["spec.tuning"]),
            // A Guaranteed pod that asks for the shared pool.
            (all.clone(), Box::new(|p| c0(p).cpu_policy = Some(CpuPolicy::Shared)), vec!["spec.tuning"]),
            // One exclusive container is enough: the tuning is for its CPUs.
            (
                all.clone(),
                Box::new(|p| {
                    let mut side = p.spec.containers[0].clone();
                    side.name = "side".into();
                    side.cpu_policy = Some(CpuPolicy::Shared);
                    p.spec.containers.push(side);
                }),
                vec![],
            ),
            (governor("schedutil"), Box::new(|_| {}), vec![]),
            (governor(""), Box::new(|_| {}), vec!["spec.tuning.cpuFreqGovernor"]),
            (governor("Performance"), Box::new(|_| {}), vec!["spec.tuning.cpuFreqGovernor"]),
            (governor("a-governor-too-long"), Box::new(|_| {}), vec!["spec.tuning.cpuFreqGovernor"]),
            (governor("../x"), Box::new(|_| {}), vec!["spec.tuning.cpuFreqGovernor"]),
            (
                governor(""),
                Box::new(|p| c0(p).resources.limits.clear()),
                vec!["spec.tuning", "spec.tuning.cpuFreqGovernor"],
            ),
        ];
        for (tuning, edit, expected) in cases {
            check(
                |p| {
                    edit(p);
                    p.spec.tuning = Some(tuning);
                },
                &expected,
            );
        }
    }

    #[test]
    fn tuning_reads_crio_words() {
        use crate::pod::{CStates, Tuning};
        let parse = |yaml: &str| serde_yaml_ng::from_str::<Tuning>(yaml).map_err(|e| e.to_string());
        let cases: Vec<(&str, Result<Option<CStates>, &str>)> = vec![
            ("cpuCStates: disabled", Ok(Some(CStates::Disabled))),
            ("cpuCStates: max-latency-us:20", Ok(Some(CStates::MaxLatencyUs(20)))),
            ("cpuCStates: max-latency-us:0", Err("from 1 to 1000000")),
            ("cpuCStates: max-latency-us:x", Err("from 1 to 1000000")),
            ("cpuCStates: enable", Err("want \"disabled\" or \"max-latency-us:N\"")),
            ("irqLoadBalancing: housekeeping", Ok(None)),
            ("irqLoadBalancing: enabled", Err("unknown variant")),
            ("cpuQuota: disabled", Ok(None)),
            ("cpuQuota: enabled", Err("unknown variant")),
            ("cpuLoadBalancing: disabled", Ok(None)),
            ("cpuFreqGovernor: performance", Ok(None)),
            ("cpuCstates: disabled", Err("unknown field")),
        ];
        for (yaml, want) in cases {
            match (parse(yaml), want) {
                (Ok(t), Ok(c)) => {
                    assert_eq!(t.cpu_c_states, c, "{yaml}");
                    // It writes what it read.
                    assert_eq!(serde_yaml_ng::to_string(&t).unwrap().trim(), yaml, "{yaml}");
                }
                (Err(e), Err(w)) => assert!(e.contains(w), "{yaml}: {e}"),
                (got, want) => panic!("{yaml}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn topology_spec_rules() {
        use crate::pod::{MemoryPlacement, TopologySpec};
        let topo = |memory: MemoryPlacement, relaxed: &[&str]| {
            let relaxed = relaxed.iter().map(|s| s.to_string()).collect();
            move |p: &mut Pod| {
                c0(p).resources.requests.insert("pinion.io/nic".into(), q("1"));
                c0(p).resources.limits.insert("hugepages-2Mi".into(), q("4Mi"));
                p.spec.topology = Some(TopologySpec { memory, relaxed, ..Default::default() });
            }
        };
        use MemoryPlacement::{CpuNodes, NearestMemoryOnly};
        let r0 = "spec.topology.relaxed[0]";
        let cases: Vec<(MemoryPlacement, Vec<&str>, Vec<&str>)> = vec![
            (CpuNodes, vec![], vec![]),
            (CpuNodes, vec!["pinion.io/nic", "memory", "hugepages-2Mi"], vec![]),
            (CpuNodes, vec!["cpu"], vec![r0]),
            (CpuNodes, vec!["pinion.io/gpu"], vec![r0]),
            (CpuNodes, vec!["hugepages-1Gi"], vec![r0]),
            (CpuNodes, vec!["memory", "memory"], vec!["spec.topology.relaxed[1]"]),
            (NearestMemoryOnly, vec![], vec![]),
            (NearestMemoryOnly, vec!["pinion.io/nic"], vec![]),
            (NearestMemoryOnly, vec!["memory"], vec![r0]),
            (NearestMemoryOnly, vec!["hugepages-2Mi"], vec![r0]),
        ];
        for (memory, relaxed, expected) in cases {
            check(topo(memory, &relaxed), &expected);
        }
        // Only a Guaranteed pod's memory is placed on nodes.
        check(
            |p| {
                topo(NearestMemoryOnly, &[])(p);
                c0(p).resources.limits.remove("memory");
            },
            &["spec.topology.memory"],
        );
        let msg = |edit: Box<dyn FnOnce(&mut Pod)>| {
            let mut pod = Pod::from_yaml(BASE).unwrap();
            edit(&mut pod);
            validate_pod(&pod).into_iter().map(|e| e.message).collect::<Vec<_>>()
        };
        assert_eq!(
            msg(Box::new(topo(CpuNodes, &["cpu"]))),
            ["cpu cannot be relaxed: the pod's CPUs are what the other resources align to"]
        );
        assert_eq!(
            msg(Box::new(topo(CpuNodes, &["pinion.io/gpu"]))),
            ["\"pinion.io/gpu\" is not a resource any container requests"]
        );
    }

    #[test]
    fn security_context_rules() {
        use crate::limits::{MAX_SUPPLEMENTAL_GROUPS, MAX_USER_NAME_LEN};
        use crate::pod::{PodSecurityContext, SecurityContext};
        type Edit = Box<dyn FnOnce(&mut Pod)>;
        let pod_sc =
            |sc: PodSecurityContext| -> Edit { Box::new(move |p: &mut Pod| p.spec.security_context = Some(sc)) };
        let named =
            |name: &str| pod_sc(PodSecurityContext { run_as_user_name: Some(name.into()), ..Default::default() });
        let groups = |n: usize| pod_sc(PodSecurityContext { supplemental_groups: vec![1000; n], ..Default::default() });
        let container_sc = |uid: Option<u32>, gid: Option<u32>| -> Edit {
            Box::new(move |p: &mut Pod| {
                c0(p).security_context =
                    Some(SecurityContext { run_as_user: uid, run_as_group: gid, ..Default::default() })
            })
        };
        let sc = "spec.securityContext";
        let cases: Vec<(Edit, Vec<String>)> = vec![
            (
                pod_sc(PodSecurityContext {
                    run_as_user: Some(1001),
                    run_as_group: Some(1001),
                    supplemental_groups: vec![1002, 0, u32::MAX - 1],
                    run_as_user_name: Some("alice".into()),
                }),
                vec![],
            ),
            (
                pod_sc(PodSecurityContext {
                    run_as_user: Some(u32::MAX),
                    run_as_group: Some(u32::MAX),
                    supplemental_groups: vec![5, u32::MAX],
                    run_as_user_name: None,
                }),
                vec![format!("{sc}.runAsUser"), format!("{sc}.runAsGroup"), format!("{sc}.supplementalGroups[1]")],
            ),
            (groups(MAX_SUPPLEMENTAL_GROUPS), vec![]),
            (groups(MAX_SUPPLEMENTAL_GROUPS + 1), vec![format!("{sc}.supplementalGroups")]),
            (named("nobody"), vec![]),
            (named("svc_a-1.b"), vec![]),
            (named("_apt"), vec![]),
            (named("Alice"), vec![]),
            (named(&"a".repeat(MAX_USER_NAME_LEN)), vec![]),
            (named(&"a".repeat(MAX_USER_NAME_LEN + 1)), vec![format!("{sc}.runAsUserName")]),
            (named(""), vec![format!("{sc}.runAsUserName")]),
            (named("-rf"), vec![format!("{sc}.runAsUserName")]),
            (named("al ice"), vec![format!("{sc}.runAsUserName")]),
            (named("alice:x"), vec![format!("{sc}.runAsUserName")]),
            (named("../root"), vec![format!("{sc}.runAsUserName")]),
            (named("élise"), vec![format!("{sc}.runAsUserName")]),
            (named("a\0b"), vec![format!("{sc}.runAsUserName")]),
            (container_sc(Some(0), Some(u32::MAX - 1)), vec![]),
            (
                container_sc(Some(u32::MAX), Some(u32::MAX)),
                vec![
                    "spec.containers[0].securityContext.runAsUser".into(),
                    "spec.containers[0].securityContext.runAsGroup".into(),
                ],
            ),
        ];
        for (edit, expected) in cases {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            check(edit, &expected);
        }
    }

    #[test]
    fn reports_every_problem() {
        check(
            |p| {
                p.kind = "X".into();
                p.metadata.name = "X".into();
                c0(p).working_dir = Some("rel".into());
            },
            &["kind", "metadata.name", "spec.containers[0].workingDir"],
        );
    }

    const TOPO: &str = r#"{
      "cpus": [
        {"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 1, "core": 0, "socket": 0, "numa": 0},
        {"id": 2, "core": 1, "socket": 1, "numa": 1}, {"id": 3, "core": 1, "socket": 1, "numa": 1}
      ],
      "numaNodes": [
        {"id": 0, "cpus": [0, 1], "memoryBytes": 1073741824, "distances": [10, 21],
         "hugepages": [{"pageSizeBytes": 2097152, "total": 16}]},
        {"id": 1, "cpus": [2, 3], "memoryBytes": 1073741824, "distances": [21, 10]}
      ],
      "devices": [{"address": "0000:3b:00.0", "class": "0x020000", "numa": 1}],
      "reservedCpus": [0]
    }"#;

    fn check_topo(edit: impl FnOnce(&mut crate::topology::NodeTopology), expected: &[&str]) {
        let mut t: crate::topology::NodeTopology = serde_json::from_str(TOPO).unwrap();
        edit(&mut t);
        let got: Vec<String> = validate_topology(&t).into_iter().map(|e| e.field).collect();
        assert_eq!(got, expected, "errors: {:?}", validate_topology(&t));
    }

    #[test]
    fn topology_rules() {
        use crate::topology::{HugePages, NodeTopology, NumaKind, PciDevice};
        type Edit = Box<dyn FnOnce(&mut NodeTopology)>;
        let cases: Vec<(Edit, Vec<&str>)> = vec![
            (Box::new(|_| {}), vec![]),
            (
                Box::new(|t| {
                    t.cpus.clear();
                    t.numa_nodes.iter_mut().for_each(|n| n.cpus = Default::default());
                    t.reserved_cpus = Default::default();
                }),
                vec!["cpus"],
            ),
            (Box::new(|t| t.cpus.swap(0, 1)), vec!["cpus[1].id"]),
            (Box::new(|t| t.cpus[1].id = 0), vec!["cpus[1].id", "numaNodes[0].cpus"]),
            (
                Box::new(|t| {
                    t.cpus[3].id = 9000;
                }),
                vec!["cpus[3].id", "numaNodes[1].cpus"],
            ),
            (Box::new(|t| t.cpus[3].numa = Some(7)), vec!["cpus[3].numa", "cpus[3].core", "numaNodes[1].cpus"]),
            (Box::new(|t| t.cpus[1].socket = 1), vec!["cpus[1].core"]),
            (Box::new(|t| t.cpus[0].core = 100_000), vec!["cpus[0].core"]),
            (Box::new(|t| t.numa_nodes[0].cpus = "0".parse().unwrap()), vec!["numaNodes[0].cpus"]),
            (Box::new(|t| t.numa_nodes.swap(0, 1)), vec!["numaNodes[1].id"]),
            (Box::new(|t| t.numa_nodes[1].distances = vec![10]), vec!["numaNodes[1].distances"]),
            (Box::new(|t| t.numa_nodes[1].distances.clear()), vec!["numaNodes[1].distances"]),
            (Box::new(|t| t.numa_nodes.iter_mut().for_each(|n| n.distances.clear())), vec![]),
            (Box::new(|t| t.numa_nodes[0].memory_bytes = u64::MAX), vec!["numaNodes[0].memoryBytes"]),
            (
                Box::new(|t| t.numa_nodes[0].hugepages[0].page_size_bytes = 3 << 20),
                vec!["numaNodes[0].hugepages[0].pageSizeBytes"],
            ),
            (Box::new(|t| t.numa_nodes[0].hugepages[0].total = u64::MAX), vec!["numaNodes[0].hugepages[0].total"]),
            (
                Box::new(|t| {
                    t.numa_nodes[0].hugepages.push(HugePages { page_size_bytes: 2 << 20, total: 1 });
                }),
                vec!["numaNodes[0].hugepages[1].pageSizeBytes"],
            ),
            (Box::new(|t| t.reserved_cpus = "0,8".parse().unwrap()), vec!["reservedCpus"]),
            (Box::new(|t| t.devices[0].numa = Some(5)), vec!["devices[0].numa"]),
            (Box::new(|t| t.devices[0].numa = None), vec![]),
            (Box::new(|t| t.numa_nodes[1].kind = NumaKind::MemoryOnly), vec!["numaNodes[1].kind"]),
            (
                Box::new(|t| {
                    // A memory-only node after a CPU-less one: ids, cpus and distances stay consistent.
                    t.cpus.truncate(2);
                    t.numa_nodes[1].cpus = Default::default();
                    t.numa_nodes[1].kind = NumaKind::MemoryOnly;
                    t.devices.clear();
                }),
                vec![],
            ),
            (
                Box::new(|t| {
                    t.devices[0].resource = Some("nvidia.com/gpu".into());
                    t.devices[0].device_nodes = vec!["/dev/nvidia0".into()];
                    t.devices[0].numa_node = vec![1, 0];
                }),
                vec![],
            ),
            (Box::new(|t| t.devices[0].resource = Some("gpu".into())), vec!["devices[0].resource"]),
            (Box::new(|t| t.devices[0].device_nodes = vec!["dev/nvidia0".into()]), vec!["devices[0].deviceNodes[0]"]),
            (Box::new(|t| t.devices[0].numa_node = vec![0, 1]), vec!["devices[0].numaNode"]),
            (Box::new(|t| t.devices[0].numa_node = vec![1, 4]), vec!["devices[0].numaNode"]),
            (
                Box::new(|t| {
                    let d = t.devices[0].clone();
                    t.devices.push(PciDevice { numa: None, ..d });
                }),
                vec!["devices[1].address"],
            ),
            (
                Box::new(|t| {
                    let d = t.devices[0].clone();
                    t.devices = (0..=MAX_DEVICES)
                        .map(|i| PciDevice { address: format!("0000:{:02x}:{:02x}.0", i / 256, i % 256), ..d.clone() })
                        .collect();
                }),
                vec!["devices"],
            ),
            (
                Box::new(|t| {
                    let n = t.numa_nodes[1].clone();
                    t.numa_nodes = (0..=MAX_NUMA_NODES as u32)
                        .map(|id| crate::topology::NumaNode {
                            kind: Default::default(),
                            id,
                            cpus: Default::default(),
                            distances: vec![],
                            ..n.clone()
                        })
                        .collect();
                    t.numa_nodes[0].cpus = "0-1".parse().unwrap();
                    t.numa_nodes[1].cpus = "2-3".parse().unwrap();
                }),
                vec!["numaNodes"],
            ),
        ];
        for (edit, expected) in cases {
            check_topo(edit, &expected);
        }
    }

    #[test]
    fn exec_requests_name_their_fields() {
        let check = |container: Option<&str>, command: Vec<String>, expected: &[&str]| {
            let request = crate::api::ExecRequest {
                container: container.map(str::to_string),
                command,
                stdin: false,
                tty: false,
                size: None,
            };
            let got: Vec<String> = validate_exec(&request).into_iter().map(|e| e.field).collect();
            assert_eq!(got, expected, "{request:?}");
        };
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check(None, argv(&["sh", "-c", "true"]), &[]);
        check(Some("main"), argv(&["true"]), &[]);
        check(Some("Bad_Name"), argv(&["true"]), &["container"]);
        check(None, vec![], &["command"]);
        check(None, argv(&["", "x"]), &["command[0]"]);
        check(None, argv(&["echo", "a\0b"]), &["command[1]"]);
        check(None, vec!["x".repeat(MAX_STRING_LEN + 1)], &["command[0]"]);
        check(None, vec!["x".into(); MAX_ARGS], &[]);
        check(None, vec!["x".into(); MAX_ARGS + 1], &["command"]);
    }
}
