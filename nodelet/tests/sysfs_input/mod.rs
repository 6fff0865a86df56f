//! The sysfs fuzz target's input format, shared by `fuzz/fuzz_targets/sysfs.rs`
//! (through `#[path]`) and the regression tests, so that a kept crash input means
//! the same tree in both: a flags byte, then file contents separated by NUL bytes
//! in the order of [`files`]. A content of exactly `\x01`, or none (the input
//! ended), leaves the file out. Flags: bit 0 leaves out `sys/devices/system/node`
//! (the non-NUMA path through `proc/meminfo`), bit 1 the PCI folder, bit 2
//! cpu3's `topology/` (an offline CPU on old kernels). `fuzz/seeds.py` writes
//! seeds in this format from the captured machines.

use std::path::Path;

const CPUS: u32 = 4;
const NODES: u32 = 2;
const CPU_FILES: [&str; 8] = [
    "online",
    "topology/physical_package_id",
    "topology/die_id",
    "topology/core_id",
    "topology/thread_siblings_list",
    "topology/thread_siblings",
    "topology/core_siblings_list",
    "topology/core_siblings",
];
const NODE_FILES: [&str; 5] = ["cpulist", "cpumap", "meminfo", "distance", "hugepages/hugepages-2048kB/nr_hugepages"];
const OTHER_FILES: [&str; 4] = [
    "proc/meminfo",
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
    "sys/bus/pci/devices/0000:00:01.0/numa_node",
    "sys/bus/pci/devices/0000:00:01.0/class",
];

/// Every file the input can fill, relative to the root, in input order.
pub fn files() -> Vec<String> {
    let mut v = vec!["sys/devices/system/cpu/online".to_string(), "sys/devices/system/cpu/present".to_string()];
    for c in 0..CPUS {
        v.extend(CPU_FILES.iter().map(|f| format!("sys/devices/system/cpu/cpu{c}/{f}")));
    }
    for n in 0..NODES {
        v.extend(NODE_FILES.iter().map(|f| format!("sys/devices/system/node/node{n}/{f}")));
    }
    v.extend(OTHER_FILES.iter().map(|f| f.to_string()));
    v
}

/// Writes the tree `data` describes under `root`, which must not exist yet
/// (what one input created must not leak into the next).
pub fn write_tree(root: &Path, files: &[String], data: &[u8]) -> std::io::Result<()> {
    let (flags, rest) = data.split_first().map_or((0, &[][..]), |(f, r)| (*f, r));
    let mut chunks = rest.split(|b| *b == 0);
    for file in files {
        let content = chunks.next();
        let skip = (flags & 1 != 0 && file.starts_with("sys/devices/system/node/"))
            || (flags & 2 != 0 && file.starts_with("sys/bus/pci/"))
            || (flags & 4 != 0 && file.starts_with("sys/devices/system/cpu/cpu3/topology/"));
        if skip {
            continue;
        }
        let path = root.join(file);
        if let Some(parent) = path.parent() {
            // cpuN/topology/ exists even when all its files are left out.
            std::fs::create_dir_all(parent)?;
        }
        match content {
            Some(c) if c != [1] => std::fs::write(&path, c)?,
            _ => {}
        }
    }
    Ok(())
}
