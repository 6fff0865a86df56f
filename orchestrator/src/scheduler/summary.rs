//! Per-node, per-NUMA summaries of what is free: the numbers the filter and score
//! stages read so that the engine runs only on nodes that can possibly fit.
//!
//! A summary is recomputed from the node's mirror whenever the mirror changes
//! (a bind, a release, a report). That costs one pass over the node's pods
//! (a few microseconds) and keeps it exactly in step with the mirror: no
//! incremental bookkeeping to drift.

use std::collections::HashMap;

use specs::pod::TopologyPolicy;
use specs::{Allocations, CpuPolicy, NodeSettings, NodeTopology, TopologyScope};

use super::demand::Request;

/// What one NUMA node has free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NumaFree {
    pub id: u32,
    /// CPUs that may ever be handed out exclusively here (not reserved).
    pub cpu_capacity: u32,
    pub free_cpus: u32,
    pub free_memory: u64,
    /// Page size -> free bytes, sorted by page size.
    pub free_hugepages: Vec<(u64, u64)>,
    /// Free devices per entry of `NodeSummary::device_names`.
    pub free_devices: Vec<u32>,
}

/// What one node has free, in total and per NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeSummary {
    /// Non-reserved CPUs: what exclusive requests may ever take.
    pub cpu_capacity: u32,
    pub free_cpus: u32,
    pub cpu_millis_capacity: u64,
    pub cpu_millis_used: u64,
    pub memory_capacity: u64,
    pub memory_used: u64,
    pub numa: Vec<NumaFree>,
    /// Free non-reserved CPUs in no NUMA node (their node is offline): in the
    /// totals, in no node's count, as the engine has them.
    pub loose_free_cpus: u32,
    /// Device resource names this node offers, sorted.
    pub device_names: Vec<String>,
    /// Free devices with no NUMA node (usable from any), per `device_names` entry.
    pub floating_devices: Vec<u32>,
}

impl NodeSummary {
    pub fn free_cpu_millis(&self) -> u64 {
        self.cpu_millis_capacity.saturating_sub(self.cpu_millis_used)
    }

    pub fn free_memory(&self) -> u64 {
        self.memory_capacity.saturating_sub(self.memory_used)
    }

    pub fn free_hugepages(&self, size: u64) -> u64 {
        self.numa.iter().map(|n| lookup(&n.free_hugepages, size)).sum()
    }

    pub fn device_index(&self, name: &str) -> Option<usize> {
        self.device_names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    pub fn free_devices(&self, name: &str) -> u32 {
        match self.device_index(name) {
            Some(i) => self.floating_devices[i] + self.numa.iter().map(|n| n.free_devices[i]).sum::<u32>(),
            None => 0,
        }
    }

    /// Computes a node's summary from its mirror. `known` gives the demand of
    /// pods this scheduler bound (their shared CPU millicores and memory, which a
    /// placement does not record); `blind` are pods bound without a placement
    /// (topology-blind mode), counted in the totals only.
    pub fn compute<'a>(
        topology: &NodeTopology,
        settings: &NodeSettings,
        allocations: &Allocations,
        blind: impl Iterator<Item = &'a Request>,
    ) -> NodeSummary {
        let reserved = settings.reserved(topology);
        let mut s = NodeSummary::default();
        // Dense index from NUMA id to position; ids are small and may be sparse.
        let mut numa_pos: HashMap<u32, usize> = HashMap::with_capacity(topology.numa_nodes.len());
        for (i, n) in topology.numa_nodes.iter().enumerate() {
            numa_pos.insert(n.id, i);
            let cpus = n.cpus.difference(&reserved).len() as u32;
            s.numa.push(NumaFree {
                id: n.id,
                cpu_capacity: cpus,
                free_cpus: cpus,
                free_memory: n.memory_bytes,
                free_hugepages: n
                    .hugepages
                    .iter()
                    .map(|h| (h.page_size_bytes, h.page_size_bytes.saturating_mul(h.total)))
                    .collect(),
                free_devices: Vec::new(),
            });
            s.numa[i].free_hugepages.sort_unstable();
            s.cpu_capacity += cpus;
            s.memory_capacity = s.memory_capacity.saturating_add(n.memory_bytes);
        }
        let loose = topology.cpus.iter().filter(|c| c.numa.is_none() && !reserved.contains(c.id)).count() as u32;
        s.loose_free_cpus = loose;
        s.cpu_capacity += loose;
        s.cpu_millis_capacity = u64::from(s.cpu_capacity) * 1000;

        // Devices: which NUMA node each offered address sits on.
        s.device_names = settings.devices.keys().cloned().collect();
        s.floating_devices = vec![0; s.device_names.len()];
        for n in &mut s.numa {
            n.free_devices = vec![0; s.device_names.len()];
        }
        let device_numa = |addr: &str| -> Option<usize> {
            let dev = topology.devices.iter().find(|d| d.address == addr)?;
            dev.numa.and_then(|id| numa_pos.get(&id).copied())
        };
        let count_device = |s: &mut NodeSummary, idx: usize, addr: &str, delta: i64| {
            let slot = match device_numa(addr) {
                Some(p) => &mut s.numa[p].free_devices[idx],
                None => &mut s.floating_devices[idx],
            };
            *slot = (i64::from(*slot) + delta).max(0) as u32;
        };
        for (idx, (_, addrs)) in settings.devices.iter().enumerate() {
            for a in addrs {
                count_device(&mut s, idx, a, 1);
            }
        }

        for placement in allocations.pods.values() {
            for c in &placement.containers {
                if c.cpu_policy == CpuPolicy::Exclusive {
                    for cpu in c.cpus.iter().filter(|c| !reserved.contains(*c)) {
                        match topology.cpu(cpu).map(|c| c.numa.and_then(|n| numa_pos.get(&n))) {
                            Some(Some(p)) => s.numa[*p].free_cpus = s.numa[*p].free_cpus.saturating_sub(1),
                            Some(None) => s.loose_free_cpus = s.loose_free_cpus.saturating_sub(1),
                            None => {}
                        }
                    }
                }
                for (numa, bytes) in &c.memory {
                    if let Some(p) = numa_pos.get(numa) {
                        s.numa[*p].free_memory = s.numa[*p].free_memory.saturating_sub(*bytes);
                    }
                }
                for (size, per_numa) in &c.hugepages {
                    for (numa, pages) in per_numa {
                        if let Some(p) = numa_pos.get(numa) {
                            if let Ok(i) = s.numa[*p].free_hugepages.binary_search_by_key(size, |(k, _)| *k) {
                                let free = &mut s.numa[*p].free_hugepages[i].1;
                                *free = free.saturating_sub(pages.saturating_mul(*size));
                            }
                        }
                    }
                }
                for (name, addrs) in &c.devices {
                    if let Ok(idx) = s.device_names.binary_search(name) {
                        for a in addrs {
                            count_device(&mut s, idx, a, -1);
                        }
                    }
                }
            }
            // The engine's own count (its allocatable check), so the two agree.
            let counted = placement.counted(&reserved);
            s.cpu_millis_used = s.cpu_millis_used.saturating_add(counted.cpu_millis);
            s.memory_used = s.memory_used.saturating_add(counted.memory);
        }
        s.free_cpus = s.numa.iter().map(|n| n.free_cpus).sum::<u32>() + s.loose_free_cpus;

        // Blind pods have no placement: they weigh on the totals only.
        for r in blind {
            s.free_cpus = s.free_cpus.saturating_sub(r.exclusive_cpus);
            s.cpu_millis_used = s.cpu_millis_used.saturating_add(r.cpu_millis);
            s.memory_used = s.memory_used.saturating_add(r.memory);
        }
        s
    }
}

/// NUMA nodes a `Hot` summary holds inline; nodes with more take the slow path.
pub(crate) const HOT_NUMA: usize = 8;

/// The numbers the filter scan reads for every node on every pod, packed
/// together in one array so that the scan walks memory in order instead of
/// chasing each node's heap pointers. Everything else about a node is read
/// only for the few nodes this cannot decide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Hot {
    pub ready: bool,
    pub has_labels: bool,
    /// The node's own topology policy, scope and `align-by-socket` option.
    pub policy: TopologyPolicy,
    pub scope: TopologyScope,
    pub align_by_socket: bool,
    /// `numa_*` below are complete (at most `HOT_NUMA` NUMA nodes).
    pub numa_inline: bool,
    pub numa_len: u8,
    pub free_cpus: u32,
    pub cpu_millis_used: u64,
    pub cpu_millis_capacity: u64,
    pub memory_used: u64,
    pub memory_capacity: u64,
    /// `SCALE / capacity` (0 for none), so that scoring multiplies instead of dividing.
    pub cpu_scale: f64,
    pub memory_scale: f64,
    pub numa_free_cpus: [u32; HOT_NUMA],
    pub numa_free_memory: [u64; HOT_NUMA],
}

impl Hot {
    pub fn of(s: &NodeSummary, info_ready: bool, has_labels: bool, settings: &NodeSettings) -> Hot {
        let mut h = Hot {
            ready: info_ready,
            has_labels,
            policy: settings.topology_policy,
            scope: settings.topology_scope,
            align_by_socket: settings.cpu_manager.align_by_socket,
            numa_inline: s.numa.len() <= HOT_NUMA,
            numa_len: s.numa.len().min(HOT_NUMA) as u8,
            free_cpus: s.free_cpus,
            cpu_millis_used: s.cpu_millis_used,
            cpu_millis_capacity: s.cpu_millis_capacity,
            memory_used: s.memory_used,
            memory_capacity: s.memory_capacity,
            cpu_scale: scale_of(s.cpu_millis_capacity),
            memory_scale: scale_of(s.memory_capacity),
            numa_free_cpus: [0; HOT_NUMA],
            numa_free_memory: [0; HOT_NUMA],
        };
        for (i, n) in s.numa.iter().take(HOT_NUMA).enumerate() {
            h.numa_free_cpus[i] = n.free_cpus;
            h.numa_free_memory[i] = n.free_memory;
        }
        h
    }

    pub fn free_cpu_millis(&self) -> u64 {
        self.cpu_millis_capacity.saturating_sub(self.cpu_millis_used)
    }

    pub fn free_memory(&self) -> u64 {
        self.memory_capacity.saturating_sub(self.memory_used)
    }
}

fn scale_of(capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        super::score::SCALE as f64 / capacity as f64
    }
}

pub(crate) fn lookup(v: &[(u64, u64)], key: u64) -> u64 {
    v.binary_search_by_key(&key, |(k, _)| *k).map(|i| v[i].1).unwrap_or(0)
}
