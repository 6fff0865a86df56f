//! The engine's indexed view of a `NodeTopology` and of what is free on it.
//!
//! `Machine` turns the plain topology into dense indexes (NUMA node index, core
//! index, socket index per CPU id) once per decision, and rejects topologies the
//! engine cannot reason about (CPUs on unlisted nodes, ids out of range, more NUMA
//! nodes than a `Mask` holds) instead of panicking on them. `Free` is the mutable
//! ledger of one decision: it starts from `Allocations` and shrinks as the pod's
//! containers are placed.

use std::collections::BTreeMap;

use crate::idset::{CpuSet, MAX_ID};
use crate::pod::CpuPolicy;
use crate::topology::{NodeTopology, NumaKind};

use super::{Allocations, NodeSettings, RejectReason, Rejection};

/// A set of NUMA nodes by *index* into `NodeTopology::numa_nodes` (not by id).
pub(crate) type Mask = u128;
/// The most NUMA nodes a machine may have for the engine: the shared limit,
/// which a `Mask` must hold.
pub(crate) const MAX_NODES: usize = crate::limits::MAX_NUMA_NODES;
const _: () = assert!(MAX_NODES <= Mask::BITS as usize);

pub(crate) fn bits(mut m: Mask) -> impl Iterator<Item = usize> + Clone {
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let b = m.trailing_zeros() as usize;
        m &= m - 1;
        Some(b)
    })
}

pub(crate) struct Machine<'a> {
    pub topo: &'a NodeTopology,
    /// Number of NUMA nodes.
    pub n: usize,
    pub node_cpus: Vec<CpuSet>,
    /// Socket index of each node's first CPU (`u32::MAX` for a CPU-less node).
    pub node_socket: Vec<u32>,
    /// CPU id -> node index / core index / socket index (`u32::MAX`: no such CPU).
    pub cpu_node: Vec<u32>,
    pub cpu_core: Vec<u32>,
    pub cpu_socket: Vec<u32>,
    /// CPU ids grouped by core index: core i is `core_list[core_start[i]..core_start[i + 1]]`.
    core_list: Vec<u32>,
    core_start: Vec<u32>,
    pub sockets: Vec<CpuSet>,
    /// CPU id -> last-level-cache group index (`u32::MAX`: none named), and
    /// each group's CPUs; both empty when the machine names no L3 groups.
    pub cpu_uncore: Vec<u32>,
    pub uncores: Vec<CpuSet>,
    pub threads_per_core: usize,
    /// A NUMA node spans several sockets: take whole NUMA nodes before sockets.
    pub numa_first: bool,
    /// Distances by node index, row-major `n * n`.
    pub dist: Vec<u32>,
    pub all_cpus: CpuSet,
    /// settings.reserved_cpus ∪ topology.reserved_cpus.
    pub reserved: CpuSet,
    /// Device address -> node index.
    pub device_node: BTreeMap<&'a str, Option<usize>>,
    /// The memory-only nodes (`NumaKind::MemoryOnly`): memory only for pods
    /// that ask for it.
    pub memory_only: Mask,
}

/// Renumbers arbitrary ids (huge, sparse) to 0.. in ascending order: a direct
/// table when the ids are small, a sorted list otherwise.
struct Dense {
    table: Vec<u32>,
    sorted: Vec<u32>,
    len: usize,
}

impl Dense {
    fn new(ids: impl Iterator<Item = u32> + Clone) -> Dense {
        let count = ids.clone().count();
        let max = ids.clone().max().unwrap_or(0) as usize;
        if max <= 4 * count + 64 {
            let mut table = vec![u32::MAX; max + 1];
            for id in ids {
                table[id as usize] = 0;
            }
            let mut len = 0;
            for t in table.iter_mut().filter(|t| **t == 0) {
                *t = len;
                len += 1;
            }
            Dense { table, sorted: Vec::new(), len: len as usize }
        } else {
            let mut sorted: Vec<u32> = ids.collect();
            sorted.sort_unstable();
            sorted.dedup();
            let len = sorted.len();
            Dense { table: Vec::new(), sorted, len }
        }
    }

    fn index(&self, id: u32) -> usize {
        if self.sorted.is_empty() {
            self.table.get(id as usize).map_or(0, |&x| x as usize)
        } else {
            self.sorted.binary_search(&id).unwrap_or(0)
        }
    }
}

fn bad_topology(reason: String) -> Rejection {
    Rejection { reason: RejectReason::InvalidRequest, message: format!("topology: {reason}") }
}

/// The bounds the engine relies on (the shared limits): checked before any
/// accounting, so that a topology out of bounds is refused as such, not as a
/// lack of CPUs its sets could not hold.
pub(crate) fn check_bounds(topo: &NodeTopology) -> Result<(), Rejection> {
    let n = topo.numa_nodes.len();
    if n == 0 {
        return Err(bad_topology("no NUMA nodes".into()));
    }
    if n > MAX_NODES {
        return Err(bad_topology(format!("{n} NUMA nodes; the engine handles at most {MAX_NODES}")));
    }
    if let Some(big) = topo.cpus.iter().map(|c| c.id).find(|&id| id > MAX_ID) {
        return Err(bad_topology(format!("cpu id {big} is larger than {MAX_ID}")));
    }
    // A NUMA node's id goes into the placement's NumaSet.
    if let Some(big) = topo.numa_nodes.iter().map(|nn| nn.id).find(|&id| id > MAX_ID) {
        return Err(bad_topology(format!("NUMA node id {big} is larger than {MAX_ID}")));
    }
    Ok(())
}

impl<'a> Machine<'a> {
    pub fn new(topo: &'a NodeTopology, settings: &NodeSettings) -> Result<Machine<'a>, Rejection> {
        check_bounds(topo)?;
        let n = topo.numa_nodes.len();
        let node_index = |id: u32| topo.numa_nodes.iter().position(|nn| nn.id == id);
        let max_id = topo.cpus.iter().map(|c| c.id).max().unwrap_or(0);
        let len = max_id as usize + 1;
        let mut cpu_node = vec![u32::MAX; len];
        let mut cpu_core = vec![u32::MAX; len];
        let mut cpu_socket = vec![u32::MAX; len];
        let mut node_cpus = vec![CpuSet::new(); n];
        let core_ids = Dense::new(topo.cpus.iter().map(|c| c.core));
        let socket_ids = Dense::new(topo.cpus.iter().map(|c| c.socket));
        let mut core_count = vec![0u32; core_ids.len + 1];
        let mut sockets = vec![CpuSet::new(); socket_ids.len];
        let mut all_cpus = CpuSet::new();
        // Node index lookup by id without a search per CPU.
        let mut last: Option<(u32, usize)> = None;
        for c in &topo.cpus {
            // A CPU in no node keeps `u32::MAX` in `cpu_node` and joins no
            // node's set: usable unaligned, never by an aligned placement.
            let ni = match (last, c.numa) {
                (_, None) => None,
                (Some((id, i)), Some(numa)) if id == numa => Some(i),
                (_, Some(numa)) => {
                    let i = node_index(numa).ok_or_else(|| {
                        bad_topology(format!("cpu {} is on NUMA node {numa} which is not listed", c.id))
                    })?;
                    last = Some((numa, i));
                    Some(i)
                }
            };
            if all_cpus.contains(c.id) {
                return Err(bad_topology(format!("cpu {} is listed twice", c.id)));
            }
            let core = core_ids.index(c.core);
            let socket = socket_ids.index(c.socket);
            cpu_node[c.id as usize] = ni.map_or(u32::MAX, |i| i as u32);
            cpu_core[c.id as usize] = core as u32;
            cpu_socket[c.id as usize] = socket as u32;
            // Every id is at most `max_id`, checked above against the sets' capacity.
            if let Some(ni) = ni {
                let _ = node_cpus[ni].insert(c.id);
            }
            core_count[core + 1] += 1;
            let _ = sockets[socket].insert(c.id);
            let _ = all_cpus.insert(c.id);
        }
        let node_socket = node_cpus
            .iter()
            .map(|s| s.first().map(|id| cpu_socket[id as usize]).unwrap_or(u32::MAX))
            .collect::<Vec<_>>();
        let numa_first = node_cpus.iter().any(|s| {
            let mut it = s.iter().map(|id| cpu_socket[id as usize]);
            let first = it.next();
            it.any(|x| Some(x) != first)
        });
        // Counting sort of CPU ids by core (ids stay ascending within a core).
        for i in 1..core_count.len() {
            core_count[i] += core_count[i - 1];
        }
        let core_start = core_count.clone();
        let mut core_list = vec![0u32; topo.cpus.len()];
        let mut fill = core_count;
        for c in &topo.cpus {
            let k = cpu_core[c.id as usize] as usize;
            core_list[fill[k] as usize] = c.id;
            fill[k] += 1;
        }
        let threads_per_core = core_start.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(1).max(1);
        let mut dist = vec![0u32; n * n];
        for (i, node) in topo.numa_nodes.iter().enumerate() {
            for j in 0..n {
                dist[i * n + j] = node.distances.get(j).copied().unwrap_or(if i == j { 10 } else { 20 });
            }
        }
        let (mut cpu_uncore, mut uncores) = (Vec::new(), Vec::new());
        if topo.cpus.iter().any(|c| c.uncore_cache.is_some()) {
            let ids = Dense::new(topo.cpus.iter().filter_map(|c| c.uncore_cache));
            cpu_uncore = vec![u32::MAX; len];
            uncores = vec![CpuSet::new(); ids.len];
            for c in &topo.cpus {
                if let Some(u) = c.uncore_cache {
                    let k = ids.index(u);
                    cpu_uncore[c.id as usize] = k as u32;
                    let _ = uncores[k].insert(c.id); // bounded as above
                }
            }
        }
        let reserved = settings.reserved(topo).intersection(&all_cpus);
        let device_node = topo.devices.iter().map(|d| (d.address.as_str(), d.numa.and_then(node_index))).collect();
        let memory_only =
            (0..n).filter(|&i| topo.numa_nodes[i].kind == NumaKind::MemoryOnly).fold(0, |m: Mask, i| m | (1 << i));
        Ok(Machine {
            topo,
            n,
            node_cpus,
            node_socket,
            cpu_node,
            cpu_core,
            cpu_socket,
            core_list,
            core_start,
            sockets,
            cpu_uncore,
            uncores,
            threads_per_core,
            numa_first,
            dist,
            all_cpus,
            reserved,
            device_node,
            memory_only,
        })
    }

    pub fn core_count(&self) -> usize {
        self.core_start.len() - 1
    }

    /// The CPU ids of core `i`, ascending.
    pub fn core(&self, i: usize) -> &[u32] {
        &self.core_list[self.core_start[i] as usize..self.core_start[i + 1] as usize]
    }

    /// The CPUs of `set` in no NUMA node (their node is offline, they are not).
    pub fn loose(&self, set: &CpuSet) -> CpuSet {
        let placed = self.node_cpus.iter().map(CpuSet::len).sum::<usize>();
        if placed == self.all_cpus.len() {
            return CpuSet::new();
        }
        set.difference(&self.cpus_of(self.all_nodes()))
    }

    /// How many CPUs of `set` each NUMA node holds.
    pub fn per_node(&self, set: &CpuSet) -> Vec<u64> {
        let mut v = vec![0u64; self.n];
        for id in set.iter() {
            if let Some(&k) = self.cpu_node.get(id as usize) {
                if k != u32::MAX {
                    v[k as usize] += 1;
                }
            }
        }
        v
    }

    pub fn all_nodes(&self) -> Mask {
        if self.n >= 128 {
            Mask::MAX
        } else {
            (1u128 << self.n) - 1
        }
    }

    /// The nodes a memory binding over `mask` may name: those of `mask` that
    /// have memory (regular or huge pages) and are not memory-only; when none
    /// has, the nearest such nodes to `mask` (a CPU-only node's CPUs use
    /// remote memory anyway, and binding a node without memory would fail
    /// every allocation); 0 (no binding) when only memory-only nodes, or no
    /// node at all, report memory.
    pub fn with_memory(&self, mask: Mask) -> Mask {
        let has_memory = |i: usize| {
            let node = &self.topo.numa_nodes[i];
            self.memory_only & (1 << i) == 0 && (node.memory_bytes > 0 || node.hugepages.iter().any(|h| h.total > 0))
        };
        let own = bits(mask).filter(|&i| has_memory(i)).fold(0, |m, i| m | (1 << i));
        if own != 0 || mask == 0 {
            return own;
        }
        let reach = |j: usize| bits(mask).map(|i| self.distance(i, j)).min().unwrap_or(u32::MAX);
        let Some(nearest) = (0..self.n).filter(|&j| has_memory(j)).map(reach).min() else { return 0 };
        (0..self.n).filter(|&j| has_memory(j) && reach(j) == nearest).fold(0, |m, j| m | (1 << j))
    }

    pub fn node_id(&self, idx: usize) -> u32 {
        self.topo.numa_nodes[idx].id
    }

    pub fn numa_set(&self, m: Mask) -> crate::idset::NumaSet {
        let mut s = crate::idset::NumaSet::new();
        for i in bits(m) {
            // `new` refused ids beyond the set's capacity.
            let _ = s.insert(self.node_id(i));
        }
        s
    }

    /// The nodes holding CPUs of `cpus`.
    pub fn nodes_of(&self, cpus: &CpuSet) -> Mask {
        let node = |id: u32| self.cpu_node.get(id as usize).copied().filter(|&k| k != u32::MAX);
        cpus.iter().filter_map(node).fold(0, |a, k| a | (1 << k))
    }

    pub fn cpus_of(&self, m: Mask) -> CpuSet {
        let mut s = CpuSet::new();
        for i in bits(m) {
            s.union_with(&self.node_cpus[i]);
        }
        s
    }

    /// Sockets spanned by the CPU-bearing nodes of `m`.
    pub fn sockets_of(&self, m: Mask) -> usize {
        let mut v: Vec<u32> = bits(m).map(|i| self.node_socket[i]).filter(|&s| s != u32::MAX).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    }

    /// CPUs of every socket that holds a CPU of `m` (align-by-socket).
    pub fn socket_cpus_of(&self, m: Mask) -> CpuSet {
        let mut s = CpuSet::new();
        let mut seen: Vec<u32> = Vec::new();
        for i in bits(m) {
            let sock = self.node_socket[i];
            if sock != u32::MAX && !seen.contains(&sock) {
                seen.push(sock);
                s.union_with(&self.sockets[sock as usize]);
            }
        }
        // A CPU in no node shares the socket but no node's memory: not aligned.
        s.difference(&self.loose(&s))
    }

    pub fn distance(&self, a: usize, b: usize) -> u32 {
        self.dist[a * self.n + b]
    }
}

/// What is free now; updated as containers of the pod being decided are placed.
pub(crate) struct Free {
    /// CPUs that may be given out as exclusive or immovable: all minus reserved,
    /// exclusive and immovable ones.
    pub assignable: CpuSet,
    /// The shared pool: all minus exclusive CPUs (and minus the reserved ones
    /// under `strict-cpu-reservation`).
    pub pool: CpuSet,
    /// Bytes used per node index.
    pub mem_used: Vec<u64>,
    /// Page size -> pages used per node index.
    pub hp_used: BTreeMap<u64, Vec<u64>>,
    /// Device addresses already handed out.
    pub devices_taken: std::collections::BTreeSet<String>,
}

impl Free {
    pub fn new(m: &Machine<'_>, a: &Allocations, strict_reservation: bool) -> Free {
        let mut pinned = CpuSet::new();
        let mut exclusive = CpuSet::new();
        let mut mem_used = vec![0u64; m.n];
        let mut hp_used: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut devices_taken = std::collections::BTreeSet::new();
        let index = |id: u32| m.topo.numa_nodes.iter().position(|nn| nn.id == id);
        for p in a.pods.values() {
            for c in &p.containers {
                match c.cpu_policy {
                    CpuPolicy::Exclusive => {
                        exclusive.union_with(&c.cpus);
                        pinned.union_with(&c.cpus);
                    }
                    CpuPolicy::Immovable => pinned.union_with(&c.cpus),
                    CpuPolicy::Numa | CpuPolicy::Shared => {}
                }
                for (&node, &bytes) in &c.memory {
                    if let Some(i) = index(node) {
                        mem_used[i] = mem_used[i].saturating_add(bytes);
                    }
                }
                for (&size, per_node) in &c.hugepages {
                    let v = hp_used.entry(size).or_insert_with(|| vec![0; m.n]);
                    for (&node, &pages) in per_node {
                        if let Some(i) = index(node) {
                            v[i] = v[i].saturating_add(pages);
                        }
                    }
                }
                for addrs in c.devices.values() {
                    devices_taken.extend(addrs.iter().cloned());
                }
            }
        }
        let assignable = m.all_cpus.difference(&m.reserved).difference(&pinned);
        let mut pool = m.all_cpus.difference(&exclusive);
        if strict_reservation {
            pool.difference_with(&m.reserved);
        }
        Free { assignable, pool, mem_used, hp_used, devices_taken }
    }

    /// Free bytes on a node.
    pub fn mem_free(&self, m: &Machine<'_>, i: usize) -> u64 {
        m.topo.numa_nodes[i].memory_bytes.saturating_sub(self.mem_used[i])
    }

    /// Total and free pages of one size on a node.
    pub fn hp(&self, m: &Machine<'_>, size: u64, i: usize) -> (u64, u64) {
        let total = m.topo.numa_nodes[i].hugepages.iter().filter(|h| h.page_size_bytes == size).map(|h| h.total).sum();
        let used = self.hp_used.get(&size).map_or(0, |v| v[i]);
        (total, total.saturating_sub(used))
    }
}
