//! Topology discovery: a Linux sysfs tree under a root directory -> `NodeTopology`.
//!
//! Owns every read of `sys/devices/system/{cpu,node}`, `sys/bus/pci/devices` and
//! (for machines without NUMA support) `proc/meminfo`. The root is a parameter so the
//! same code reads the host (`/`) and the captured machines in the fixtures.
//!
//! The kernel's layout varies across versions and architectures (see the fixture
//! README's "Layouts a parser must handle"): any file may be absent, `cpuN/online` may
//! be empty, masks may be hex words or lists, ids may be -1 or huge and sparse. The
//! rules here:
//! - a CPU is online when it has a `topology/` directory, its `online` file (if any)
//!   is not `0`, and the `cpu/online` / `cpu/present` lists (if any) contain it;
//! - a core is a group of online threads sharing `thread_siblings` (the kernel's
//!   `core_id` repeats per package, and even per die on AMD Bulldozer), numbered
//!   0.. by lowest CPU id, so core ids are unique per machine;
//! - a socket is a `physical_package_id`, or the `core_siblings` group where the id is
//!   -1 (POWER7), numbered 0.. by lowest CPU id;
//! - a CPU's NUMA node comes from the node `cpulist` (or `cpumap`), else from a
//!   `cpuN/nodeM` link; without `node/` the machine is one node 0 with the memory of
//!   `proc/meminfo`;
//! - a CPU's uncore cache group is the online part of the `shared_cpu_list` (or
//!   `shared_cpu_map`) of its level-3 data or unified cache (`cpuN/cache/indexM/`),
//!   numbered 0.. by lowest CPU id; a CPU without one (old kernels, machines with
//!   no L3) has none;
//! - a NUMA node is a `nodeN` folder whose id is in `node/online` (if any): a
//!   possible node that is offline is not part of the machine; an online node
//!   may have no CPUs, no memory (`node/has_memory`, else its `meminfo`), or
//!   neither; a `distance` row may list the node folders, the online nodes or
//!   every possible node, and is read by node id;
//! - a node is memory-only when it has memory and none of the online CPUs (see
//!   `numa_kind`).
//!
//! An absent file is tolerated; a present file that does not parse is an error naming
//! the file.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use specs::idset::{CpuSet, IdSet, MAX_ID};
use specs::topology::{Cpu, HugePages, NumaKind, NumaNode, PciDevice};
use specs::NodeTopology;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
    /// Every file parsed but together they describe no machine (siblings across
    /// sockets, more memory than any node has): `validate_topology`'s problems.
    #[error("{root}: inconsistent topology: {problems}")]
    Inconsistent { root: PathBuf, problems: String },
}

pub(crate) fn malformed(path: &Path, reason: impl Into<String>) -> DiscoveryError {
    DiscoveryError::Malformed { path: path.to_path_buf(), reason: reason.into() }
}

/// Reads `root/sys/devices/system/{cpu,node}` and `root/sys/bus/pci/devices`.
pub fn discover(root: &Path) -> Result<NodeTopology, DiscoveryError> {
    let cpu_dir = root.join("sys/devices/system/cpu");
    let threads = read_cpus(&cpu_dir)?;
    if threads.is_empty() {
        return Err(malformed(&cpu_dir, "no online CPU (no cpuN directory with a topology/ directory)"));
    }
    let online = CpuSet::from_ids(threads.iter().map(|t| t.id)).map_err(|e| malformed(&cpu_dir, e.to_string()))?;

    let nodes = read_nodes(root, &online)?;
    let numa_of = numa_map(&threads, &nodes, &cpu_dir)?;
    let (cores, sockets) = group(&threads, &online);
    let l3 = uncore_caches(&threads, &online);

    let cpus: Vec<Cpu> = threads
        .iter()
        .map(|t| Cpu {
            id: t.id,
            core: cores[&t.id],
            socket: sockets[&t.id],
            die: t.die,
            numa: numa_of.get(&t.id).copied().flatten(),
            uncore_cache: l3.get(&t.id).copied(),
        })
        .collect();

    let numa_nodes = nodes
        .into_iter()
        .map(|n| {
            // Derived from the final map so that `cpus` and `Cpu::numa` never disagree.
            let cpus = online.filter(|id| numa_of.get(&id) == Some(&Some(n.id)));
            NumaNode {
                kind: numa_kind(&cpus, n.memory_bytes),
                id: n.id,
                cpus,
                memory_bytes: n.memory_bytes,
                distances: n.distances,
                hugepages: n.hugepages,
            }
        })
        .collect();

    let devices = read_pci(&root.join("sys/bus/pci/devices"))?;
    let kernel = kernel_profile(root, &online)?;
    let mut topology = NodeTopology { cpus, numa_nodes, devices, reserved_cpus: CpuSet::new(), kernel };
    crate::devices::offer(root, &mut topology)?;
    // The engine's precondition: a tree no kernel writes (found by fuzzing) is a
    // clear error here rather than a topology the engine was never meant to see.
    let problems = specs::validate::validate_topology(&topology);
    if !problems.is_empty() {
        let problems = problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        return Err(DiscoveryError::Inconsistent { root: root.to_path_buf(), problems });
    }
    Ok(topology)
}

/// The CPUs online now under `root`, by the same rules as `discover`: what the
/// agent re-reads to notice a CPU taken offline (or brought back) while it
/// runs. sysfs gives no inotify events, so this is polled; it reads a few
/// small files per CPU.
pub(crate) fn online_cpus(root: &Path) -> Result<CpuSet, DiscoveryError> {
    let cpu_dir = root.join("sys/devices/system/cpu");
    CpuSet::from_ids(read_cpus(&cpu_dir)?.iter().map(|t| t.id)).map_err(|e| malformed(&cpu_dir, e.to_string()))
}

// ---------------------------------------------------------------------------
/// The node's boot profile: `isolcpus`, `nohz_full` and `rcu_nocbs` from
/// `root/proc/cmdline` and `root/sys/devices/system/cpu/{isolated,nohz_full}`
/// (online CPUs only), PREEMPT_RT from `root/sys/kernel/realtime` or the
/// kernel's version string (`uname -v`), and the first online CPU's
/// governors and idle states.
fn kernel_profile(root: &Path, online: &CpuSet) -> Result<specs::topology::KernelProfile, DiscoveryError> {
    let cmdline_path = root.join("proc/cmdline");
    let cmdline = read_opt(&cmdline_path)?.unwrap_or_default();
    let boot = boot_params(&cmdline).map_err(|e| malformed(&cmdline_path, e))?;
    let cpu_dir = root.join("sys/devices/system/cpu");
    let mut isolated = boot.isolcpus;
    let mut nohz_full = boot.nohz_full;
    for (file, set) in [("isolated", &mut isolated), ("nohz_full", &mut nohz_full)] {
        let path = cpu_dir.join(file);
        // `(null)`: nohz_full is built in but off.
        if let Some(text) = read_opt(&path)?.filter(|t| t != "(null)") {
            set.union_with(&parse_list(&path, &text)?);
        }
    }
    let realtime = read_opt(&root.join("sys/kernel/realtime"))?.is_some_and(|v| v == "1")
        || read_opt(&root.join("proc/sys/kernel/version"))?.is_some_and(|v| v.contains("PREEMPT_RT"));
    let first = online.first().map(|id| cpu_dir.join(format!("cpu{id}")));
    let governors = match &first {
        Some(dir) => read_opt(&dir.join("cpufreq/scaling_available_governors"))?
            .map(|g| g.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let mut idle_states = Vec::new();
    if let Some(dir) = &first {
        for (_, state) in numbered_entries(&dir.join("cpuidle"), "state")? {
            if let Some(name) = read_opt(&state.join("name"))? {
                idle_states.push(name);
            }
        }
    }
    Ok(specs::topology::KernelProfile {
        isolated_cpus: isolated.intersection(online),
        nohz_full: nohz_full.intersection(online),
        rcu_nocbs: boot.rcu_nocbs.intersection(online),
        realtime,
        governors,
        idle_states,
    })
}

/// The CPU lists of a kernel command line.
#[derive(Debug, Default, PartialEq, Eq)]
struct BootParams {
    isolcpus: CpuSet,
    nohz_full: CpuSet,
    rcu_nocbs: CpuSet,
}

/// `isolcpus=[flags,]LIST`, `nohz_full=LIST`, `rcu_nocbs=LIST` of a kernel
/// command line (the flags are `nohz`, `domain` and `managed_irq`; a later
/// parameter wins, as the kernel's parsing goes); parameters after `--` are
/// init's, not the kernel's.
fn boot_params(cmdline: &str) -> Result<BootParams, String> {
    let mut out = BootParams::default();
    for word in cmdline.split_whitespace() {
        if word == "--" {
            break;
        }
        let Some((key, value)) = word.split_once('=') else { continue };
        let (set, list) = match key {
            "isolcpus" => {
                let list: Vec<&str> =
                    value.split(',').filter(|part| !matches!(*part, "nohz" | "domain" | "managed_irq")).collect();
                (&mut out.isolcpus, list.join(","))
            }
            "nohz_full" => (&mut out.nohz_full, value.to_string()),
            "rcu_nocbs" => (&mut out.rcu_nocbs, value.to_string()),
            _ => continue,
        };
        *set = CpuSet::parse_list(&list).map_err(|e| format!("{key}: {e}"))?;
    }
    Ok(out)
}

// File helpers

/// The file's text with whitespace and the NUL bytes some old kernels append
/// trimmed; `None` when the file (or a link on its way) does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>, DiscoveryError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| malformed(path, "not UTF-8 text"))?;
            Ok(Some(text.trim_matches(|c: char| c.is_whitespace() || c == '\0').to_string()))
        }
        Err(e) if e.kind() == ErrorKind::NotFound || e.kind() == ErrorKind::NotADirectory => Ok(None),
        Err(e) => Err(DiscoveryError::Io { path: path.to_path_buf(), source: e }),
    }
}

/// A directory's entries with UTF-8 names as `(name, path)`; empty when the
/// directory does not exist (sysfs leaves out what a machine lacks).
pub(crate) fn dir_entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, DiscoveryError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DiscoveryError::Io { path: dir.to_path_buf(), source: e }),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| DiscoveryError::Io { path: dir.to_path_buf(), source: e })?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

/// Entries `PREFIXn` of a directory as `(n, path)`, sorted by n; empty when the
/// directory does not exist.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, DiscoveryError> {
    let mut out = Vec::new();
    for (name, path) in dir_entries(dir)? {
        let Some(rest) = name.strip_prefix(prefix) else { continue };
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            continue; // `cpufreq`, `cpuidle`, `node/online`, ...
        }
        let id: u32 = rest.parse().map_err(|_| malformed(&path, "id out of range"))?;
        if id > MAX_ID {
            return Err(malformed(&path, format!("id {id} is larger than {MAX_ID}")));
        }
        out.push((id, path));
    }
    out.sort_by_key(|(id, _)| *id);
    Ok(out)
}

fn parse_list(path: &Path, text: &str) -> Result<IdSet, DiscoveryError> {
    IdSet::parse_list(text).map_err(|e| malformed(path, e.to_string()))
}

fn parse_mask(path: &Path, text: &str) -> Result<IdSet, DiscoveryError> {
    IdSet::parse_mask(text).map_err(|e| malformed(path, e.to_string()))
}

/// A set from `dir/LIST` (list syntax) or else `dir/MASK` (hex words).
fn read_set(dir: &Path, list: &str, mask: &str) -> Result<Option<IdSet>, DiscoveryError> {
    Ok(read_set_from(dir, list, mask)?.map(|(set, _)| set))
}

/// `read_set`, also saying which file the set came from.
fn read_set_from(dir: &Path, list: &str, mask: &str) -> Result<Option<(IdSet, PathBuf)>, DiscoveryError> {
    let p = dir.join(list);
    if let Some(text) = read_opt(&p)? {
        return Ok(Some((parse_list(&p, &text)?, p)));
    }
    let p = dir.join(mask);
    match read_opt(&p)? {
        Some(text) => Ok(Some((parse_mask(&p, &text)?, p))),
        None => Ok(None),
    }
}

/// A signed id (`-1` is the kernel's "unknown").
fn read_id(path: &Path) -> Result<Option<i64>, DiscoveryError> {
    match read_opt(path)? {
        None => Ok(None),
        Some(text) => {
            text.parse::<i64>().map(Some).map_err(|_| malformed(path, format!("{text:?} is not an integer id")))
        }
    }
}

fn non_negative_u32(path: &Path, v: Option<i64>) -> Result<Option<u32>, DiscoveryError> {
    match v {
        None => Ok(None),
        Some(v) if v < 0 => Ok(None),
        Some(v) => u32::try_from(v).map(Some).map_err(|_| malformed(path, format!("id {v} is out of range"))),
    }
}

// ---------------------------------------------------------------------------
// CPUs

/// One online logical CPU as the kernel describes it, before renumbering.
#[derive(Debug)]
struct Thread {
    id: u32,
    /// `physical_package_id`, `None` where absent or -1.
    package: Option<u32>,
    die: Option<u32>,
    /// `core_id`, used only when `thread_siblings` is absent.
    core_id: Option<i64>,
    thread_siblings: Option<CpuSet>,
    core_siblings: Option<CpuSet>,
    /// The CPUs sharing its level-3 cache, as the kernel lists them.
    l3_shared: Option<CpuSet>,
}

fn read_cpus(cpu_dir: &Path) -> Result<Vec<Thread>, DiscoveryError> {
    if !cpu_dir.is_dir() {
        return Err(malformed(cpu_dir, "no such directory (is this a sysfs root?)"));
    }
    let list = |name: &str| -> Result<Option<CpuSet>, DiscoveryError> {
        let p = cpu_dir.join(name);
        read_opt(&p)?.map(|t| parse_list(&p, &t)).transpose()
    };
    let online_list = list("online")?;
    let present_list = list("present")?;

    let mut threads = Vec::new();
    for (id, dir) in numbered_entries(cpu_dir, "cpu")? {
        if online_list.as_ref().is_some_and(|s| !s.contains(id))
            || present_list.as_ref().is_some_and(|s| !s.contains(id))
        {
            continue;
        }
        let online_file = dir.join("online");
        match read_opt(&online_file)?.as_deref() {
            // Absent (cpu0 usually) or empty (old ia64 kernels): online.
            None | Some("") | Some("1") => {}
            Some("0") => continue,
            Some(other) => return Err(malformed(&online_file, format!("{other:?} is neither 0 nor 1"))),
        }
        let topo = dir.join("topology");
        if !topo.is_dir() {
            // Offline CPUs on old kernels have no topology directory at all.
            tracing::debug!(cpu = id, "no topology directory, treated as offline");
            continue;
        }
        let package_path = topo.join("physical_package_id");
        let package = non_negative_u32(&package_path, read_id(&package_path)?)?;
        let die_path = topo.join("die_id");
        let die = non_negative_u32(&die_path, read_id(&die_path)?)?;
        let core_id = read_id(&topo.join("core_id"))?;
        let mut thread_siblings = read_set(&topo, "thread_siblings_list", "thread_siblings")?;
        if thread_siblings.is_none() {
            thread_siblings = read_set(&topo, "core_cpus_list", "core_cpus")?;
        }
        let mut core_siblings = read_set(&topo, "core_siblings_list", "core_siblings")?;
        if core_siblings.is_none() {
            core_siblings = read_set(&topo, "package_cpus_list", "package_cpus")?;
        }
        let l3_shared = read_l3(&dir.join("cache"))?;
        threads.push(Thread { id, package, die, core_id, thread_siblings, core_siblings, l3_shared });
    }
    Ok(threads)
}

/// The `shared_cpu_list` (or `shared_cpu_map`) of the level-3 data or unified
/// cache under a `cpuN/cache` directory; `None` when it names no such cache.
fn read_l3(cache_dir: &Path) -> Result<Option<CpuSet>, DiscoveryError> {
    for (_, index) in numbered_entries(cache_dir, "index")? {
        let level_path = index.join("level");
        let Some(level) = read_opt(&level_path)? else { continue };
        let level: u32 =
            level.parse().map_err(|_| malformed(&level_path, format!("{level:?} is not a cache level")))?;
        if level != 3 {
            continue;
        }
        let type_path = index.join("type");
        match read_opt(&type_path)?.as_deref() {
            // An absent type (never seen) is taken as unified.
            None | Some("Unified") | Some("Data") => {}
            Some("Instruction") => continue,
            Some(other) => return Err(malformed(&type_path, format!("{other:?} is not Data, Instruction or Unified"))),
        }
        if let Some(shared) = read_set(&index, "shared_cpu_list", "shared_cpu_map")? {
            return Ok(Some(shared));
        }
    }
    Ok(None)
}

/// Every CPU's uncore (L3) cache group, numbered 0.. by the lowest CPU id of
/// the group. CPUs whose cache the kernel does not describe are left out.
fn uncore_caches(threads: &[Thread], online: &CpuSet) -> BTreeMap<u32, u32> {
    let mut group_of_set: BTreeMap<CpuSet, u32> = BTreeMap::new();
    let mut out = BTreeMap::new();
    // `threads` is sorted by id, so groups are numbered in order of first appearance.
    for t in threads {
        let Some(shared) = &t.l3_shared else { continue };
        let n = group_of_set.len() as u32;
        out.insert(t.id, *group_of_set.entry(with_self(shared, online, t.id)).or_insert(n));
    }
    out
}

/// Core and socket number of every online CPU, both renumbered 0.. in order of the
/// lowest CPU id they hold.
fn group(threads: &[Thread], online: &CpuSet) -> (BTreeMap<u32, u32>, BTreeMap<u32, u32>) {
    // Socket key: the package id, or the (online) core_siblings group where the
    // kernel does not know the package (-1 on POWER7); a CPU with neither is alone.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum SocketKey {
        Package(u32),
        Siblings(CpuSet),
    }
    let socket_key = |t: &Thread| match (t.package, &t.core_siblings) {
        (Some(p), _) => SocketKey::Package(p),
        (None, Some(s)) => SocketKey::Siblings(with_self(s, online, t.id)),
        (None, None) => SocketKey::Siblings(with_self(&CpuSet::new(), online, t.id)),
    };
    let mut socket_of_key: BTreeMap<SocketKey, u32> = BTreeMap::new();
    let mut sockets = BTreeMap::new();
    let mut socket_index = BTreeMap::new();
    for t in threads {
        let n = socket_of_key.len() as u32;
        let s = *socket_of_key.entry(socket_key(t)).or_insert(n);
        sockets.insert(t.id, s);
        socket_index.insert(t.id, s);
    }

    // Core key: the online thread_siblings group; without one, the kernel's core_id
    // within its socket and die.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum CoreKey {
        Siblings(CpuSet),
        Id { socket: u32, die: Option<u32>, core_id: i64 },
        Alone(u32),
    }
    let mut core_of_key: BTreeMap<CoreKey, u32> = BTreeMap::new();
    let mut cores = BTreeMap::new();
    for t in threads {
        let key = match (&t.thread_siblings, t.core_id) {
            (Some(s), _) => CoreKey::Siblings(with_self(s, online, t.id)),
            (None, Some(core_id)) if core_id >= 0 => CoreKey::Id { socket: socket_index[&t.id], die: t.die, core_id },
            _ => CoreKey::Alone(t.id),
        };
        let n = core_of_key.len() as u32;
        cores.insert(t.id, *core_of_key.entry(key).or_insert(n));
    }
    (cores, sockets)
}

/// A sibling mask restricted to online CPUs and always holding the CPU itself, so a
/// stale or one-sided mask cannot merge a CPU into a group it does not belong to.
fn with_self(siblings: &CpuSet, online: &CpuSet, id: u32) -> CpuSet {
    let mut s = siblings.intersection(online);
    // `id` is an online CPU, read into a set already: within the capacity.
    let _ = s.insert(id);
    s
}

// ---------------------------------------------------------------------------
// NUMA nodes

/// A NUMA node as read, before its CPU set is reconciled with the CPU map.
struct RawNode {
    id: u32,
    /// The node's CPUs and the file (`cpulist` or `cpumap`) they came from.
    cpus: Option<(CpuSet, PathBuf)>,
    memory_bytes: u64,
    distances: Vec<u32>,
    hugepages: Vec<HugePages>,
}

/// A node with memory and none of the CPUs discovery keeps (the online ones) is
/// memory-only. Offline CPUs do not count: a CPU offline when the machine is
/// read is never handed out before the next discovery (the agent only takes
/// away CPUs that go offline later), so such a node offers memory alone, just
/// like HBM or a CXL expander. `has_cpu` is not read for this: old kernels
/// lack it (the Itanium dump), and where present it says the same (the nodes
/// with an online CPU).
pub(crate) fn numa_kind(cpus: &CpuSet, memory_bytes: u64) -> NumaKind {
    if cpus.is_empty() && memory_bytes > 0 {
        NumaKind::MemoryOnly
    } else {
        NumaKind::CpusAndMemory
    }
}

fn read_nodes(root: &Path, online: &CpuSet) -> Result<Vec<RawNode>, DiscoveryError> {
    let node_dir = root.join("sys/devices/system/node");
    let entries = numbered_entries(&node_dir, "node")?;
    if entries.is_empty() {
        // A kernel without NUMA support: one node holding every CPU and all memory.
        let meminfo = root.join("proc/meminfo");
        let memory_bytes = read_meminfo_total(&meminfo, "MemTotal:")?.unwrap_or(0);
        let hugepages = read_hugepages(&root.join("sys/kernel/mm/hugepages"))?;
        return Ok(vec![RawNode {
            id: 0,
            cpus: Some((online.clone(), node_dir)),
            memory_bytes,
            distances: vec![10],
            hugepages,
        }]);
    }
    // The kernel's own lists of node states; any may be absent (old kernels,
    // the dumps). A folder of a node that is not online is left out: nothing
    // can be placed there.
    let state = |name: &str| -> Result<Option<IdSet>, DiscoveryError> {
        let p = node_dir.join(name);
        read_opt(&p)?.map(|t| parse_list(&p, &t)).transpose()
    };
    let (possible, online, has_memory) = (state("possible")?, state("online")?, state("has_memory")?);
    let folders: Vec<u32> = entries.iter().map(|(id, _)| *id).collect();
    let entries: Vec<(u32, PathBuf)> = entries
        .into_iter()
        .filter(|(id, _)| {
            let on = online.as_ref().is_none_or(|o| o.contains(*id));
            if !on {
                tracing::info!(node = id, "NUMA node is not online; left out");
            }
            on
        })
        .collect();
    let kept: Vec<u32> = entries.iter().map(|(id, _)| *id).collect();
    // Which node each entry of a `distance` row is about: a row may list the
    // node folders, the online nodes or every possible node, depending on the
    // kernel, so it is matched by its length, in that order.
    let columns: Vec<Vec<u32>> =
        [Some(folders), online.map(|s| s.iter().collect()), possible.map(|s| s.iter().collect())]
            .into_iter()
            .flatten()
            .collect();
    let mut nodes = Vec::with_capacity(entries.len());
    for (id, path) in entries {
        let cpus = read_set_from(&path, "cpulist", "cpumap")?;
        let meminfo = path.join("meminfo");
        let memory_bytes = match &has_memory {
            // The kernel's word on which nodes have memory wins over a
            // meminfo that still counts memory being taken offline.
            Some(with) if !with.contains(id) => 0,
            _ => read_meminfo_total(&meminfo, "MemTotal:")?.unwrap_or(0),
        };
        let distance_path = path.join("distance");
        let distances = match read_opt(&distance_path)? {
            None => Vec::new(),
            Some(text) => {
                let row = text
                    .split_whitespace()
                    .map(|w| {
                        w.parse::<u32>().map_err(|_| malformed(&distance_path, format!("{w:?} is not a distance")))
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                let Some(ids) = columns.iter().find(|c| c.len() == row.len()) else {
                    return Err(malformed(
                        &distance_path,
                        format!("{} distances for {} NUMA nodes", row.len(), kept.len()),
                    ));
                };
                kept.iter()
                    .map(|to| {
                        ids.iter().position(|c| c == to).map(|i| row[i]).ok_or_else(|| {
                            malformed(&distance_path, format!("no distance to node {to} (the row lists nodes {ids:?})"))
                        })
                    })
                    .collect::<Result<Vec<u32>, _>>()?
            }
        };
        let hugepages = read_hugepages(&path.join("hugepages"))?;
        nodes.push(RawNode { id, cpus, memory_bytes, distances, hugepages });
    }
    Ok(nodes)
}

/// `MemTotal` in bytes from a `meminfo` file, either `/proc/meminfo`
/// (`MemTotal: 16 kB`) or a node's (`Node 0 MemTotal: 16 kB`).
fn read_meminfo_total(path: &Path, key: &str) -> Result<Option<u64>, DiscoveryError> {
    let Some(text) = read_opt(path)? else { return Ok(None) };
    for line in text.lines() {
        let mut words = line.split_whitespace().skip_while(|w| *w != key);
        if words.next().is_none() {
            continue;
        }
        let value = words.next().ok_or_else(|| malformed(path, format!("{key} has no value")))?;
        let n: u64 = value.parse().map_err(|_| malformed(path, format!("{key} {value:?} is not a number")))?;
        let scale = match words.next() {
            None => 1,
            Some("kB") => 1024,
            Some(unit) => return Err(malformed(path, format!("{key} has unknown unit {unit:?}"))),
        };
        return n.checked_mul(scale).map(Some).ok_or_else(|| malformed(path, format!("{key} overflows")));
    }
    Err(malformed(path, format!("no {key} line")))
}

/// `hugepages-<N>kB/nr_hugepages` under `dir`, sorted by page size; sizes with zero
/// pages are kept so the sizes the machine supports are visible.
fn read_hugepages(dir: &Path) -> Result<Vec<HugePages>, DiscoveryError> {
    let mut out = Vec::new();
    for (name, path) in dir_entries(dir)? {
        let Some(size) = name.strip_prefix("hugepages-").and_then(|n| n.strip_suffix("kB")) else {
            continue;
        };
        let kib: u64 = size.parse().map_err(|_| malformed(&path, format!("page size {size:?} is not a number")))?;
        let nr = path.join("nr_hugepages");
        let Some(text) = read_opt(&nr)? else { continue };
        let total: u64 = text.parse().map_err(|_| malformed(&nr, format!("{text:?} is not a page count")))?;
        let page_size_bytes = kib.checked_mul(1024).ok_or_else(|| malformed(&path, "page size overflows"))?;
        out.push(HugePages { page_size_bytes, total });
    }
    out.sort_by_key(|h| h.page_size_bytes);
    Ok(out)
}

/// Every online CPU's NUMA node: the node cpulists first, then `cpuN/nodeM` links for
/// CPUs no list names. A CPU in two nodes' lists is an error. A CPU that no
/// online node lists (its node is offline, it is not) is in no node: local to
/// no memory, so the engine never counts it in an aligned placement. Only
/// where no node lists any CPU at all (a dump without cpulists or links) are
/// they all the first node's, as hwloc does.
fn numa_map(
    threads: &[Thread],
    nodes: &[RawNode],
    cpu_dir: &Path,
) -> Result<BTreeMap<u32, Option<u32>>, DiscoveryError> {
    let mut map = BTreeMap::new();
    for node in nodes {
        let Some((cpus, path)) = &node.cpus else { continue };
        for cpu in cpus.iter() {
            if let Some(other) = map.insert(cpu, node.id) {
                if other != node.id {
                    return Err(malformed(path, format!("CPU {cpu} is also listed in node{other}")));
                }
            }
        }
    }
    let node_ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let mut out = BTreeMap::new();
    let mut loose = Vec::new();
    for t in threads {
        let numa = match map.get(&t.id) {
            Some(&n) => Some(n),
            None => match node_link(&cpu_dir.join(format!("cpu{}", t.id)))? {
                Some(n) if node_ids.contains(&n) => Some(n),
                _ => {
                    loose.push(t.id);
                    None
                }
            },
        };
        out.insert(t.id, numa);
    }
    if !loose.is_empty() {
        if out.values().all(Option::is_none) {
            let first = node_ids.first().copied().unwrap_or(0);
            tracing::warn!(node = first, "no NUMA node lists any CPU; every CPU placed in the first node");
            out.values_mut().for_each(|n| *n = Some(first));
        } else {
            let list = CpuSet::from_ids(loose.iter().copied()).map(|s| s.to_string()).unwrap_or_default();
            tracing::warn!(
                cpus = %list,
                "online CPUs in no online NUMA node's cpulist (their node is offline?): \
                 in no node, used only by placements that need no NUMA alignment"
            );
        }
    }
    Ok(out)
}

/// The `M` of a `cpuN/nodeM` entry, if the kernel made one (a link; it may dangle).
fn node_link(cpu: &Path) -> Result<Option<u32>, DiscoveryError> {
    Ok(numbered_entries(cpu, "node")?.first().map(|(id, _)| *id))
}

// ---------------------------------------------------------------------------
// PCI devices

fn read_pci(dir: &Path) -> Result<Vec<PciDevice>, DiscoveryError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DiscoveryError::Io { path: dir.to_path_buf(), source: e }),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| DiscoveryError::Io { path: dir.to_path_buf(), source: e })?;
        let Some(address) = entry.file_name().to_str().map(str::to_string) else { continue };
        let path = entry.path();
        let numa_path = path.join("numa_node");
        // -1 (and an absent file, e.g. a dangling link) mean "no NUMA affinity".
        let numa = non_negative_u32(&numa_path, read_id(&numa_path)?)?;
        let class = read_opt(&path.join("class"))?.unwrap_or_default();
        out.push(PciDevice { address, class, numa, ..Default::default() });
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny sysfs tree written into a temp dir: `(relative path, content)` pairs.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (rel, content) in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write");
        }
        dir
    }

    /// Two CPUs, one core each, one package, no node dir.
    const BASE: &[(&str, &str)] = &[
        ("sys/devices/system/cpu/online", "0-1\n"),
        ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "0\n"),
        ("sys/devices/system/cpu/cpu0/topology/core_id", "0\n"),
        ("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "0\n"),
        ("sys/devices/system/cpu/cpu1/topology/physical_package_id", "0\n"),
        ("sys/devices/system/cpu/cpu1/topology/core_id", "1\n"),
        ("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1\n"),
        ("proc/meminfo", "MemTotal:        1024 kB\nMemFree: 10 kB\n"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = BASE.iter().copied().filter(|(p, _)| !extra.iter().any(|(q, _)| q == p)).collect();
        v.extend_from_slice(extra);
        v
    }

    /// Asserts that discovery fails with `Malformed` naming `file` and mentioning `reason`.
    fn check_malformed(extra: &[(&'static str, &'static str)], file: &str, reason: &str) {
        let dir = tree(&with(extra));
        match discover(dir.path()) {
            Err(DiscoveryError::Malformed { path, reason: r }) => {
                assert_eq!(path, dir.path().join(file), "wrong file for {extra:?}");
                assert!(r.contains(reason), "reason {r:?} lacks {reason:?}");
            }
            other => panic!("expected Malformed({file}) for {extra:?}, got {other:?}"),
        }
    }

    #[test]
    fn boot_params_read_the_kernels_cpu_lists() {
        let set = |s: &str| CpuSet::parse_list(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        // (cmdline, Ok((isolcpus, nohz_full, rcu_nocbs)) or the error's start)
        type Lists = (&'static str, &'static str, &'static str);
        let cases: &[(&str, Result<Lists, &str>)] = &[
            ("quiet", Ok(("", "", ""))),
            ("isolcpus=2-3 nohz_full=2-3 rcu_nocbs=2-3", Ok(("2-3", "2-3", "2-3"))),
            ("isolcpus=domain,managed_irq,4,6-7 quiet", Ok(("4,6-7", "", ""))),
            ("isolcpus=nohz,1", Ok(("1", "", ""))),
            ("isolcpus=1 isolcpus=2", Ok(("2", "", ""))),
            ("rcu_nocbs nohz_full=5", Ok(("", "5", ""))),
            ("root=/dev/sda -- isolcpus=1", Ok(("", "", ""))),
            ("isolcpus=x", Err("isolcpus: ")),
        ];
        for (cmdline, want) in cases {
            match (boot_params(cmdline), want) {
                (Ok(got), Ok((i, n, r))) => {
                    assert_eq!(got, BootParams { isolcpus: set(i), nohz_full: set(n), rcu_nocbs: set(r) }, "{cmdline}")
                }
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{cmdline}: {e}"),
                (got, want) => panic!("{cmdline}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_kernel_profile_is_discovered() {
        let dir = tree(&with(&[
            ("proc/cmdline", "ro isolcpus=managed_irq,1 rcu_nocbs=1 nohz_full=1,7\n"),
            ("sys/devices/system/cpu/isolated", "\n"),
            ("sys/devices/system/cpu/nohz_full", "1\n"),
            ("proc/sys/kernel/version", "#1 SMP PREEMPT_RT Debian 6.1.0-rt\n"),
            ("sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors", "performance powersave\n"),
            ("sys/devices/system/cpu/cpu0/cpuidle/state1/name", "C1\n"),
            ("sys/devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n"),
        ]));
        let k = discover(dir.path()).expect("discover").kernel;
        let one = CpuSet::single(1).expect("small id");
        assert_eq!((&k.isolated_cpus, &k.nohz_full, &k.rcu_nocbs), (&one, &one, &one), "CPU 7 is not online");
        assert!(k.realtime);
        assert_eq!(k.governors, ["performance", "powersave"]);
        assert_eq!(k.idle_states, ["POLL", "C1"]);
        assert_eq!(k.labels().get(specs::topology::KERNEL_RT_LABEL).map(String::as_str), Some("true"));
        // The base tree: nothing of it.
        let k = discover(tree(BASE).path()).expect("discover").kernel;
        assert!(k.is_empty(), "{k:?}");
        assert!(k.labels().is_empty());
        // /sys/kernel/realtime says so too.
        let dir = tree(&with(&[("sys/kernel/realtime", "1\n")]));
        assert!(discover(dir.path()).expect("discover").kernel.realtime);
        check_malformed(&[("proc/cmdline", "isolcpus=a-b\n")], "proc/cmdline", "isolcpus");
    }

    #[test]
    fn base_tree_is_one_implicit_node() {
        let dir = tree(BASE);
        let t = discover(dir.path()).expect("discover");
        assert_eq!(t.cpus.len(), 2);
        assert_eq!((t.sockets(), t.cores()), (1, 2));
        assert_eq!(t.numa_nodes.len(), 1);
        assert_eq!(t.numa_nodes[0].memory_bytes, 1024 * 1024);
        assert_eq!(t.numa_nodes[0].cpus, CpuSet::range(0, 1).expect("id within MAX_ID"));
    }

    #[test]
    fn malformed_files_name_the_file() {
        // (files added to BASE, file named in the error, words in the reason)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (&[("sys/devices/system/cpu/online", "0-x\n")], "sys/devices/system/cpu/online", "not a non-negative"),
            (&[("sys/devices/system/cpu/cpu1/online", "2\n")], "sys/devices/system/cpu/cpu1/online", "neither 0 nor 1"),
            (
                &[("sys/devices/system/cpu/cpu0/topology/physical_package_id", "zero\n")],
                "sys/devices/system/cpu/cpu0/topology/physical_package_id",
                "not an integer",
            ),
            (
                &[("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1-0\n")],
                "sys/devices/system/cpu/cpu1/topology/thread_siblings_list",
                "reversed",
            ),
            (&[("proc/meminfo", "MemTotal: lots kB\n")], "proc/meminfo", "not a number"),
            (&[("proc/meminfo", "MemFree: 1 kB\n")], "proc/meminfo", "no MemTotal"),
            (
                &[
                    ("sys/devices/system/node/node0/cpulist", "0-1\n"),
                    ("sys/devices/system/node/node0/distance", "10 20\n"),
                ],
                "sys/devices/system/node/node0/distance",
                "2 distances for 1 NUMA nodes",
            ),
            (&[("sys/devices/system/node/node0/cpumap", "zz\n")], "sys/devices/system/node/node0/cpumap", "hex word"),
            (
                &[
                    ("sys/devices/system/node/node0/cpulist", "0\n"),
                    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 12 MB\n"),
                ],
                "sys/devices/system/node/node0/meminfo",
                "unknown unit",
            ),
            (
                &[
                    ("sys/devices/system/node/node0/cpulist", "0\n"),
                    ("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", "-3\n"),
                ],
                "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
                "not a page count",
            ),
            (
                &[("sys/bus/pci/devices/0000:00:00.0/numa_node", "near\n")],
                "sys/bus/pci/devices/0000:00:00.0/numa_node",
                "not an integer",
            ),
        ];
        for (extra, file, reason) in cases {
            check_malformed(extra, file, reason);
        }
    }

    #[test]
    fn offline_and_empty_online_files() {
        // cpu1 offline by its own file; cpu0's empty online file means online.
        let dir = tree(&with(&[
            ("sys/devices/system/cpu/online", "0\n"),
            ("sys/devices/system/cpu/cpu0/online", ""),
            ("sys/devices/system/cpu/cpu1/online", "0\n"),
        ]));
        let t = discover(dir.path()).expect("discover");
        assert_eq!(t.all_cpus(), CpuSet::single(0).expect("id within MAX_ID"));
    }

    #[test]
    fn numa_from_cpu_links_when_a_node_has_no_cpulist() {
        // node1 has no cpulist/cpumap: cpu1 is placed by its `cpu1/node1` link
        // (dangling, as in the dumps; only the name matters). Without the link it
        // would be in no node.
        let dir = tree(&with(&[
            ("sys/devices/system/node/node0/cpulist", "0\n"),
            ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 4 kB\n"),
        ]));
        let link = dir.path().join("sys/devices/system/cpu/cpu1/node1");
        std::os::unix::fs::symlink("../../node/node1-gone", &link).expect("symlink");
        let t = discover(dir.path()).expect("discover");
        let numa: Vec<(u32, Option<u32>)> = t.cpus.iter().map(|c| (c.id, c.numa)).collect();
        assert_eq!(numa, vec![(0, Some(0)), (1, Some(1))]);
        assert_eq!(t.numa_nodes[1].cpus, CpuSet::single(1).expect("id within MAX_ID"));
        assert_eq!(t.numa_nodes[1].memory_bytes, 4096);
    }

    #[test]
    fn cpus_of_an_offline_node_are_in_no_node() {
        // node0 is offline, its CPU 0 is not: no online node lists it, so it is
        // local to no memory (it used to be put in node1 as if it were).
        let dir = tree(&with(&[
            ("sys/devices/system/node/online", "1\n"),
            ("sys/devices/system/node/node0/cpulist", "0\n"),
            ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 4 kB\n"),
            ("sys/devices/system/node/node1/cpulist", "1\n"),
            ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 4 kB\n"),
        ]));
        let t = discover(dir.path()).expect("discover");
        let numa: Vec<(u32, Option<u32>)> = t.cpus.iter().map(|c| (c.id, c.numa)).collect();
        assert_eq!(numa, vec![(0, None), (1, Some(1))]);
        let nodes: Vec<(u32, String)> = t.numa_nodes.iter().map(|n| (n.id, n.cpus.to_string())).collect();
        assert_eq!(nodes, vec![(1, "1".to_string())]);
        assert!(specs::validate::validate_topology(&t).is_empty(), "{:?}", specs::validate::validate_topology(&t));
        let drawn = specs::topology::draw::draw(&t, &Default::default());
        assert!(drawn.contains("no NUMA node: CPUs 0"), "{drawn}");
    }

    #[test]
    fn cpu_in_two_nodes_names_the_second_list() {
        let dir = tree(&with(&[
            ("sys/devices/system/node/node0/cpulist", "0-1\n"),
            ("sys/devices/system/node/node1/cpumap", "2\n"),
        ]));
        match discover(dir.path()) {
            Err(DiscoveryError::Malformed { path, reason }) => {
                assert_eq!(path, dir.path().join("sys/devices/system/node/node1/cpumap"));
                assert!(reason.contains("CPU 1 is also listed in node0"), "{reason}");
            }
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    /// `(cpu, core, socket)` of every CPU.
    fn layout(files: &[(&'static str, &'static str)]) -> Vec<(u32, u32, u32)> {
        let dir = tree(files);
        let t = discover(dir.path()).expect("discover");
        t.cpus.iter().map(|c| (c.id, c.core, c.socket)).collect()
    }

    #[test]
    fn cores_and_sockets_are_renumbered() {
        // (sysfs files, expected (cpu, core, socket))
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [(u32, u32, u32)]);
        let cases: &[Case] = &[
            // SMT pairs by thread_siblings even though core_id repeats; sparse package ids.
            (
                &[
                    ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "983297\n"),
                    ("sys/devices/system/cpu/cpu0/topology/core_id", "0\n"),
                    ("sys/devices/system/cpu/cpu0/topology/thread_siblings", "3\n"),
                    ("sys/devices/system/cpu/cpu1/topology/physical_package_id", "983297\n"),
                    ("sys/devices/system/cpu/cpu1/topology/core_id", "1\n"),
                    ("sys/devices/system/cpu/cpu1/topology/thread_siblings", "3\n"),
                    ("sys/devices/system/cpu/cpu2/topology/physical_package_id", "7\n"),
                    ("sys/devices/system/cpu/cpu2/topology/core_id", "0\n"),
                    ("sys/devices/system/cpu/cpu2/topology/thread_siblings", "4\n"),
                ],
                &[(0, 0, 0), (1, 0, 0), (2, 1, 1)],
            ),
            // No thread_siblings: the kernel's core_id within the package groups threads.
            (
                &[
                    ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "0\n"),
                    ("sys/devices/system/cpu/cpu0/topology/core_id", "5\n"),
                    ("sys/devices/system/cpu/cpu1/topology/physical_package_id", "1\n"),
                    ("sys/devices/system/cpu/cpu1/topology/core_id", "5\n"),
                    ("sys/devices/system/cpu/cpu2/topology/physical_package_id", "0\n"),
                    ("sys/devices/system/cpu/cpu2/topology/core_id", "5\n"),
                ],
                &[(0, 0, 0), (1, 1, 1), (2, 0, 0)],
            ),
            // Package -1 (POWER7): sockets from core_siblings.
            (
                &[
                    ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "-1\n"),
                    ("sys/devices/system/cpu/cpu0/topology/core_siblings_list", "0-1\n"),
                    ("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "0\n"),
                    ("sys/devices/system/cpu/cpu1/topology/physical_package_id", "-1\n"),
                    ("sys/devices/system/cpu/cpu1/topology/core_siblings_list", "0-1\n"),
                    ("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1\n"),
                    ("sys/devices/system/cpu/cpu2/topology/physical_package_id", "-1\n"),
                    ("sys/devices/system/cpu/cpu2/topology/core_siblings_list", "2\n"),
                    ("sys/devices/system/cpu/cpu2/topology/thread_siblings_list", "2\n"),
                ],
                &[(0, 0, 0), (1, 1, 0), (2, 2, 1)],
            ),
        ];
        for (files, want) in cases {
            let mut all = vec![("proc/meminfo", "MemTotal: 4 kB\n")];
            all.extend_from_slice(files);
            assert_eq!(layout(&all), *want, "{files:?}");
        }
    }

    #[test]
    fn missing_cpu_dir_is_an_error_naming_it() {
        let dir = tree(&[("proc/meminfo", "MemTotal: 1 kB\n")]);
        match discover(dir.path()) {
            Err(DiscoveryError::Malformed { path, .. }) => assert_eq!(path, dir.path().join("sys/devices/system/cpu")),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    /// Machines that are not tidy (issue 12, hole 8): the `distance` rows may
    /// list every *possible* node, a possible node may be offline (and may even
    /// have a stale folder), and an online node may have no CPUs, no memory, or
    /// neither. Discovery accepts each; an offline node is not part of the
    /// machine, so nothing can be placed on it.
    #[test]
    fn untidy_numa_machines_are_accepted() {
        // (what, sysfs files added to BASE, expected (node id, cpus, memory bytes, distances))
        type Node = (u32, &'static str, u64, &'static [u32]);
        type Case = (&'static str, &'static [(&'static str, &'static str)], &'static [Node]);
        let cases: &[Case] = &[
            (
                "possible 0-3, online 0-1: rows list every possible node",
                &[
                    ("sys/devices/system/node/possible", "0-3\n"),
                    ("sys/devices/system/node/online", "0-1\n"),
                    ("sys/devices/system/node/has_cpu", "0-1\n"),
                    ("sys/devices/system/node/has_memory", "0-1\n"),
                    ("sys/devices/system/node/node0/cpulist", "0\n"),
                    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 8 kB\n"),
                    ("sys/devices/system/node/node0/distance", "10 20 30 40\n"),
                    ("sys/devices/system/node/node1/cpulist", "1\n"),
                    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node1/distance", "20 10 40 30\n"),
                ],
                &[(0, "0", 8192, &[10, 20]), (1, "1", 4096, &[20, 10])],
            ),
            (
                "an offline node's stale folder is left out",
                &[
                    ("sys/devices/system/node/possible", "0-2\n"),
                    ("sys/devices/system/node/online", "0,2\n"),
                    ("sys/devices/system/node/node0/cpulist", "0-1\n"),
                    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 8 kB\n"),
                    ("sys/devices/system/node/node0/distance", "10 20 30\n"),
                    ("sys/devices/system/node/node1/cpulist", "\n"),
                    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node1/distance", "20 10 20\n"),
                    ("sys/devices/system/node/node2/cpulist", "\n"),
                    ("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node2/distance", "30 20 10\n"),
                ],
                &[(0, "0-1", 8192, &[10, 30]), (2, "", 4096, &[30, 10])],
            ),
            (
                "online nodes without CPUs, without memory, or both",
                &[
                    ("sys/devices/system/node/possible", "0-3\n"),
                    ("sys/devices/system/node/online", "0-3\n"),
                    ("sys/devices/system/node/has_cpu", "0-1\n"),
                    ("sys/devices/system/node/has_memory", "0,2\n"),
                    ("sys/devices/system/node/node0/cpulist", "0\n"),
                    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 8 kB\n"),
                    ("sys/devices/system/node/node0/distance", "10 20 20 20\n"),
                    // CPUs, no memory.
                    ("sys/devices/system/node/node1/cpulist", "1\n"),
                    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 0 kB\n"),
                    ("sys/devices/system/node/node1/distance", "20 10 20 20\n"),
                    // Memory, no CPUs.
                    ("sys/devices/system/node/node2/cpulist", "\n"),
                    ("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node2/distance", "20 20 10 20\n"),
                    // Neither (and no meminfo at all).
                    ("sys/devices/system/node/node3/cpulist", "\n"),
                    ("sys/devices/system/node/node3/distance", "20 20 20 10\n"),
                ],
                &[
                    (0, "0", 8192, &[10, 20, 20, 20]),
                    (1, "1", 0, &[20, 10, 20, 20]),
                    (2, "", 4096, &[20, 20, 10, 20]),
                    (3, "", 0, &[20, 20, 20, 10]),
                ],
            ),
            (
                "has_memory has the last word over a stale meminfo",
                &[
                    ("sys/devices/system/node/online", "0-1\n"),
                    ("sys/devices/system/node/has_memory", "0\n"),
                    ("sys/devices/system/node/node0/cpulist", "0\n"),
                    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 8 kB\n"),
                    ("sys/devices/system/node/node1/cpulist", "1\n"),
                    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 4 kB\n"),
                ],
                &[(0, "0", 8192, &[]), (1, "1", 0, &[])],
            ),
        ];
        for (what, extra, want) in cases {
            let dir = tree(&with(extra));
            let t = discover(dir.path()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got: Vec<(u32, String, u64, Vec<u32>)> =
                t.numa_nodes.iter().map(|n| (n.id, n.cpus.to_string(), n.memory_bytes, n.distances.clone())).collect();
            let want: Vec<(u32, String, u64, Vec<u32>)> =
                want.iter().map(|(id, cpus, mem, d)| (*id, cpus.to_string(), *mem, d.to_vec())).collect();
            assert_eq!(got, want, "{what}");
            let problems = specs::validate::validate_topology(&t);
            assert!(problems.is_empty(), "{what}: the discovered machine does not validate: {problems:?}");
        }
    }

    /// Four CPUs in two L3 groups per the `cache/index*` files of each.
    #[test]
    fn uncore_cache_groups() {
        const L3: &str = "sys/devices/system/cpu/cpu";
        fn cache(cpu: u32, index: u32, file: &str, content: &str) -> (String, String) {
            (format!("{L3}{cpu}/cache/index{index}/{file}"), content.to_string())
        }
        fn four_cpus() -> Vec<(String, String)> {
            let mut files = vec![("proc/meminfo".to_string(), "MemTotal: 4 kB\n".to_string())];
            for cpu in 0..4 {
                files.push((format!("{L3}{cpu}/topology/physical_package_id"), "0\n".into()));
                files.push((format!("{L3}{cpu}/topology/thread_siblings_list"), format!("{cpu}\n")));
                // An L2 of its own on index2: never taken for the L3.
                files.push(cache(cpu, 2, "level", "2\n"));
                files.push(cache(cpu, 2, "type", "Unified\n"));
                files.push(cache(cpu, 2, "shared_cpu_list", &format!("{cpu}\n")));
            }
            files
        }
        // (what, files added to four CPUs, expected uncore_cache of CPUs 0..4)
        type Case = (&'static str, Vec<(String, String)>, [Option<u32>; 4]);
        let l3_of_all = |f: &dyn Fn(u32) -> Vec<(String, String)>| (0..4).flat_map(f).collect::<Vec<_>>();
        let cases: Vec<Case> = vec![
            ("no L3 described", vec![], [None; 4]),
            (
                "lists: 0,2 and 1,3, numbered by lowest CPU",
                l3_of_all(&|c| {
                    vec![
                        cache(c, 3, "level", "3\n"),
                        cache(c, 3, "type", "Unified\n"),
                        cache(c, 3, "shared_cpu_list", if c % 2 == 0 { "0,2\n" } else { "1,3\n" }),
                    ]
                }),
                [Some(0), Some(1), Some(0), Some(1)],
            ),
            (
                "masks naming offline CPUs 4-7 too; a Data L3 after an Instruction one",
                l3_of_all(&|c| {
                    vec![
                        cache(c, 3, "level", "3\n"),
                        cache(c, 3, "type", "Instruction\n"),
                        cache(c, 3, "shared_cpu_map", "ff\n"),
                        cache(c, 4, "level", "3\n"),
                        cache(c, 4, "type", "Data\n"),
                        cache(c, 4, "shared_cpu_map", if c < 2 { "00000000,00000033\n" } else { "cc\n" }),
                    ]
                }),
                [Some(0), Some(0), Some(1), Some(1)],
            ),
            (
                "only CPU 3 describes its L3",
                vec![cache(3, 3, "level", "3\n"), cache(3, 3, "shared_cpu_list", "0-3\n")],
                [None, None, None, Some(0)],
            ),
        ];
        for (what, extra, want) in cases {
            let mut files = four_cpus();
            files.extend(extra);
            let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
            let dir = tree(&files);
            let t = discover(dir.path()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got: Vec<Option<u32>> = t.cpus.iter().map(|c| c.uncore_cache).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn malformed_cache_files_name_the_file() {
        const LEVEL: &str = "sys/devices/system/cpu/cpu1/cache/index3/level";
        const TYPE: &str = "sys/devices/system/cpu/cpu1/cache/index3/type";
        const SHARED: &str = "sys/devices/system/cpu/cpu1/cache/index3/shared_cpu_list";
        let good = [(LEVEL, "3\n"), (TYPE, "Unified\n"), (SHARED, "0-1\n")];
        // (file replaced, its content, words in the reason)
        let cases: &[(&'static str, &'static str, &str)] = &[
            (LEVEL, "three\n", "not a cache level"),
            (TYPE, "Victim\n", "not Data, Instruction or Unified"),
            (SHARED, "1-0\n", "reversed"),
        ];
        for (file, content, reason) in cases {
            let mut extra: Vec<(&'static str, &'static str)> =
                good.iter().copied().filter(|(p, _)| p != file).collect();
            extra.push((file, content));
            check_malformed(&extra, file, reason);
        }
    }

    #[test]
    fn memory_only_nodes() {
        // (what, node2's files, whether node2 is memory-only)
        type Case<'a> = (&'a str, &'a [(&'static str, &'static str)], NumaKind);
        let cases: &[Case] = &[
            (
                "memory, no CPUs",
                &[("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 4 kB\n")],
                NumaKind::MemoryOnly,
            ),
            (
                "neither CPUs nor memory",
                &[("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 0 kB\n")],
                NumaKind::CpusAndMemory,
            ),
            (
                "its CPU is offline (present, listed nowhere online)",
                &[
                    ("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node2/cpulist", "2\n"),
                    ("sys/devices/system/cpu/cpu2/online", "0\n"),
                    ("sys/devices/system/cpu/cpu2/topology/physical_package_id", "0\n"),
                ],
                NumaKind::MemoryOnly,
            ),
            (
                "memory and a CPU",
                &[
                    ("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 4 kB\n"),
                    ("sys/devices/system/node/node2/cpulist", "2\n"),
                    ("sys/devices/system/cpu/online", "0-2\n"),
                    ("sys/devices/system/cpu/cpu2/topology/physical_package_id", "0\n"),
                ],
                NumaKind::CpusAndMemory,
            ),
        ];
        for (what, node2, want) in cases {
            let mut extra = vec![
                ("sys/devices/system/node/node0/cpulist", "0-1\n"),
                ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 8 kB\n"),
            ];
            extra.extend_from_slice(node2);
            let dir = tree(&with(&extra));
            let t = discover(dir.path()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let kinds: Vec<(u32, NumaKind)> = t.numa_nodes.iter().map(|n| (n.id, n.kind)).collect();
            assert_eq!(kinds, vec![(0, NumaKind::CpusAndMemory), (2, *want)], "{what}");
        }
    }

    #[test]
    fn pci_numa_minus_one_is_none_and_cpu_less_node_kept() {
        let dir = tree(&with(&[
            ("sys/devices/system/node/node0/cpulist", "0-1\n"),
            ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:  2048 kB\n"),
            ("sys/devices/system/node/node0/distance", "10 20\n"),
            ("sys/devices/system/node/node3/cpulist", "\n"),
            ("sys/devices/system/node/node3/distance", "20 10\n"),
            ("sys/bus/pci/devices/0000:00:01.0/numa_node", "-1\n"),
            ("sys/bus/pci/devices/0000:00:01.0/class", "0x020000\n"),
            ("sys/bus/pci/devices/0000:00:02.0/numa_node", "3\n"),
        ]));
        let t = discover(dir.path()).expect("discover");
        assert_eq!(t.numa_ids().to_vec(), vec![0, 3]);
        assert!(t.numa_nodes[1].cpus.is_empty());
        assert_eq!(t.numa_nodes[0].memory_bytes, 2048 * 1024);
        assert_eq!(t.distance(0, 3), 20);
        assert_eq!(
            t.devices,
            vec![
                PciDevice {
                    address: "0000:00:01.0".into(),
                    class: "0x020000".into(),
                    numa: None,
                    ..Default::default()
                },
                PciDevice { address: "0000:00:02.0".into(), class: String::new(), numa: Some(3), ..Default::default() },
            ]
        );
    }
}
