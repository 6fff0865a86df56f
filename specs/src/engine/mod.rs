//! The one admission engine: given a machine, what it has already handed out,
//! its settings and a pod, decide where the pod goes or say exactly why not.
//!
//! Pure and deterministic: no I/O, no clocks, no randomness, no hash-order
//! iteration. The scheduler calls it on its mirror of a node and the nodelet on
//! the node's truth; same inputs, same answer, byte for byte.
//!
//! The decision follows the kubelet (CPU Manager static policy, Memory Manager
//! static policy, device hints, Topology Manager), module by module:
//! `machine` (indexes and the free ledger), `hints` (providers and candidate
//! masks, polynomial instead of 2^n), `merge` (the topology-manager policies),
//! `cpus` (`takeByTopologyNUMAPacked` and `...Distributed`, with the
//! CPU-manager options), `memory`, `devices`, and `decide`, which runs them.
//! `recheck` asks whether a placement made earlier still fits the node's
//! settings now (a nodelet restarted with other settings).
//!
//! What each Crane-style `cpuPolicy` records in its `ContainerPlacement`:
//! - `exclusive`: `cpus` = its own CPUs, taken out of the shared pool; never a
//!   reserved CPU nor one held by another exclusive or immovable container.
//! - `immovable`: `cpus` = fixed CPUs chosen exactly like exclusive ones (whole
//!   cores first, aligned to the affinity) that *stay in the shared pool*; no later
//!   exclusive or immovable container gets them.
//! - `numa`: `cpus` = the shared pool's CPUs on the chosen NUMA nodes at decision
//!   time (the whole pool when those nodes have none); `mems` = those nodes, always
//!   (also outside Guaranteed pods). Its hint asks for ceil(cpu request) pool CPUs
//!   on the nodes; nothing is taken. Under topology policy `none` it still picks
//!   its nodes with the best-effort merge, since choosing nodes is its point.
//! - `shared`: `cpus` = the shared pool at decision time.
//!
//! The shared pool holds the reserved CPUs too, as the kubelet's default
//! cpuset does, unless `strict-cpu-reservation`: then neither `shared` nor
//! `numa` containers (BestEffort, Burstable, fractional Guaranteed) ever run
//! on a reserved CPU.
//!
//! For every policy, a Guaranteed pod's container gets `mems` = the NUMA nodes
//! its memory and huge pages were accounted on (`memory`, `hugepages`); other
//! pods' containers get no memory binding (empty `mems`) except `numa`. `mems`
//! never names a node without memory (an online node may have CPUs and none):
//! such a node is left out, and a binding that would hold only such nodes
//! names the nearest nodes with memory instead. Nor does it name a
//! memory-only node (`NumaKind::MemoryOnly`), and no memory is accounted on
//! one, unless the pod asks with `spec.topology.memory: nearest-memory-only`;
//! then its memory goes to the memory-only nodes nearest its CPUs (`memory`
//! says how, and what `single-numa-node` means then).
//!
//! `spec.topology.relaxed` names resources (memory, huge pages, devices; never
//! CPUs, which are what the others align to) whose alignment is preferred, not
//! required: `merge` uses their hints only to break ties, and each is then
//! taken on the affinity's nodes first, else elsewhere. Each relaxed resource
//! placed outside the affinity is a `Placement::remote` entry saying where
//! and why. (Under `best-effort`, a resource that is not relaxed may end up
//! outside the affinity too, as in the kubelet; that is not recorded.)
//!
//! `numaAffinity` is the merged hint: the pod's under scope `pod`, the union of
//! the containers' hints under scope `container` (containers without any hint
//! are left out; all nodes if none had one), and all nodes under policy `none`.
//!
//! Errors: a topology the engine cannot index (CPU on an unlisted node, more than
//! 128 NUMA nodes, ids out of range) and a request that cannot be placed anywhere
//! (fractional exclusive CPUs, a huge-page request that is not a whole number of
//! pages) are `InvalidRequest`; a machine that has too little free of something is
//! `Insufficient*` (checked before alignment, so that the message names the
//! resource); an alignment failure is `TopologyAffinity`.

mod cpus;
mod decide;
mod devices;
mod hints;
mod machine;
mod memory;
mod merge;
mod recheck;

pub(crate) use decide::fmt_amount;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NumaSet};
use crate::pod::{CpuPolicy, Pod, TopologyPolicy, TopologyScope, HUGEPAGES_PREFIX, RESOURCE_CPU, RESOURCE_MEMORY};
use crate::quantity::Quantity;
use crate::status::{ContainerPlacementSummary, PlacementSummary};
use crate::topology::NodeTopology;

/// A node's admission settings (the kubelet's `--reserved-cpus`,
/// `--topology-manager-policy`, `--topology-manager-scope`,
/// `--cpu-manager-policy-options`, plus device resources).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSettings {
    #[serde(default)]
    pub reserved_cpus: CpuSet,
    #[serde(default)]
    pub topology_policy: TopologyPolicy,
    #[serde(default)]
    pub topology_scope: TopologyScope,
    #[serde(default)]
    pub cpu_manager: CpuManagerOptions,
    /// Prefer the NUMA-node sets with the smallest distance among equally narrow ones.
    #[serde(default)]
    pub prefer_closest_numa_nodes: bool,
    /// Device resources this node offers: resource name -> PCI addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuManagerOptions {
    /// `full-pcpus-only`: exclusive requests must be whole physical cores.
    #[serde(default)]
    pub full_pcpus_only: bool,
    /// `distribute-cpus-across-numa`: split multi-node requests evenly.
    #[serde(default)]
    pub distribute_cpus_across_numa: bool,
    /// `align-by-socket`: align to the socket rather than the NUMA node.
    #[serde(default)]
    pub align_by_socket: bool,
    /// `distribute-cpus-across-cores`: one thread per core before a core's
    /// second thread.
    #[serde(default)]
    pub distribute_cpus_across_cores: bool,
    /// `prefer-align-cpus-by-uncorecache`: keep an exclusive allocation in as
    /// few last-level-cache groups as possible.
    #[serde(default)]
    pub prefer_align_cpus_by_uncore_cache: bool,
    /// `strict-cpu-reservation`: reserved CPUs are out of the shared pool too.
    #[serde(default)]
    pub strict_cpu_reservation: bool,
}

/// The kubelet's names of the CPU-manager options (`--cpu-manager-policy-options`),
/// plus `prefer-closest-numa-nodes` (a topology-manager option there), which
/// `pinion` takes the same way.
pub const CPU_MANAGER_OPTIONS: [&str; 7] = [
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "align-by-socket",
    "distribute-cpus-across-cores",
    "prefer-align-cpus-by-uncorecache",
    "strict-cpu-reservation",
    "prefer-closest-numa-nodes",
];

/// A CPU-manager option that cannot be set, or settings that do not go together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unknown option {0:?} (known: {known})", known = CPU_MANAGER_OPTIONS.join(", "))]
    Unknown(String),
    #[error("value {value:?} of {key} must be true or false")]
    NotBool { key: String, value: String },
    #[error("expected KEY=VALUE, e.g. full-pcpus-only=true, got {0:?}")]
    NotKeyValue(String),
    /// Two settings the kubelet refuses together, with its reason.
    #[error("{first} and {second} cannot be used together: {reason}")]
    Incompatible { first: &'static str, second: &'static str, reason: &'static str },
}

impl NodeSettings {
    /// The CPUs kept for the system: the machine's own (`NodeTopology::reserved_cpus`)
    /// and these settings'.
    pub fn reserved(&self, topology: &NodeTopology) -> CpuSet {
        topology.reserved_cpus.union(&self.reserved_cpus)
    }

    /// Sets one option by the kubelet's name (`full-pcpus-only`, ...) from
    /// `true` or `false`: the one parser behind every `--cpu-manager-option`.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<(), OptionError> {
        let on = match value {
            "true" => true,
            "false" => false,
            _ => return Err(OptionError::NotBool { key: key.to_string(), value: value.to_string() }),
        };
        let o = &mut self.cpu_manager;
        let field = match key {
            "full-pcpus-only" => &mut o.full_pcpus_only,
            "distribute-cpus-across-numa" => &mut o.distribute_cpus_across_numa,
            "align-by-socket" => &mut o.align_by_socket,
            "distribute-cpus-across-cores" => &mut o.distribute_cpus_across_cores,
            "prefer-align-cpus-by-uncorecache" => &mut o.prefer_align_cpus_by_uncore_cache,
            "strict-cpu-reservation" => &mut o.strict_cpu_reservation,
            "prefer-closest-numa-nodes" => &mut self.prefer_closest_numa_nodes,
            _ => return Err(OptionError::Unknown(key.to_string())),
        };
        *field = on;
        Ok(())
    }

    /// Sets one option from `KEY=VALUE` (a `--cpu-manager-option` flag).
    pub fn set_option_flag(&mut self, flag: &str) -> Result<(), OptionError> {
        let (key, value) = flag.split_once('=').ok_or_else(|| OptionError::NotKeyValue(flag.to_string()))?;
        self.set_option(key, value)
    }

    /// Refuses the combinations the kubelet refuses (its
    /// `NewStaticPolicyOptions` and `ValidateStaticPolicyOptions`), naming
    /// the first conflict found.
    pub fn validate(&self) -> Result<(), OptionError> {
        let o = &self.cpu_manager;
        let conflicts = [
            (
                o.full_pcpus_only && o.distribute_cpus_across_cores,
                "full-pcpus-only",
                "distribute-cpus-across-cores",
                "whole cores and one thread per core first contradict each other",
            ),
            (
                o.distribute_cpus_across_numa && o.distribute_cpus_across_cores,
                "distribute-cpus-across-numa",
                "distribute-cpus-across-cores",
                "the kubelet has not tested the two spreads together and refuses them",
            ),
            (
                o.prefer_align_cpus_by_uncore_cache && o.distribute_cpus_across_cores,
                "prefer-align-cpus-by-uncorecache",
                "distribute-cpus-across-cores",
                "packing into last-level-cache groups contradicts spreading over cores",
            ),
            (
                o.prefer_align_cpus_by_uncore_cache && o.distribute_cpus_across_numa,
                "prefer-align-cpus-by-uncorecache",
                "distribute-cpus-across-numa",
                "packing into last-level-cache groups contradicts spreading over NUMA nodes",
            ),
            (
                o.align_by_socket && self.topology_policy == TopologyPolicy::SingleNumaNode,
                "align-by-socket",
                "topology policy single-numa-node",
                "a socket-wide alignment cannot hold within one NUMA node",
            ),
        ];
        match conflicts.into_iter().find(|c| c.0) {
            Some((_, first, second, reason)) => Err(OptionError::Incompatible { first, second, reason }),
            None => Ok(()),
        }
    }
}

/// What a node has handed out. The checkpoint and the scheduler's mirror are both
/// this struct.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocations {
    /// Advanced on every change; a binding computed against an older epoch is re-checked.
    pub epoch: u64,
    /// Pod key (the caller's choice, e.g. name or uid) -> its allocation.
    pub pods: BTreeMap<String, Placement>,
}

/// The engine's answer for one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// The NUMA nodes the merged topology hint chose (all nodes under `none`).
    pub numa_affinity: NumaSet,
    pub containers: Vec<ContainerPlacement>,
    /// The pod's requests in node totals, for the allocatable check of later pods.
    #[serde(default, skip_serializing_if = "Requested::is_zero")]
    pub requested: Requested,
    /// Relaxed resources (`spec.topology.relaxed`) placed outside `numa_affinity`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote: Vec<RemotePlacement>,
}

/// A relaxed resource of one container placed, at least in part, on NUMA
/// nodes outside the pod's affinity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemotePlacement {
    pub container: String,
    /// `memory`, `hugepages-2Mi`, a device resource.
    pub resource: String,
    /// The nodes outside the affinity it was placed on.
    pub numa_nodes: NumaSet,
    /// Why: how much of it the affinity's nodes had free.
    pub reason: String,
}

/// `container upf: pinion.io/sriov-vf on NUMA node 0 (relaxed: ...)`, as
/// `plan` and `describe pod` print it.
impl std::fmt::Display for RemotePlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "container {}: {} on NUMA node {} ({})", self.container, self.resource, self.numa_nodes, self.reason)
    }
}

/// CPU and memory requested, summed over a pod's containers: what the
/// kubelet's admission (and the Kubernetes scheduler) compare with the node's
/// allocatable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requested {
    pub cpu_millis: u64,
    pub memory: u64,
    /// Page size in bytes -> bytes of huge pages.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages: BTreeMap<u64, u64>,
}

impl Requested {
    pub fn is_zero(&self) -> bool {
        self.cpu_millis == 0 && self.memory == 0 && self.hugepages.is_empty()
    }

    /// A pod's requests summed over its containers (a request defaults to its
    /// limit, as `ResourceRequirements::request` says).
    pub fn of(pod: &Pod) -> Requested {
        let clamp = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
        let mut r = Requested::default();
        for c in &pod.spec.containers {
            let res = &c.resources;
            r.cpu_millis = r.cpu_millis.saturating_add(res.request(RESOURCE_CPU).map_or(0, |q| clamp(q.millis_ceil())));
            r.memory = r.memory.saturating_add(res.request(RESOURCE_MEMORY).map_or(0, |q| clamp(q.units_ceil())));
            let names: std::collections::BTreeSet<&String> = res.requests.keys().chain(res.limits.keys()).collect();
            for name in names {
                let size = name.strip_prefix(HUGEPAGES_PREFIX).and_then(|s| Quantity::parse(s).ok());
                if let (Some(size), Some(q)) = (size, res.request(name)) {
                    let e = r.hugepages.entry(clamp(size.units_ceil())).or_insert(0);
                    *e = e.saturating_add(clamp(q.units_ceil()));
                }
            }
        }
        r.hugepages.retain(|_, b| *b > 0);
        r
    }

    pub fn add(&mut self, other: &Requested) {
        self.cpu_millis = self.cpu_millis.saturating_add(other.cpu_millis);
        self.memory = self.memory.saturating_add(other.memory);
        for (size, bytes) in &other.hugepages {
            let e = self.hugepages.entry(*size).or_insert(0);
            *e = e.saturating_add(*bytes);
        }
    }
}

impl Placement {
    /// What this pod counts for in node totals: its recorded requests, and at
    /// least what it holds (exclusive CPUs outside `reserved`, accounted memory
    /// and huge pages), which is all a placement from before requests were
    /// recorded has.
    pub fn counted(&self, reserved: &CpuSet) -> Requested {
        let mut held = Requested::default();
        for c in &self.containers {
            if c.cpu_policy == CpuPolicy::Exclusive {
                // Counted without a new set: this runs for every pod on every decision.
                let outside = c.cpus.iter().filter(|&id| !reserved.contains(id)).count();
                held.cpu_millis += outside as u64 * 1000;
            }
            held.memory = c.memory.values().fold(held.memory, |a, b| a.saturating_add(*b));
            for (size, per_node) in &c.hugepages {
                let pages = per_node.values().fold(0u64, |a, b| a.saturating_add(*b));
                let e = held.hugepages.entry(*size).or_insert(0);
                *e = e.saturating_add(pages.saturating_mul(*size));
            }
        }
        let r = &self.requested;
        held.cpu_millis = held.cpu_millis.max(r.cpu_millis);
        held.memory = held.memory.max(r.memory);
        for (size, bytes) in &r.hugepages {
            let e = held.hugepages.entry(*size).or_insert(0);
            *e = (*e).max(*bytes);
        }
        held
    }
}

/// What a node offers pods, in totals: its CPUs less the reserved ones, all
/// its memory, all its huge pages of each size.
pub fn allocatable(topology: &NodeTopology, settings: &NodeSettings) -> Requested {
    let reserved = settings.reserved(topology);
    let mut out = Requested {
        // Counted, not collected: this runs on every decision.
        cpu_millis: (topology.cpus.iter().filter(|c| !reserved.contains(c.id)).count() as u64).saturating_mul(1000),
        memory: topology.numa_nodes.iter().fold(0u64, |a, n| a.saturating_add(n.memory_bytes)),
        hugepages: BTreeMap::new(),
    };
    for h in topology.numa_nodes.iter().flat_map(|n| &n.hugepages) {
        let e = out.hugepages.entry(h.page_size_bytes).or_insert(0);
        *e = e.saturating_add(h.total.saturating_mul(h.page_size_bytes));
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerPlacement {
    pub name: String,
    pub cpu_policy: CpuPolicy,
    /// Exclusive / immovable: the CPUs it owns. Numa: the NUMA nodes' CPUs at
    /// decision time. Shared: the shared pool at decision time. For numa and
    /// shared the live set is `Allocations::cpuset_for`, which follows the pool.
    pub cpus: CpuSet,
    /// The memory NUMA nodes (empty: no binding, use all nodes).
    pub mems: NumaSet,
    /// Bytes of memory accounted per NUMA node (Memory Manager static policy).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory: BTreeMap<u32, u64>,
    /// Huge pages accounted: page size in bytes -> NUMA node -> pages.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Devices: resource name -> PCI addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, Vec<String>>,
}

/// Why a pod was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{message}")]
pub struct Rejection {
    pub reason: RejectReason,
    /// One human line: "no single NUMA node has 20 free exclusive CPUs; best is node 1 with 10".
    pub message: String,
}

/// Every rejection is a named variant so that callers can count them per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RejectReason {
    /// The pod itself cannot be admitted anywhere (e.g. fractional exclusive CPUs).
    InvalidRequest,
    InsufficientCpu,
    InsufficientMemory,
    InsufficientHugePages,
    InsufficientDevices,
    /// `full-pcpus-only` and the request is not whole cores.
    SmtAlignment,
    /// The Topology Manager found no acceptable NUMA affinity (`TopologyAffinityError`).
    TopologyAffinity,
    /// The pod is already allocated on this node.
    AlreadyAllocated,
}

pub use self::decide::admit;

/// The shared-pool rule `admit` and `recheck` share: a shared or numa
/// container with no CPU at all cannot run. With `pool` empty, who would go
/// without: this pod's containers (`here`) or those already placed.
pub(crate) fn starved_by_empty_pool(
    pool: &CpuSet,
    here: &[ContainerPlacement],
    placed: &Allocations,
) -> Option<&'static str> {
    if !pool.is_empty() {
        return None;
    }
    let shares = |c: &ContainerPlacement| matches!(c.cpu_policy, CpuPolicy::Shared | CpuPolicy::Numa);
    if here.iter().any(shares) {
        Some("this pod's shared containers")
    } else if placed.pods.values().flat_map(|p| &p.containers).any(shares) {
        Some("the shared containers running here")
    } else {
        None
    }
}
pub use self::recheck::{recheck, Misfit, MisfitReason, SETTINGS_MISFIT};

impl Allocations {
    /// What the pods here requested, in node totals (see [`Placement::counted`]).
    pub fn requested(&self, reserved: &CpuSet) -> Requested {
        let mut used = Requested::default();
        for p in self.pods.values() {
            used.add(&p.counted(reserved));
        }
        used
    }

    /// Records an admitted placement and advances the epoch.
    pub fn apply(&mut self, pod_key: &str, placement: Placement) {
        self.pods.insert(pod_key.to_string(), placement);
        self.epoch += 1;
    }

    /// Frees a pod's resources; returns what it held. Advances the epoch when it held any.
    pub fn release(&mut self, pod_key: &str) -> Option<Placement> {
        let p = self.pods.remove(pod_key);
        if p.is_some() {
            self.epoch += 1;
        }
        p
    }

    /// CPUs held exclusively (not in the shared pool).
    pub fn exclusive_cpus(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for p in self.pods.values() {
            for c in &p.containers {
                if c.cpu_policy == CpuPolicy::Exclusive {
                    s.union_with(&c.cpus);
                }
            }
        }
        s
    }

    /// CPUs no exclusive or immovable container may be given again: exclusive
    /// and immovable ones.
    pub fn pinned_cpus(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for p in self.pods.values() {
            s.union_with(&p.pinned_cpus());
        }
        s
    }

    /// The shared pool: every CPU minus exclusive ones. Reserved CPUs stay in the
    /// pool (the kubelet runs shared pods on them too) unless the settings say
    /// `strict-cpu-reservation`.
    pub fn shared_pool(&self, topology: &NodeTopology, settings: &NodeSettings) -> CpuSet {
        let mut pool = topology.all_cpus().difference(&self.exclusive_cpus());
        if settings.cpu_manager.strict_cpu_reservation {
            pool.difference_with(&settings.reserved(topology));
        }
        pool
    }

    /// The cpuset a container should have now: its own CPUs when exclusive or
    /// immovable, its NUMA nodes' part of the pool for `numa`, the pool for `shared`.
    pub fn cpuset_for(&self, topology: &NodeTopology, settings: &NodeSettings, c: &ContainerPlacement) -> CpuSet {
        match c.cpu_policy {
            CpuPolicy::Exclusive | CpuPolicy::Immovable => c.cpus.clone(),
            CpuPolicy::Shared => self.shared_pool(topology, settings),
            CpuPolicy::Numa => {
                let mut node_cpus = CpuSet::new();
                for n in c.mems.iter().filter_map(|id| topology.numa_node(id)) {
                    node_cpus.union_with(&n.cpus);
                }
                let pool = self.shared_pool(topology, settings);
                let s = pool.intersection(&node_cpus);
                // A NUMA node whose shared CPUs are all taken falls back to the pool.
                if s.is_empty() {
                    pool
                } else {
                    s
                }
            }
        }
    }
}

impl Placement {
    /// The CPUs this pod holds as its own (exclusive and immovable
    /// containers); a shared container's cpuset is the pool, not held.
    pub fn pinned_cpus(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for c in self.containers.iter().filter(|c| matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable))
        {
            s.union_with(&c.cpus);
        }
        s
    }

    pub fn summary(&self) -> PlacementSummary {
        PlacementSummary {
            numa_affinity: self.numa_affinity.clone(),
            containers: self
                .containers
                .iter()
                .map(|c| ContainerPlacementSummary {
                    name: c.name.clone(),
                    cpu_policy: c.cpu_policy,
                    cpus: c.cpus.clone(),
                    mems: c.mems.clone(),
                    devices: c.devices.values().flatten().cloned().collect(),
                })
                .collect(),
            remote: self.remote.clone(),
        }
    }
}
