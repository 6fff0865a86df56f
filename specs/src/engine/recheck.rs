//! `recheck`: does a pod admitted earlier still fit the node's settings now?
//!
//! A node agent restarted with other settings (reserved CPUs, topology policy
//! or scope, CPU-manager options, devices) or on a machine with fewer online
//! CPUs asks this of every pod it runs, instead of refusing to start as the
//! kubelet does (kubernetes#79603). The answer is about the placement the pod
//! holds, not about where `admit` would put it today: a pod that fits stays on
//! its CPUs even when the engine would now choose others.
//!
//! A placement misfits when:
//! - an exclusive or immovable container holds a CPU that is not online
//!   (`OfflineCpus`) or that is reserved (`ReservedCpus`);
//! - a container holds a device the settings no longer offer (`DeviceRemoved`);
//! - `full-pcpus-only` is on and an exclusive or immovable container holds
//!   part of a core (`SmtAlignment`);
//! - its topology policy (the pod's own, else the node's) forbids how its
//!   resources spread over NUMA nodes, per its scope (`TopologyAffinity`):
//!   `single-numa-node` wants one node; `restricted` wants no more nodes than
//!   the narrowest set whose capacity holds every request of the group (the
//!   width of the kubelet's preferred hints); `best-effort` and `none` take
//!   any spread;
//! - the shared pool would be empty while a shared or numa container needs it
//!   (`NoSharedCpus`): the same rule `admit` applies, with the reserved CPUs
//!   out of the pool under `strict-cpu-reservation`.
//!
//! The CPU, memory, huge-page and device nodes counted for alignment are the
//! ones the placement records; memory on a memory-only node does not widen
//! the spread (such a node is never a hint of its own). Totals against the
//! node's allocatable are not re-checked: requests that exceed a shrunken
//! allocatable only stop new pods, which is all the kubelet's admission does.
//!
//! `others` are the pods re-checked before this one, so that with several
//! pods sharing one pool the one that empties it is named, as `admit` names
//! the pod that would.

use std::collections::BTreeMap;

use crate::idset::{CpuSet, NumaSet};
use crate::pod::{CpuPolicy, Pod, TopologyPolicy, TopologyScope};
use crate::topology::NodeTopology;

use super::hints::{Kind, Provider};
use super::{Allocations, ContainerPlacement, NodeSettings, Placement};

/// The pod status reason (and the server's event reason) of a pod whose
/// placement the node's settings no longer allow.
pub const SETTINGS_MISFIT: &str = "SettingsMisfit";

/// Why a placement no longer fits; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MisfitReason {
    OfflineCpus,
    ReservedCpus,
    DeviceRemoved,
    SmtAlignment,
    TopologyAffinity,
    NoSharedCpus,
}

impl MisfitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            MisfitReason::OfflineCpus => "OfflineCpus",
            MisfitReason::ReservedCpus => "ReservedCpus",
            MisfitReason::DeviceRemoved => "DeviceRemoved",
            MisfitReason::SmtAlignment => "SmtAlignment",
            MisfitReason::TopologyAffinity => "TopologyAffinity",
            MisfitReason::NoSharedCpus => "NoSharedCpus",
        }
    }
}

impl std::fmt::Display for MisfitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placement that the node's settings no longer allow, with one human line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Misfit {
    pub reason: MisfitReason,
    pub message: String,
}

fn misfit(reason: MisfitReason, message: String) -> Misfit {
    Misfit { reason, message }
}

fn holds_cpus(c: &ContainerPlacement) -> bool {
    matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable)
}

/// Checks `placement` (held by `pod`) against `topology` (its online CPUs)
/// and `settings`, with `others` holding what they hold. See the module docs.
pub fn recheck(
    topology: &NodeTopology,
    settings: &NodeSettings,
    others: &Allocations,
    pod: &Pod,
    placement: &Placement,
) -> Result<(), Misfit> {
    let online = topology.all_cpus();
    let reserved = settings.reserved(topology);
    for c in placement.containers.iter().filter(|c| holds_cpus(c)) {
        let gone = c.cpus.difference(&online);
        if !gone.is_empty() {
            return Err(misfit(
                MisfitReason::OfflineCpus,
                format!("container {} holds CPUs {gone}, which are not online on this node", c.name),
            ));
        }
        let taken = c.cpus.intersection(&reserved);
        if !taken.is_empty() {
            return Err(misfit(
                MisfitReason::ReservedCpus,
                format!("container {} holds CPUs {taken}, which are reserved now (reserved CPUs {reserved})", c.name),
            ));
        }
    }
    for c in &placement.containers {
        for (resource, addrs) in &c.devices {
            let offered = settings.devices.get(resource);
            if let Some(a) = addrs.iter().find(|a| !offered.is_some_and(|o| o.contains(a))) {
                return Err(misfit(
                    MisfitReason::DeviceRemoved,
                    format!("container {} holds {resource} device {a}, which this node no longer offers", c.name),
                ));
            }
        }
    }
    if settings.cpu_manager.full_pcpus_only {
        for c in placement.containers.iter().filter(|c| holds_cpus(c)) {
            let split = partial_cores(topology, &c.cpus);
            if !split.is_empty() {
                return Err(misfit(
                    MisfitReason::SmtAlignment,
                    format!(
                        "container {} holds CPUs {} without their core siblings {split}, \
                         which full-pcpus-only forbids",
                        c.name, c.cpus
                    ),
                ));
            }
        }
    }
    check_alignment(topology, settings, pod, placement)?;
    check_pool(topology, settings, &reserved, others, placement)
}

/// The CPUs of the cores `cpus` touches that `cpus` lacks.
fn partial_cores(topology: &NodeTopology, cpus: &CpuSet) -> CpuSet {
    let cores: std::collections::BTreeSet<u32> =
        cpus.iter().filter_map(|id| topology.cpu(id)).map(|c| c.core).collect();
    let mut missing = CpuSet::new();
    for c in topology.cpus.iter().filter(|c| cores.contains(&c.core) && !cpus.contains(c.id)) {
        let _ = missing.insert(c.id);
    }
    missing
}

/// The NUMA nodes a group of containers' resources lie on, and what the
/// group asks of each resource (for `restricted`'s narrowest width).
#[derive(Default)]
struct Spread {
    nodes: NumaSet,
    exclusive_cpus: u64,
    memory: u64,
    /// Page size -> pages.
    hugepages: BTreeMap<u64, u64>,
    /// Resource -> count of devices that have a NUMA node.
    devices: BTreeMap<String, u64>,
}

impl Spread {
    fn add(&mut self, topology: &NodeTopology, c: &ContainerPlacement) {
        let mut node = |id: u32| {
            let _ = self.nodes.insert(id);
        };
        // Memory on a memory-only node is chosen for its nearness, not an
        // alignment of its own; a node that is not there any more is no node.
        let cpu_node = |id: &u32| topology.numa_node(*id).is_some_and(|n| n.kind.is_cpus_and_memory());
        if holds_cpus(c) {
            self.exclusive_cpus += c.cpus.len() as u64;
            for numa in c.cpus.iter().filter_map(|id| topology.cpu(id)?.numa) {
                node(numa);
            }
        }
        if c.cpu_policy == CpuPolicy::Numa {
            c.mems.iter().filter(cpu_node).for_each(&mut node);
        }
        for (id, bytes) in &c.memory {
            self.memory = self.memory.saturating_add(*bytes);
            if *bytes > 0 && cpu_node(id) {
                node(*id);
            }
        }
        for (size, per_node) in &c.hugepages {
            for (id, pages) in per_node {
                let e = self.hugepages.entry(*size).or_default();
                *e = e.saturating_add(*pages);
                if *pages > 0 && cpu_node(id) {
                    node(*id);
                }
            }
        }
        for (resource, addrs) in &c.devices {
            for a in addrs {
                if let Some(id) = topology.devices.iter().find(|d| &d.address == a).and_then(|d| d.numa) {
                    node(id);
                    *self.devices.entry(resource.clone()).or_default() += 1;
                }
            }
        }
    }

    /// The fewest NUMA nodes whose capacity holds every request of the group
    /// (the widest of the resources' narrowest widths, as the merge's target).
    fn narrowest(&self, topology: &NodeTopology, settings: &NodeSettings) -> usize {
        let nodes = &topology.numa_nodes;
        let width = |kind: Kind, request: u64, total: Vec<u64>| {
            if request == 0 {
                return 1;
            }
            Provider::new(kind, String::new(), request, total.clone(), total, (0, 0)).min_width
        };
        let mut w = width(Kind::Cpu, self.exclusive_cpus, nodes.iter().map(|n| n.cpus.len() as u64).collect());
        w = w.max(width(Kind::Memory, self.memory, nodes.iter().map(|n| n.memory_bytes).collect()));
        for (size, pages) in &self.hugepages {
            let total = nodes
                .iter()
                .map(|n| n.hugepages.iter().filter(|h| h.page_size_bytes == *size).map(|h| h.total).sum())
                .collect();
            w = w.max(width(Kind::HugePages(*size), *pages, total));
        }
        for (k, (resource, count)) in self.devices.iter().enumerate() {
            let offered = settings.devices.get(resource).map_or(&[][..], |v| &v[..]);
            let on = |id: u32| {
                offered
                    .iter()
                    .filter(|a| topology.devices.iter().any(|d| &d.address == *a && d.numa == Some(id)))
                    .count() as u64
            };
            w = w.max(width(Kind::Device(k), *count, nodes.iter().map(|n| on(n.id)).collect()));
        }
        w
    }
}

fn policy_name(p: TopologyPolicy) -> &'static str {
    match p {
        TopologyPolicy::None => "none",
        TopologyPolicy::BestEffort => "best-effort",
        TopologyPolicy::Restricted => "restricted",
        TopologyPolicy::SingleNumaNode => "single-numa-node",
    }
}

fn check_alignment(
    topology: &NodeTopology,
    settings: &NodeSettings,
    pod: &Pod,
    placement: &Placement,
) -> Result<(), Misfit> {
    let spec = pod.spec.topology.as_ref();
    let policy = spec.and_then(|t| t.policy).unwrap_or(settings.topology_policy);
    let scope = spec.and_then(|t| t.scope).unwrap_or(settings.topology_scope);
    if !matches!(policy, TopologyPolicy::Restricted | TopologyPolicy::SingleNumaNode) {
        return Ok(());
    }
    let groups: Vec<(String, Vec<&ContainerPlacement>)> = match scope {
        TopologyScope::Pod => vec![("the pod".to_string(), placement.containers.iter().collect())],
        TopologyScope::Container => {
            placement.containers.iter().map(|c| (format!("container {}", c.name), vec![c])).collect()
        }
    };
    for (who, containers) in groups {
        let mut spread = Spread::default();
        for c in containers {
            spread.add(topology, c);
        }
        let (width, allowed) = (
            spread.nodes.len(),
            match policy {
                TopologyPolicy::SingleNumaNode => 1,
                _ => spread.narrowest(topology, settings),
            },
        );
        if width > allowed {
            let name = policy_name(policy);
            let message = if policy == TopologyPolicy::SingleNumaNode {
                format!("{who} spans NUMA nodes {}, and topology policy {name} allows one", spread.nodes)
            } else {
                format!(
                    "{who} spans NUMA nodes {} where {allowed} could hold it, and topology policy {name} allows no wider",
                    spread.nodes
                )
            };
            return Err(misfit(MisfitReason::TopologyAffinity, message));
        }
    }
    Ok(())
}

/// The shared pool after this pod and `others` took their exclusive CPUs
/// must not be empty while a shared or numa container runs (see `admit`).
fn check_pool(
    topology: &NodeTopology,
    settings: &NodeSettings,
    reserved: &CpuSet,
    others: &Allocations,
    placement: &Placement,
) -> Result<(), Misfit> {
    // Strict reservation leaves the reserved CPUs out of the pool already.
    let mut pool = others.shared_pool(topology, settings);
    for c in placement.containers.iter().filter(|c| c.cpu_policy == CpuPolicy::Exclusive) {
        pool.difference_with(&c.cpus);
    }
    let Some(who) = super::starved_by_empty_pool(&pool, &placement.containers, others) else {
        return Ok(());
    };
    let why = if settings.cpu_manager.strict_cpu_reservation {
        format!("strict-cpu-reservation keeps reserved CPUs {reserved} out of it and every other CPU is exclusive")
    } else {
        "every CPU is exclusive".to_string()
    };
    Err(misfit(MisfitReason::NoSharedCpus, format!("no CPU is left in the shared pool for {who}: {why}")))
}
