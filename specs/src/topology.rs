//! The machine as plain data: logical CPUs, NUMA nodes, PCI devices.
//!
//! Discovery (in `nodelet`) turns sysfs into a `NodeTopology` once; every decision
//! afterwards is a pure function of this struct. `synthetic` builds one from an
//! hwloc-style description for planning and tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NumaSet};

pub mod draw;
pub mod synthetic;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeTopology {
    /// Online logical CPUs, sorted by id.
    pub cpus: Vec<Cpu>,
    /// NUMA nodes, sorted by id (ids may be sparse; a node may have no CPUs).
    pub numa_nodes: Vec<NumaNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<PciDevice>,
    /// CPUs the machine's owner keeps for the system (never handed out).
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub reserved_cpus: CpuSet,
    /// What the kernel was booted with (discovery): exclusive CPUs are
    /// taken from its isolated CPUs first.
    #[serde(default, skip_serializing_if = "KernelProfile::is_empty")]
    pub kernel: KernelProfile,
}

/// The node's boot profile for latency-critical work, as discovery reads it
/// from `/proc/cmdline`, `/sys/devices/system/cpu/{isolated,nohz_full}`,
/// `/sys/kernel/realtime` and the CPUs' cpufreq and cpuidle folders.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelProfile {
    /// `isolcpus` (and the kernel's `isolated`): CPUs the scheduler keeps
    /// other work off; exclusive CPUs come from here first.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub isolated_cpus: CpuSet,
    /// `nohz_full`: CPUs whose scheduler tick stops with one task.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub nohz_full: CpuSet,
    /// `rcu_nocbs`: CPUs whose RCU callbacks run elsewhere.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub rcu_nocbs: CpuSet,
    /// A PREEMPT_RT kernel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub realtime: bool,
    /// The cpufreq governors the CPUs offer (`scaling_available_governors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub governors: Vec<String>,
    /// The idle states the CPUs have (`cpuidle/stateN/name`), shallowest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idle_states: Vec<String>,
}

/// The node label that says its kernel is PREEMPT_RT (`"true"`), which a
/// pod selects with `nodeSelector`.
pub const KERNEL_RT_LABEL: &str = "pinion.io/kernel-rt";
/// The node label that says it has isolated CPUs (`"true"`).
pub const ISOLATED_CPUS_LABEL: &str = "pinion.io/isolated-cpus";

impl KernelProfile {
    pub fn is_empty(&self) -> bool {
        *self == KernelProfile::default()
    }

    /// The labels a node with this profile carries (the operator's own
    /// labels win over them).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if self.realtime {
            out.insert(KERNEL_RT_LABEL.to_string(), "true".to_string());
        }
        if !self.isolated_cpus.is_empty() {
            out.insert(ISOLATED_CPUS_LABEL.to_string(), "true".to_string());
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    /// The logical CPU id the kernel uses (`cpuN`).
    pub id: u32,
    /// Physical core, unique per machine (not the kernel's per-package `core_id`).
    pub core: u32,
    /// Package, renumbered 0.. in order of first appearance.
    pub socket: u32,
    /// Die within the package, where the kernel reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub die: Option<u32>,
    /// NUMA node id; `None` for an online CPU that no online node lists (a
    /// node offline while its CPUs are not): such a CPU is local to no
    /// memory, so it is never part of an aligned placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// Last-level (L3) cache group: CPUs sharing one uncore cache (a CCX on
    /// AMD), renumbered 0.. in order of first appearance; `None` where the
    /// machine names no shared L3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncore_cache: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NumaNode {
    pub id: u32,
    /// What the node is: CPUs with their memory, or memory alone (HBM, a
    /// CXL expander, GPU memory exposed as a node).
    #[serde(default, skip_serializing_if = "NumaKind::is_cpus_and_memory")]
    pub kind: NumaKind,
    pub cpus: CpuSet,
    pub memory_bytes: u64,
    /// Distances to every node, in the order of `NodeTopology::numa_nodes`.
    #[serde(default)]
    pub distances: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepages: Vec<HugePages>,
}

/// A NUMA node's kind. A node with no CPUs and no memory is neither kind
/// of interest and stays `CpusAndMemory`, placed on by nobody.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumaKind {
    #[default]
    CpusAndMemory,
    /// Memory and no CPUs: never a pod's only memory node unless it asks.
    MemoryOnly,
}

impl NumaKind {
    pub fn is_cpus_and_memory(&self) -> bool {
        *self == NumaKind::CpusAndMemory
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HugePages {
    pub page_size_bytes: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PciDevice {
    /// `0000:3b:00.0`
    pub address: String,
    /// PCI class code, `0x020000` for an Ethernet controller.
    pub class: String,
    /// NUMA node, `None` where the kernel says -1.
    pub numa: Option<u32>,
    /// The device resource this function is offered as (`nvidia.com/gpu`,
    /// `pinion.io/sriov-vf-ens1f0`): found by discovery, or given by the
    /// agent's `--devices` file. `None`: not offered to pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Host device nodes a container holding this device gets, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<PathBuf>,
    /// The device's locality as Kubernetes DRA publishes it (the list form of
    /// `resource.kubernetes.io/numaNode`): `numa` first, then the nodes on
    /// its socket at the smallest distance from it. Filled for offered
    /// devices with a NUMA node (`NodeTopology::set_device_locality`).
    #[serde(default, rename = "numaNode", skip_serializing_if = "Vec::is_empty")]
    pub numa_node: Vec<u32>,
    /// The function's network interface on the host when it is a network
    /// function with a kernel driver (an SR-IOV VF's `ens1f0v2`, or what the
    /// `--devices` file names): the agent moves it into the network
    /// namespace of the pod holding the device (CNI `host-device`) and back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
}

impl NodeTopology {
    /// Every CPU of the machine. A CPU id beyond `MAX_ID` is left out:
    /// `validate::validate_topology` refuses such a topology on the way in.
    pub fn all_cpus(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for c in &self.cpus {
            let _ = s.insert(c.id);
        }
        s
    }

    /// The NUMA node ids; one beyond `MAX_ID` is left out, as in `all_cpus`.
    pub fn numa_ids(&self) -> NumaSet {
        let mut s = NumaSet::new();
        for n in &self.numa_nodes {
            let _ = s.insert(n.id);
        }
        s
    }

    pub fn numa_node(&self, id: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }

    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus.binary_search_by_key(&id, |c| c.id).ok().map(|i| &self.cpus[i])
    }

    pub fn sockets(&self) -> usize {
        let mut s: Vec<u32> = self.cpus.iter().map(|c| c.socket).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    pub fn cores(&self) -> usize {
        let mut s: Vec<u32> = self.cpus.iter().map(|c| c.core).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    /// The machine without `cpus` (CPUs taken offline while it runs): what
    /// may be placed on meanwhile. The NUMA nodes stay, with their memory.
    pub fn without_cpus(&self, cpus: &CpuSet) -> NodeTopology {
        let mut t = self.clone();
        if cpus.is_empty() {
            return t;
        }
        t.cpus.retain(|c| !cpus.contains(c.id));
        for n in &mut t.numa_nodes {
            n.cpus.difference_with(cpus);
        }
        t.reserved_cpus.difference_with(cpus);
        t
    }

    /// Kubernetes DRA's locality of something on NUMA node `node` (KEP-6072,
    /// the list form of `resource.kubernetes.io/numaNode`): `node` first, then
    /// by id the other nodes that both sit at the smallest distance from
    /// `node` found in its row and share a socket with it (a node's sockets
    /// are its CPUs' ones, so a node without CPUs shares none). On a
    /// two-socket machine with one node per socket that is `[node]`; with
    /// four nodes per socket at equal distance (AMD NPS4), the socket's four.
    /// Empty for a node the machine lacks.
    pub fn dra_numa_nodes(&self, node: u32) -> Vec<u32> {
        if self.numa_node(node).is_none() {
            return Vec::new();
        }
        let sockets_of = |n: u32| -> Vec<u32> {
            let mut s: Vec<u32> = self.cpus.iter().filter(|c| c.numa == Some(n)).map(|c| c.socket).collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        let own = sockets_of(node);
        let others: Vec<(u32, u32)> =
            self.numa_nodes.iter().filter(|n| n.id != node).map(|n| (n.id, self.distance(node, n.id))).collect();
        let mut out = vec![node];
        if let Some(nearest) = others.iter().map(|(_, d)| *d).min() {
            out.extend(
                others
                    .iter()
                    .filter(|(id, d)| *d == nearest && sockets_of(*id).iter().any(|s| own.contains(s)))
                    .map(|(id, _)| *id),
            );
        }
        out
    }

    /// Fills every device's `numa_node` (DRA locality): for an offered
    /// device with a NUMA node, `dra_numa_nodes` of it; empty otherwise.
    pub fn set_device_locality(&mut self) {
        let lists: Vec<Vec<u32>> = self
            .devices
            .iter()
            .map(|d| match (&d.resource, d.numa) {
                (Some(_), Some(n)) => self.dra_numa_nodes(n),
                _ => Vec::new(),
            })
            .collect();
        for (d, list) in self.devices.iter_mut().zip(lists) {
            d.numa_node = list;
        }
    }

    /// The offered device resources: resource name -> PCI addresses, by
    /// address (what the engine takes as `NodeSettings::devices`).
    pub fn device_resources(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in &self.devices {
            if let Some(r) = &d.resource {
                out.entry(r.clone()).or_default().push(d.address.clone());
            }
        }
        out
    }

    /// PCI address -> device nodes, for the offered devices that have any.
    pub fn device_nodes(&self) -> BTreeMap<String, Vec<PathBuf>> {
        self.devices
            .iter()
            .filter(|d| d.resource.is_some() && !d.device_nodes.is_empty())
            .map(|d| (d.address.clone(), d.device_nodes.clone()))
            .collect()
    }

    /// Distance between two NUMA node ids (10 for local when the table is absent).
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        let idx = |id| self.numa_nodes.iter().position(|n| n.id == id);
        match (idx(from), idx(to)) {
            (Some(f), Some(t)) => self.numa_nodes[f].distances.get(t).copied().unwrap_or(if f == t { 10 } else { 20 }),
            _ => u32::MAX,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    /// One CPU per node on the given socket (`None`: a node without CPUs),
    /// and the distance rows.
    fn machine(sockets: &[Option<u32>], distances: &[&[u32]]) -> NodeTopology {
        let mut t = NodeTopology::default();
        for (id, socket) in (0u32..).zip(sockets) {
            let mut cpus = CpuSet::new();
            if let Some(socket) = socket {
                t.cpus.push(Cpu { id, core: id, socket: *socket, die: None, numa: Some(id), uncore_cache: None });
                cpus.insert(id).unwrap();
            }
            let distances = distances[id as usize].to_vec();
            t.numa_nodes.push(NumaNode { id, cpus, memory_bytes: 1 << 30, distances, ..Default::default() });
        }
        t
    }

    #[test]
    fn dra_numa_nodes_are_the_own_node_then_the_nearest_on_its_socket() {
        let two_sockets = machine(&[Some(0), Some(1)], &[&[10, 21], &[21, 10]]);
        let snc2 = machine(
            &[Some(0), Some(0), Some(1), Some(1)],
            &[&[10, 11, 21, 21], &[11, 10, 21, 21], &[21, 21, 10, 11], &[21, 21, 11, 10]],
        );
        // AMD NPS4 on two sockets: 12 within a socket, 32 across.
        let row = |own: usize| -> Vec<u32> {
            (0..8)
                .map(|j| {
                    if j == own {
                        10
                    } else if j / 4 == own / 4 {
                        12
                    } else {
                        32
                    }
                })
                .collect()
        };
        let rows: Vec<Vec<u32>> = (0..8).map(row).collect();
        let rows: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let nps4 = machine(&[0, 0, 0, 0, 1, 1, 1, 1].map(Some), &rows);
        // The nearest node is on the other socket: nobody joins.
        let nearest_remote = machine(&[Some(0), Some(1), Some(0)], &[&[10, 11, 12], &[11, 10, 12], &[12, 12, 10]]);
        // A memory-only node at the smallest distance has no socket to share.
        let memory_only = machine(&[Some(0), None], &[&[10, 11], &[11, 10]]);
        let cases: Vec<(&str, &NodeTopology, u32, Vec<u32>)> = vec![
            ("two sockets, node 0", &two_sockets, 0, vec![0]),
            ("two sockets, node 1", &two_sockets, 1, vec![1]),
            ("snc2, node 1", &snc2, 1, vec![1, 0]),
            ("snc2, node 2", &snc2, 2, vec![2, 3]),
            ("nps4, node 6", &nps4, 6, vec![6, 4, 5, 7]),
            ("nps4, node 0", &nps4, 0, vec![0, 1, 2, 3]),
            ("nearest on another socket", &nearest_remote, 0, vec![0]),
            ("memory-only neighbour", &memory_only, 0, vec![0]),
            ("from a memory-only node", &memory_only, 1, vec![1]),
            ("no such node", &two_sockets, 5, vec![]),
        ];
        for (what, t, node, expected) in cases {
            assert_eq!(t.dra_numa_nodes(node), expected, "{what}");
        }
    }

    #[test]
    fn locality_resources_and_nodes_cover_offered_devices_only() {
        let mut t = machine(&[Some(0), Some(0)], &[&[10, 11], &[11, 10]]);
        let dev = |address: &str, numa: Option<u32>, resource: Option<&str>, nodes: &[&str]| PciDevice {
            address: address.into(),
            class: "0x030200".into(),
            numa,
            resource: resource.map(String::from),
            device_nodes: nodes.iter().map(PathBuf::from).collect(),
            numa_node: vec![9],
            netdev: None,
        };
        t.devices = vec![
            dev("0000:01:00.0", Some(1), Some("nvidia.com/gpu"), &["/dev/nvidia0", "/dev/nvidiactl"]),
            dev("0000:02:00.0", None, Some("nvidia.com/gpu"), &[]),
            dev("0000:03:00.0", Some(0), None, &["/dev/x"]),
        ];
        t.set_device_locality();
        let lists: Vec<&[u32]> = t.devices.iter().map(|d| d.numa_node.as_slice()).collect();
        assert_eq!(lists, [&[1, 0][..], &[], &[]]);
        assert_eq!(
            t.device_resources(),
            BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                vec!["0000:01:00.0".to_string(), "0000:02:00.0".to_string()]
            )])
        );
        assert_eq!(
            t.device_nodes(),
            BTreeMap::from([(
                "0000:01:00.0".to_string(),
                vec![PathBuf::from("/dev/nvidia0"), PathBuf::from("/dev/nvidiactl")]
            )])
        );
    }
}
