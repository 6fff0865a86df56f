//! A machine drawn as text: sockets, their NUMA nodes (memory, hugepages), the cores
//! of each node with their sibling threads, the L3 (uncore cache) groups, reserved
//! CPUs and which pod holds which CPU. `pinion discover -o text` and `pinion
//! topology` print it.
//!
//! Cores are laid out several per line (`core 0: [0 56]`), grouped per socket and
//! NUMA node, so a 112-CPU machine fits a screen. A NUMA node spanning several
//! sockets appears under each (marked "continued"); a socket spanning several NUMA
//! nodes lists each. Each block of cores is followed by the L3 groups its CPUs
//! belong to (`L3: 0-7 | 8-15`, each group's CPUs in full). Memory-only nodes are
//! listed after the others. Pure: the same topology gives the same text.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::idset::CpuSet;
use crate::topology::{HugePages, NodeTopology, NumaKind};

/// Line width the core grid wraps at.
const WIDTH: usize = 100;
/// Largest node count whose distance matrix is drawn in full.
const MAX_MATRIX: usize = 24;

/// Core id -> its threads, for one socket and NUMA node (layout is socket -> numa -> cores).
type Cores = BTreeMap<u32, Vec<u32>>;

/// Draws `topology`; `holders` maps CPU id -> the pod holding it (may be empty).
pub fn draw(topology: &NodeTopology, holders: &BTreeMap<u32, String>) -> String {
    let mut out = String::new();
    let t = topology;
    let l3 = l3_groups(t);
    let memory_only = t.numa_nodes.iter().filter(|n| n.kind == NumaKind::MemoryOnly).count();
    let _ = write!(
        out,
        "machine: {} socket{}, {} NUMA node{}{}, {} core{}, {} CPU{}",
        t.sockets(),
        plural(t.sockets()),
        t.numa_nodes.len(),
        plural(t.numa_nodes.len()),
        if memory_only > 0 { format!(" ({memory_only} memory-only)") } else { String::new() },
        t.cores(),
        plural(t.cores()),
        t.cpus.len(),
        plural(t.cpus.len()),
    );
    if !l3.is_empty() {
        let _ = write!(out, ", {} L3 group{}", l3.len(), plural(l3.len()));
    }
    out.push('\n');
    if !t.reserved_cpus.is_empty() {
        let _ = writeln!(out, "reserved CPUs (marked *): {}", t.reserved_cpus);
    }

    // Pods get short keys (a, b, ..., z, aa, ...) in order of name.
    let mut pods: Vec<&str> = holders.values().map(String::as_str).collect();
    pods.sort_unstable();
    pods.dedup();
    let keys: BTreeMap<&str, String> = pods.iter().enumerate().map(|(i, p)| (*p, pod_key(i))).collect();
    if !pods.is_empty() {
        let legend: Vec<String> = pods.iter().map(|p| format!("{}={}", keys[p], p)).collect();
        let _ = writeln!(out, "pods (CPU suffix): {}", legend.join(", "));
    }

    let mut layout: BTreeMap<u32, BTreeMap<Option<u32>, Cores>> = BTreeMap::new();
    for c in &t.cpus {
        layout.entry(c.socket).or_default().entry(c.numa).or_default().entry(c.core).or_default().push(c.id);
    }
    let cell = |core: &u32, threads: &Vec<u32>| {
        let threads: Vec<String> = threads.iter().map(|id| cpu_label(t, *id, holders, &keys)).collect();
        format!("core {core}: [{}]", threads.join(" "))
    };
    // One cell width for the whole machine, so the columns line up across nodes.
    let width = layout
        .values()
        .flat_map(|nodes| nodes.values())
        .flat_map(|cores| cores.iter().map(|(core, threads)| cell(core, threads).len()))
        .max()
        .unwrap_or(0);
    // Machines with many small sockets per NUMA node (Itanium, POWER7: one or two
    // cores a package) read better NUMA-first, one line per socket.
    let numa_nodes_with_cpus = t.numa_nodes.iter().filter(|n| !n.cpus.is_empty()).count();
    let numa_first = layout.len() > numa_nodes_with_cpus && layout.values().all(|nodes| nodes.len() == 1);
    if numa_first {
        let mut by_numa: BTreeMap<Option<u32>, Vec<(u32, &Cores)>> = BTreeMap::new();
        for (socket, nodes) in &layout {
            for (numa, cores) in nodes {
                by_numa.entry(*numa).or_default().push((*socket, cores));
            }
        }
        let label_width = layout.keys().map(|s| format!("socket {s}:").len()).max().unwrap_or(0);
        for (numa, sockets) in by_numa {
            let _ = writeln!(out, "{}", node_header(t, numa, false));
            for (socket, cores) in sockets {
                let cells: Vec<String> = cores.iter().map(|(core, threads)| cell(core, threads)).collect();
                let label = format!("  {:<label_width$}  ", format!("socket {socket}:"));
                grid_labelled(&mut out, &label, width, &cells);
            }
            let cpus = match numa {
                Some(id) => t.numa_node(id).map(|n| n.cpus.clone()).unwrap_or_default(),
                None => unplaced(t),
            };
            l3_line(&mut out, "  ", &l3, &cpus);
        }
    } else {
        let mut drawn_nodes: BTreeMap<Option<u32>, ()> = BTreeMap::new();
        for (socket, nodes) in &layout {
            let cpus: usize = nodes.values().flat_map(|cores| cores.values()).map(Vec::len).sum();
            let cores: usize = nodes.values().map(BTreeMap::len).sum();
            let _ = writeln!(out, "socket {socket}: {cores} core{}, {cpus} CPU{}", plural(cores), plural(cpus));
            for (numa, cores) in nodes {
                let continued = drawn_nodes.insert(*numa, ()).is_some();
                let _ = writeln!(out, "  {}", node_header(t, *numa, continued));
                let cells: Vec<String> = cores.iter().map(|(core, threads)| cell(core, threads)).collect();
                grid_labelled(&mut out, "    ", width, &cells);
                let cpus = CpuSet::from_ids(cores.values().flatten().copied()).unwrap_or_default();
                l3_line(&mut out, "    ", &l3, &cpus);
            }
        }
    }
    for n in t.numa_nodes.iter().filter(|n| n.cpus.is_empty()) {
        let what = if n.kind == NumaKind::MemoryOnly { "memory only" } else { "no CPUs" };
        let _ = writeln!(out, "{} ({what})", node_header(t, Some(n.id), false));
    }

    distances(&mut out, t);
    if !t.devices.is_empty() {
        let mut per_node: BTreeMap<Option<u32>, usize> = BTreeMap::new();
        for d in &t.devices {
            *per_node.entry(d.numa).or_default() += 1;
        }
        let parts: Vec<String> = per_node
            .iter()
            .map(|(n, count)| match n {
                Some(n) => format!("numa {n}: {count}"),
                None => format!("no node: {count}"),
            })
            .collect();
        let _ = writeln!(out, "PCI devices: {} ({})", t.devices.len(), parts.join(", "));
    }
    offered(&mut out, t);
    out
}

/// The devices offered to pods, by resource then address: NUMA node, DRA
/// locality (`numaNode`) and device nodes.
fn offered(out: &mut String, t: &NodeTopology) {
    let mut rows: Vec<[String; 5]> = t
        .devices
        .iter()
        .filter_map(|d| {
            let list = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join(",") };
            Some([
                d.resource.clone()?,
                d.address.clone(),
                d.numa.map_or_else(|| "-".to_string(), |n| n.to_string()),
                format!("[{}]", d.numa_node.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
                list(d.device_nodes.iter().map(|p| p.display().to_string()).collect()),
            ])
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort();
    rows.insert(0, ["RESOURCE", "ADDRESS", "NUMA", "NUMANODE", "DEVICE NODES"].map(String::from));
    let widths: Vec<usize> = (0..4).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let _ = writeln!(out, "devices offered:");
    for r in &rows {
        let _ = writeln!(
            out,
            "  {:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
    }
}

/// The L3 groups with their CPUs, by group number.
fn l3_groups(t: &NodeTopology) -> BTreeMap<u32, CpuSet> {
    let mut groups: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for c in &t.cpus {
        if let Some(g) = c.uncore_cache {
            // A CPU id beyond MAX_ID is refused by validation on the way in.
            let _ = groups.entry(g).or_default().insert(c.id);
        }
    }
    groups
}

/// `L3: 0-7 | 8-15`: the groups holding any of `cpus`, each in full (a group
/// wider than the block shows it), wrapped at `WIDTH`.
fn l3_line(out: &mut String, indent: &str, groups: &BTreeMap<u32, CpuSet>, cpus: &CpuSet) {
    let parts: Vec<String> = groups.values().filter(|g| !g.is_disjoint(cpus)).map(ToString::to_string).collect();
    if parts.is_empty() {
        return;
    }
    let mut line = format!("{indent}L3: ");
    let continuation = " ".repeat(line.len());
    for (i, part) in parts.iter().enumerate() {
        let sep = if i == 0 { "" } else { " | " };
        // Room kept for the " |" that ends a wrapped line.
        if i > 0 && line.len() + sep.len() + part.len() + 2 > WIDTH {
            let _ = writeln!(out, "{} |", line);
            line = format!("{continuation}{part}");
        } else {
            line.push_str(sep);
            line.push_str(part);
        }
    }
    let _ = writeln!(out, "{line}");
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `a`..`z`, `aa`, `ab`, ... (bijective base 26).
fn pod_key(mut i: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

fn cpu_label(t: &NodeTopology, id: u32, holders: &BTreeMap<u32, String>, keys: &BTreeMap<&str, String>) -> String {
    let mut s = id.to_string();
    if t.reserved_cpus.contains(id) {
        s.push('*');
    }
    if let Some(key) = holders.get(&id).and_then(|p| keys.get(p.as_str())) {
        s.push_str(key);
    }
    s
}

/// The online CPUs no online node lists.
fn unplaced(t: &NodeTopology) -> CpuSet {
    CpuSet::from_ids(t.cpus.iter().filter(|c| c.numa.is_none()).map(|c| c.id)).unwrap_or_default()
}

fn node_header(t: &NodeTopology, id: Option<u32>, continued: bool) -> String {
    let Some(id) = id else {
        return format!(
            "no NUMA node: CPUs {} (no online node lists them; never in an aligned placement)",
            unplaced(t)
        );
    };
    let Some(n) = t.numa_node(id) else { return format!("numa {id}: (unknown node)") };
    if continued {
        return format!("numa {id} (continued)");
    }
    let mut s = format!("numa {id}: {}", bytes(n.memory_bytes));
    let pages: Vec<String> = n
        .hugepages
        .iter()
        .filter(|h| h.total > 0)
        .map(|h: &HugePages| format!("{} x {}", h.total, bytes(h.page_size_bytes)))
        .collect();
    if !pages.is_empty() {
        let _ = write!(s, ", hugepages {}", pages.join(", "));
    }
    if !n.cpus.is_empty() {
        let _ = write!(s, ", CPUs {}", n.cpus);
        let reserved: CpuSet = n.cpus.intersection(&t.reserved_cpus);
        if !reserved.is_empty() {
            let _ = write!(s, " (reserved {reserved})");
        }
    }
    s
}

/// `45.7 GiB`, `512 MiB`, `64 KiB`: binary units, one decimal where not whole.
fn bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            let tenths = (u128::from(b) * 10 + u128::from(size) / 2) / u128::from(size);
            return if tenths % 10 == 0 {
                format!("{} {unit}", tenths / 10)
            } else {
                format!("{}.{} {unit}", tenths / 10, tenths % 10)
            };
        }
    }
    format!("{b} B")
}

/// Cells padded to one width, as many per line as fit in `WIDTH`; the first line
/// starts with `label`, the others with as many spaces.
fn grid_labelled(out: &mut String, label: &str, width: usize, cells: &[String]) {
    let per_line = (WIDTH.saturating_sub(label.len()) / (width + 2)).max(1);
    let indent = " ".repeat(label.len());
    for (i, row) in cells.chunks(per_line).enumerate() {
        let line: Vec<String> = row.iter().map(|c| format!("{c:<width$}")).collect();
        let prefix = if i == 0 { label } else { indent.as_str() };
        let _ = writeln!(out, "{prefix}{}", line.join("  ").trim_end());
    }
}

fn distances(out: &mut String, t: &NodeTopology) {
    let n = t.numa_nodes.len();
    if n < 2 || t.numa_nodes.iter().any(|node| node.distances.len() != n) {
        return;
    }
    if n > MAX_MATRIX {
        let all = t.numa_nodes.iter().flat_map(|node| node.distances.iter().copied());
        let (lo, hi) = all.fold((u32::MAX, 0), |(lo, hi), d| (lo.min(d), hi.max(d)));
        let _ = writeln!(out, "NUMA distances: {n} x {n}, from {lo} to {hi} (see -o json)");
        return;
    }
    let _ = writeln!(out, "NUMA distances:");
    let mut header = String::from("      ");
    for node in &t.numa_nodes {
        let _ = write!(header, "{:>4}", node.id);
    }
    let _ = writeln!(out, "{header}");
    for node in &t.numa_nodes {
        let mut row = format!("  {:>4}", node.id);
        for d in &node.distances {
            let _ = write!(row, "{d:>4}");
        }
        let _ = writeln!(out, "{row}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Cpu, NumaNode};

    /// 2 sockets x 1 NUMA x `cores` cores x 2 threads; sibling of N is N + total/2.
    fn machine(cores: u32) -> NodeTopology {
        let total = cores * 4;
        let half = total / 2;
        let mut cpus: Vec<Cpu> = (0..total)
            .map(|id| {
                let core = id % half;
                let socket = core / cores;
                Cpu { id, core, socket, die: None, numa: Some(socket), uncore_cache: None }
            })
            .collect();
        cpus.sort_by_key(|c| c.id);
        let numa_nodes = (0..2)
            .map(|n| NumaNode {
                kind: Default::default(),
                id: n,
                cpus: CpuSet::from_ids(cpus.iter().filter(|c| c.numa == Some(n)).map(|c| c.id)).expect("small ids"),
                memory_bytes: 64 << 30,
                distances: if n == 0 { vec![10, 21] } else { vec![21, 10] },
                hugepages: vec![HugePages { page_size_bytes: 2 << 20, total: 1024 }],
            })
            .collect();
        NodeTopology { cpus, numa_nodes, devices: vec![], reserved_cpus: CpuSet::new(), kernel: Default::default() }
    }

    #[test]
    fn small_machine_exact_text() {
        let mut t = machine(2);
        t.reserved_cpus = CpuSet::from_ids([0, 4]).expect("small ids");
        let holders = BTreeMap::from([(1, "web".to_string()), (5, "web".to_string()), (3, "db".to_string())]);
        let want = "\
machine: 2 sockets, 2 NUMA nodes, 4 cores, 8 CPUs
reserved CPUs (marked *): 0,4
pods (CPU suffix): a=db, b=web
socket 0: 2 cores, 4 CPUs
  numa 0: 64 GiB, hugepages 1024 x 2 MiB, CPUs 0-1,4-5 (reserved 0,4)
    core 0: [0* 4*]  core 1: [1b 5b]
socket 1: 2 cores, 4 CPUs
  numa 1: 64 GiB, hugepages 1024 x 2 MiB, CPUs 2-3,6-7
    core 2: [2 6]    core 3: [3a 7]
NUMA distances:
         0   1
     0  10  21
     1  21  10
";
        assert_eq!(draw(&t, &holders), want);
    }

    #[test]
    fn a_112_cpu_machine_fits_the_width_and_shows_every_cpu() {
        let t = machine(28);
        let text = draw(&t, &BTreeMap::new());
        assert!(text.lines().all(|l| l.len() <= WIDTH), "{text}");
        assert!(text.lines().count() < 30, "{} lines:\n{text}", text.lines().count());
        assert!(text.contains("core 0: [0 56]"), "{text}");
        assert!(text.contains("core 55: [55 111]"), "{text}");
        // An L3 per core (POWER-like): 56 groups, wrapped, each shown once.
        let mut t = t;
        for c in &mut t.cpus {
            c.uncore_cache = Some(c.core);
        }
        let text = draw(&t, &BTreeMap::new());
        assert!(text.lines().all(|l| l.len() <= WIDTH), "{text}");
        assert!(text.lines().count() < 40, "{} lines:\n{text}", text.lines().count());
        assert!(text.starts_with("machine: 2 sockets, 2 NUMA nodes, 56 cores, 112 CPUs, 56 L3 groups\n"), "{text}");
        assert!(text.contains("    L3: 0,56 | 1,57 | "), "{text}");
        assert!(text.contains(" | 55,111\n"), "{text}");
    }

    #[test]
    fn l3_groups_under_their_node() {
        // One L3 per socket on the small machine; then two per node (AMD CCXs).
        let mut t = machine(2);
        for c in &mut t.cpus {
            c.uncore_cache = Some(c.socket);
        }
        let want = "\
machine: 2 sockets, 2 NUMA nodes, 4 cores, 8 CPUs, 2 L3 groups
socket 0: 2 cores, 4 CPUs
  numa 0: 64 GiB, hugepages 1024 x 2 MiB, CPUs 0-1,4-5
    core 0: [0 4]  core 1: [1 5]
    L3: 0-1,4-5
socket 1: 2 cores, 4 CPUs
  numa 1: 64 GiB, hugepages 1024 x 2 MiB, CPUs 2-3,6-7
    core 2: [2 6]  core 3: [3 7]
    L3: 2-3,6-7
NUMA distances:
         0   1
     0  10  21
     1  21  10
";
        assert_eq!(draw(&t, &BTreeMap::new()), want);
        for c in &mut t.cpus {
            c.uncore_cache = Some(c.core);
        }
        let text = draw(&t, &BTreeMap::new());
        assert!(text.contains("    core 0: [0 4]  core 1: [1 5]\n    L3: 0,4 | 1,5\n"), "{text}");
    }

    fn cpu(id: u32, socket: u32, numa: u32) -> Cpu {
        Cpu { id, core: id, socket, die: None, numa: Some(numa), uncore_cache: None }
    }

    fn node(id: u32, cpus: &str, memory_bytes: u64) -> NumaNode {
        let cpus = CpuSet::parse_list(cpus).unwrap_or_default();
        NumaNode { kind: Default::default(), id, cpus, memory_bytes, distances: vec![], hugepages: vec![] }
    }

    #[test]
    fn sockets_inside_numa_nodes_are_drawn_numa_first() {
        // One NUMA node over two one-core sockets (Itanium, POWER7 style), plus a
        // memory-only node.
        let t = NodeTopology {
            cpus: vec![cpu(0, 0, 0), cpu(1, 1, 0)],
            numa_nodes: vec![
                node(0, "0-1", 3 << 29),
                NumaNode { kind: NumaKind::MemoryOnly, ..node(1, "", 1 << 30) },
                node(2, "", 0),
            ],
            devices: vec![],
            reserved_cpus: CpuSet::new(),
            kernel: Default::default(),
        };
        let want = "\
machine: 2 sockets, 3 NUMA nodes (1 memory-only), 2 cores, 2 CPUs
numa 0: 1.5 GiB, CPUs 0-1
  socket 0:  core 0: [0]
  socket 1:  core 1: [1]
numa 1: 1 GiB (memory only)
numa 2: 0 B (no CPUs)
";
        assert_eq!(draw(&t, &BTreeMap::new()), want);
    }

    #[test]
    fn a_numa_node_spanning_sockets_is_continued() {
        // Socket 0 holds nodes 0 and 1; node 1 also covers socket 1.
        let t = NodeTopology {
            cpus: vec![cpu(0, 0, 0), cpu(1, 0, 1), cpu(2, 1, 1)],
            numa_nodes: vec![node(0, "0", 1 << 30), node(1, "1-2", 1 << 30)],
            devices: vec![],
            reserved_cpus: CpuSet::new(),
            kernel: Default::default(),
        };
        let want = "\
machine: 2 sockets, 2 NUMA nodes, 3 cores, 3 CPUs
socket 0: 2 cores, 2 CPUs
  numa 0: 1 GiB, CPUs 0
    core 0: [0]
  numa 1: 1 GiB, CPUs 1-2
    core 1: [1]
socket 1: 1 core, 1 CPU
  numa 1 (continued)
    core 2: [2]
";
        assert_eq!(draw(&t, &BTreeMap::new()), want);
    }

    #[test]
    fn offered_devices_are_listed_with_their_locality() {
        use crate::topology::PciDevice;
        let mut t = machine(1);
        let dev = |address: &str, numa: Option<u32>, resource: Option<&str>, nodes: &[&str]| PciDevice {
            address: address.into(),
            class: "0x030200".into(),
            numa,
            resource: resource.map(String::from),
            device_nodes: nodes.iter().map(std::path::PathBuf::from).collect(),
            numa_node: Vec::new(),
            netdev: None,
        };
        t.devices = vec![
            dev("0000:86:00.0", Some(1), Some("nvidia.com/gpu"), &["/dev/nvidia1", "/dev/nvidiactl"]),
            dev("0000:3b:00.0", Some(0), Some("nvidia.com/gpu"), &["/dev/nvidia0", "/dev/nvidiactl"]),
            dev("0000:5e:02.1", None, Some("pinion.io/sriov-vf-ens1f0"), &[]),
            dev("0000:00:00.0", Some(0), None, &[]),
        ];
        t.set_device_locality();
        let text = draw(&t, &BTreeMap::new());
        let want = "\
PCI devices: 4 (no node: 1, numa 0: 2, numa 1: 1)
devices offered:
  RESOURCE                   ADDRESS       NUMA  NUMANODE  DEVICE NODES
  nvidia.com/gpu             0000:3b:00.0  0     [0]       /dev/nvidia0,/dev/nvidiactl
  nvidia.com/gpu             0000:86:00.0  1     [1]       /dev/nvidia1,/dev/nvidiactl
  pinion.io/sriov-vf-ens1f0  0000:5e:02.1  -     []        -
";
        assert!(text.ends_with(want), "{text}");
    }

    #[test]
    fn units_and_keys() {
        let cases: &[(u64, &str)] =
            &[(0, "0 B"), (1023, "1023 B"), (64 << 10, "64 KiB"), (47_925_628 << 10, "45.7 GiB")];
        for (b, want) in cases {
            assert_eq!(bytes(*b), *want);
        }
        assert_eq!([pod_key(0), pod_key(25), pod_key(26), pod_key(27)], ["a", "z", "aa", "ab"]);
    }
}
