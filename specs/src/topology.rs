//! The machine as plain data: logical CPUs, NUMA nodes, PCI devices.
//!
//! Discovery (in `nodelet`) turns sysfs into a `NodeTopology` once; every decision
//! afterwards is a pure function of this struct. `synthetic` builds one from an
//! hwloc-style description for planning and tests.

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
    /// NUMA node id.
    pub numa: u32,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PciDevice {
    /// `0000:3b:00.0`
    pub address: String,
    /// PCI class code, `0x020000` for an Ethernet controller.
    pub class: String,
    /// NUMA node, `None` where the kernel says -1.
    pub numa: Option<u32>,
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

    /// Distance between two NUMA node ids (10 for local when the table is absent).
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        let idx = |id| self.numa_nodes.iter().position(|n| n.id == id);
        match (idx(from), idx(to)) {
            (Some(f), Some(t)) => self.numa_nodes[f].distances.get(t).copied().unwrap_or(if f == t { 10 } else { 20 }),
            _ => u32::MAX,
        }
    }
}
