//! The Pod manifest: the shape Kubernetes users know, `apiVersion: pinion.io/v1`.
//!
//! Unknown fields are errors (`deny_unknown_fields`): a typo in a manifest must
//! not silently drop a pinning request. Semantic checks live in `validate`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;
use crate::status::PodStatus;

pub const API_VERSION: &str = "pinion.io/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pod {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Set by the server: unique per object incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Set by the server: the store's monotonic version of this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<u64>,
    /// Set by the server, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    /// Set by the server, never by the client: who created the object
    /// (`admin`, a user's name); a job's pods carry their job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Set by the server on workloads (Deployment, DaemonSet): one more at
    /// every change of the spec, never at a status write, so a controller's
    /// `status.observedGeneration` says which spec it has acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSpec {
    pub containers: Vec<Container>,
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Per-pod override of the node's topology-manager settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySpec>,
    /// Per-pod override of the scheduler's scoring strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_strategy: Option<SchedulingStrategy>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// Set by the scheduler when bound (or by hand to skip scheduling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Seconds between SIGTERM and SIGKILL on deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
    /// Run a minimal init as each container's PID 1 (forwards signals, reaps
    /// children), as `docker run --init`: a command that ignores SIGTERM as
    /// PID 1 (`sleep`, a shell) then still stops at once. `pinion run` sets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    /// Seconds a finished (Succeeded or Failed) pod is kept, with its status and
    /// events, before the server removes it; the server's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Host folders the containers may mount (`hostPath` only): the
    /// program, its input and its output on the node's (shared) filesystem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// The most processes and threads each container of the pod may hold at
    /// once (its cgroup's `pids.max`), from 1 to `limits::MAX_PIDS_LIMIT`;
    /// the node's `--pod-pids-limit` when unset. A fork bomb stops there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    /// Who the pod's processes are on the node (Kubernetes' pod-level
    /// `securityContext`); for a user's pod the server fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// `false`: the pod runs in a user namespace of its own, its root mapped
    /// to an unprivileged range on the host (Kubernetes' `hostUsers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_users: Option<bool>,
    /// For a Deployment's pod: how long its node may be NotReady before the
    /// controller starts a replacement elsewhere, a number of seconds or
    /// `never` (a workload that must not run twice); the cluster's default
    /// (`node_lost::DEFAULT_REPLACE_AFTER_SECONDS`) when unset. The pod
    /// itself keeps running on its node meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_lost_replace_after_seconds: Option<crate::node_lost::ReplaceAfter>,
    /// What else is quieted on the pod's exclusive CPUs while it runs
    /// (interrupts, CFS quota, load balancing, C-states, frequency), in the
    /// words of CRI-O's high-performance annotations; only a pod with
    /// exclusive CPUs may ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
}

/// `spec.tuning`: each setting is applied to the pod's exclusive CPUs when its
/// first container starts and given back when the pod ends. The names are
/// CRI-O's annotations without their `.crio.io` suffix
/// (`irq-load-balancing.crio.io: disable` is `irqLoadBalancing: disabled`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tuning {
    /// The CPUs leave every device interrupt's affinity (and irqbalance's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq_load_balancing: Option<IrqLoadBalancing>,
    /// No CFS quota on the pod's and its containers' cgroups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota: Option<Disabled>,
    /// The CPUs out of the scheduler's load balancing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_load_balancing: Option<Disabled>,
    /// The CPUs' resume latency limit (`pm_qos_resume_latency_us`).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "cpuCStates")]
    pub cpu_c_states: Option<CStates>,
    /// The CPUs' cpufreq governor (`performance`, `powersave`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_freq_governor: Option<String>,
}

impl Tuning {
    /// Whether it asks for nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Tuning::default()
    }
}

/// `spec.tuning.irqLoadBalancing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IrqLoadBalancing {
    /// No device interrupt on any of the pod's CPUs.
    Disabled,
    /// As CRI-O's `housekeeping`: the pod's first CPU and its hyperthread
    /// siblings keep taking interrupts, the others take none.
    Housekeeping,
}

/// The one value of `cpuQuota` and `cpuLoadBalancing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disabled {
    Disabled,
}

/// `spec.tuning.cpuCStates`: `disabled` (no idle state with any exit latency:
/// the CPU polls) or `max-latency-us:N` (only idle states whose exit latency
/// is at most N microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CStates {
    Disabled,
    MaxLatencyUs(u32),
}

pub use crate::limits::MAX_CSTATE_LATENCY_US;

impl TryFrom<String> for CStates {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s == "disabled" {
            return Ok(CStates::Disabled);
        }
        let n = s.strip_prefix("max-latency-us:").ok_or_else(|| {
            format!("{s:?}: want \"disabled\" or \"max-latency-us:N\" (N microseconds, 1 to {MAX_CSTATE_LATENCY_US})")
        })?;
        match n.parse::<u32>() {
            Ok(n) if (1..=MAX_CSTATE_LATENCY_US).contains(&n) => Ok(CStates::MaxLatencyUs(n)),
            _ => Err(format!(
                "{s:?}: the latency must be a whole number of microseconds from 1 to {MAX_CSTATE_LATENCY_US}"
            )),
        }
    }
}

impl From<CStates> for String {
    fn from(c: CStates) -> String {
        match c {
            CStates::Disabled => "disabled".into(),
            CStates::MaxLatencyUs(n) => format!("max-latency-us:{n}"),
        }
    }
}

/// The identity of a pod's processes, for every container that does not say
/// otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supplemental_groups: Vec<u32>,
    /// Pinion's own: the Unix user whose uid and groups the node looks up by
    /// name when `runAsUser` is unset (a lab user whose uid the server does
    /// not know; the node's passwd and group databases do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user_name: Option<String>,
}

/// A host folder a pod's containers may mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    pub host_path: HostPathVolume,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostPathVolume {
    /// An absolute path on the node; it must exist when the container starts.
    pub path: String,
}

/// Where a container sees one of its pod's volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Label on every task pod of a job array (`pinion run --array`): the array's name.
pub const ARRAY_LABEL: &str = "pinion.io/array";
/// Annotation: the array task's index (also `PINION_ARRAY_TASK_ID` in its environment).
pub const ARRAY_TASK_ANNOTATION: &str = "pinion.io/array-task";
/// Annotation: at most this many unfinished task pods of the array are bound at once (`%N`).
pub const ARRAY_PARALLELISM_ANNOTATION: &str = "pinion.io/array-parallelism";
/// Annotation `"true"`: accept a pod no current node could ever run, and wait for
/// nodes to join (by default such a pod is refused at submission).
pub const WAIT_FOR_NODES_ANNOTATION: &str = "pinion.io/wait-for-nodes";

/// What the server's "can never run" refusal says to do (a client with a
/// flag for it says that instead).
pub const WAIT_FOR_NODES_HINT: &str = "annotate the pod pinion.io/wait-for-nodes: \"true\" to wait for such a node";

/// Annotation naming the pod's network-function devices inside its network
/// namespace, as Multus's `interface` does: `RESOURCE=IFNAME` pairs separated
/// by commas (`example.com/vf=net1,example.com/vf=net2`). A resource named
/// more than once names its devices in allocation order; a netdev device
/// left unnamed is `netN`, the first such name free from `net1`.
pub const INTERFACES_ANNOTATION: &str = "pinion.io/interfaces";

/// `INTERFACES_ANNOTATION`'s pairs (resource, interface name), in order, or
/// the first problem in words. The names are checked as the kernel checks
/// them (`dev_valid_name`), plus `lo` and `eth0`, which the pod's own
/// network uses.
pub fn interface_names(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, pair) in value.split(',').map(str::trim).enumerate() {
        let Some((resource, name)) = pair.split_once('=') else {
            return Err(format!("entry {i} {pair:?}: want RESOURCE=IFNAME"));
        };
        let (resource, name) = (resource.trim(), name.trim());
        if !crate::validate::is_device_resource_name(resource) {
            return Err(format!("entry {i}: {resource:?} is not a device resource name (domain/name)"));
        }
        if let Err(why) = interface_name_ok(name) {
            return Err(format!("entry {i}: interface {name:?} {why}"));
        }
        if out.iter().any(|(_, n)| n == name) {
            return Err(format!("entry {i}: interface {name:?} is named twice"));
        }
        out.push((resource.to_string(), name.to_string()));
    }
    Ok(out)
}

/// A name the kernel takes for an interface (`dev_valid_name`, ASCII only).
pub fn ifname_ok(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 15 {
        return Err("must be 1 to 15 bytes long");
    }
    if name == "." || name == ".." || name.bytes().any(|b| b == b'/' || b == b':' || !b.is_ascii_graphic()) {
        return Err("must be printable ASCII without '/', ':' or spaces, and not . or ..");
    }
    Ok(())
}

/// A Linux interface name a pod may ask for.
pub fn interface_name_ok(name: &str) -> Result<(), &'static str> {
    ifname_ok(name)?;
    if name == "lo" || name == "eth0" {
        return Err("is the pod network's own (lo, eth0)");
    }
    Ok(())
}

/// Kubernetes' `imagePullPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PullPolicy {
    #[default]
    IfNotPresent,
    Always,
    Never,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Container {
    pub name: String,
    /// `[REGISTRY/]NAME[:TAG][@sha256:DIGEST]`: imported with `pinion image
    /// import`, or pulled from its registry by the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// When the node pulls `image`: `IfNotPresent` (the default), `Always`
    /// (before every start) or `Never` (only what was imported or pulled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// `host`: run host binaries (host /usr, /bin, /lib*, /etc read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<RootfsSource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub resources: ResourceRequirements,
    /// Crane-style CPU policy; defaults follow the QoS rule (see `qos`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_policy: Option<CpuPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Restart the container when it fails (see `probe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<crate::probe::Probe>,
    /// The pod's `Ready` condition, which a rolling update waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<crate::probe::Probe>,
    /// Holds liveness and readiness back until the container has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<crate::probe::Probe>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// Overrides the pod's `securityContext.runAsUser` for this container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<u32>,
}

/// Linux capabilities on top of the runtime default set (Docker's 14), and
/// ones taken away; names as Kubernetes writes them (`SYS_NICE`, `NET_ADMIN`;
/// a `CAP_` prefix is accepted), `ALL` only in `drop`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

/// Every Linux capability (5.9 and later), without the `CAP_` prefix.
pub const CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// `sys_nice`, `CAP_SYS_NICE` -> `CAP_SYS_NICE`; `None` when no such capability.
pub fn capability_name(name: &str) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CAPABILITIES.contains(&bare).then(|| format!("CAP_{bare}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RootfsSource {
    Host,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// Resource names: `cpu`, `memory`, `hugepages-2Mi`, `hugepages-1Gi`, and device
/// resources by name (`pinion.io/sriov-vf`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceRequirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
}

pub const RESOURCE_CPU: &str = "cpu";
pub const RESOURCE_MEMORY: &str = "memory";
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

impl ResourceRequirements {
    /// The effective request: the request, else the limit (Kubernetes defaults a
    /// missing request to the limit).
    pub fn request(&self, name: &str) -> Option<&Quantity> {
        self.requests.get(name).or_else(|| self.limits.get(name))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

/// Crane-style per-container CPU policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CpuPolicy {
    /// Integer CPUs taken out of the shared pool for this container alone.
    Exclusive,
    /// The shared CPUs of the NUMA nodes chosen for the container.
    Numa,
    /// Fixed cores, chosen like exclusive ones, that stay in the shared pool.
    Immovable,
    /// The whole shared pool.
    Shared,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyPolicy {
    #[default]
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyScope {
    #[default]
    Container,
    Pod,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<TopologyPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<TopologyScope>,
    /// Where a Guaranteed pod's memory and huge pages go: the CPU nodes'
    /// memory (the default), or the memory-only nodes nearest its CPUs.
    #[serde(default, skip_serializing_if = "MemoryPlacement::is_cpu_nodes")]
    pub memory: MemoryPlacement,
    /// Resources whose NUMA alignment is preferred, not required: they do not
    /// constrain (or fail) the merged affinity and are placed elsewhere when
    /// the affinity's nodes have none free (`memory`, `hugepages-<size>`,
    /// device resources; never `cpu`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relaxed: Vec<String>,
}

/// `spec.topology.memory`: which NUMA nodes hold a Guaranteed pod's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryPlacement {
    /// The nodes of the merged affinity (the Memory Manager's rule); never a
    /// memory-only node.
    #[default]
    CpuNodes,
    /// The memory-only nodes (HBM, CXL) nearest to the pod's CPU nodes by the
    /// distance matrix that have room, nearest first; the CPUs are aligned as
    /// usual.
    NearestMemoryOnly,
}

impl MemoryPlacement {
    pub fn is_cpu_nodes(&self) -> bool {
        *self == MemoryPlacement::CpuNodes
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulingStrategy {
    #[default]
    LeastAllocated,
    MostAllocated,
    Balanced,
    LeastNumaNodes,
}

impl Pod {
    /// A `pinion.io/v1` pod of this name and spec, with no other metadata and
    /// no status.
    pub fn new(name: impl Into<String>, spec: PodSpec) -> Pod {
        Pod {
            api_version: API_VERSION.to_string(),
            kind: "Pod".into(),
            metadata: ObjectMeta { name: name.into(), ..Default::default() },
            spec,
            status: None,
        }
    }

    /// Parses a manifest in YAML or JSON (JSON is YAML; the YAML parser is used for
    /// both so that error positions read the same).
    pub fn from_yaml(text: &str) -> Result<Pod, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(text)
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}
