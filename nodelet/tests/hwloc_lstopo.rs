//! hwloc XML against sysfs: for every machine in `e2e/fixtures/sysfs`, Debian's
//! `lstopo` (package `hwloc-nox`, installed by `e2e/host-setup.sh`) turns the
//! extracted tree into XML, and Pinion's topology from that XML must equal its
//! topology from the same tree: CPUs (id, core, socket, NUMA node, L3 group),
//! NUMA nodes (kind, CPUs, memory, distances, huge pages) and PCI devices with
//! their node. Where hwloc and the kernel's files legitimately disagree, exactly
//! that aspect is normalised below, with the reason.
//!
//! Fails, never skips, when `lstopo-no-graphics` is missing.

mod sysfs_fixtures;

use std::path::Path;
use std::process::Command;

use nodelet::discovery::discover;
use specs::NodeTopology;

/// hwloc's own view of the tree under `root`, as XML. `--whole-io` keeps every
/// PCI function (lstopo's default keeps only "important" ones), as sysfs
/// discovery does; `linux,stop` reads only the tree, never this host's CPUID.
fn lstopo(root: &Path) -> String {
    let out = Command::new("lstopo-no-graphics")
        .args(["--of", "xml", "--whole-io"])
        .env("HWLOC_COMPONENTS", "linux,stop")
        .env("HWLOC_FSROOT", root)
        .output()
        .unwrap_or_else(|e| {
            panic!("running lstopo-no-graphics: {e} (install Debian's hwloc-nox: bash e2e/host-setup.sh)")
        });
    assert!(out.status.success(), "lstopo on {}: {}", root.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("lstopo writes UTF-8")
}

/// (id, kind, cpus, memory bytes, distances, huge pages (size, total))
type Numa = (u32, String, String, u64, Vec<u32>, Vec<(u64, u64)>);

/// (id, core, socket, numa, uncore_cache)
type CpuRow = (u32, u32, u32, Option<u32>, Option<u32>);

/// The fields the two sources must agree on, in a form whose `Debug` diff reads well.
#[derive(Debug, PartialEq, Eq)]
struct View {
    cpus: Vec<CpuRow>,
    numa: Vec<Numa>,
    /// (address, class, numa)
    devices: Vec<(String, String, Option<u32>)>,
}

fn view(t: &NodeTopology) -> View {
    View {
        cpus: t.cpus.iter().map(|c| (c.id, c.core, c.socket, c.numa, c.uncore_cache)).collect(),
        numa: t
            .numa_nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    format!("{:?}", n.kind),
                    n.cpus.to_string(),
                    n.memory_bytes,
                    n.distances.clone(),
                    n.hugepages.iter().map(|h| (h.page_size_bytes, h.total)).collect(),
                )
            })
            .collect(),
        devices: t.devices.iter().map(|d| (d.address.clone(), d.class.clone(), d.numa)).collect(),
    }
}

fn read(root: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(root.join(rel)).ok().map(|s| s.trim().to_string())
}

/// Makes equal exactly what hwloc and the kernel's files legitimately say
/// differently, after checking that the difference is that one and no other.
fn normalise(root: &Path, mut sysfs: View, mut hwloc: View) -> (View, View) {
    // 1. PCI class: hwloc keeps the class and subclass (`pci_type` "CCSS ..."),
    //    not the programming interface sysfs adds (0x010802 is NVMe, 0x010800
    //    in hwloc's words): compare without it.
    for d in &mut sysfs.devices {
        if d.1.len() == 8 {
            d.1.replace_range(6.., "00");
        }
    }
    // 2. A PCI bridge whose configuration header gives it no secondary bus
    //    (byte 0x19 is 0: a root port left unconfigured) is dropped by hwloc
    //    as invalid; the kernel still lists it (32em64t: 0000:00:11.0).
    sysfs.devices.retain(|d| {
        let keep = hwloc.devices.iter().any(|h| h.0 == d.0);
        if !keep {
            let config = std::fs::read(root.join(format!("sys/bus/pci/devices/{}/config", d.0))).unwrap_or_default();
            assert!(
                d.1.starts_with("0x0604") && config.get(0x19) == Some(&0),
                "{} is missing from hwloc's XML and is not a bridge without a secondary bus",
                d.0
            );
        }
        keep
    });
    // 3. PCI locality: Pinion takes the kernel's `numa_node`; hwloc places a
    //    device by its `local_cpulist`. They differ only where `numa_node` is
    //    -1 (no affinity) while `local_cpulist` lies inside one node
    //    (32em64t: 0000:00:02.0, CPUs 0-3): take hwloc's node there.
    for d in &mut sysfs.devices {
        let Some(h) = hwloc.devices.iter().find(|h| h.0 == d.0) else { continue };
        if d.2.is_none() && h.2.is_some() {
            let local = read(root, &format!("sys/bus/pci/devices/{}/local_cpulist", d.0)).unwrap_or_default();
            let local = specs::idset::CpuSet::parse_list(&local).expect("local_cpulist parses");
            let node = sysfs.numa.iter().find(|n| Some(n.0) == h.2).expect("hwloc's node exists");
            let node_cpus = specs::idset::CpuSet::parse_list(&node.2).expect("cpulist");
            assert!(!local.is_empty() && local.is_subset(&node_cpus), "{}: {local} is not in node {}", d.0, node.0);
            d.2 = h.2;
        }
    }
    // 4. Cores of AMD compute units (the Bulldozer dump): the kernel pairs the
    //    two integer cores of a unit as `thread_siblings`, each with its own
    //    `core_id`; hwloc, seeing the distinct core_ids, makes each its own
    //    core, while Pinion keeps the kernel's pairs (they share the front end
    //    and the FPU, so the engine treats them as one core's threads). Where
    //    hwloc splits a sysfs core, its threads must have distinct core_ids;
    //    then the sysfs numbering stands for both.
    let same_ids = sysfs.cpus.iter().map(|c| c.0).eq(hwloc.cpus.iter().map(|c| c.0));
    let mut split = false;
    for (i, (a, ha)) in sysfs.cpus.iter().zip(&hwloc.cpus).enumerate().filter(|_| same_ids) {
        for (b, hb) in sysfs.cpus.iter().zip(&hwloc.cpus).skip(i + 1) {
            assert!(a.1 == b.1 || ha.1 != hb.1, "hwloc merges cpus {} and {} of two cores", a.0, b.0);
            if a.1 == b.1 && ha.1 != hb.1 {
                let id = |cpu: u32| read(root, &format!("sys/devices/system/cpu/cpu{cpu}/topology/core_id"));
                assert_ne!(id(a.0), id(b.0), "hwloc splits cpus {} and {} of one core, their core_ids alike", a.0, b.0);
                split = true;
            }
        }
    }
    if split {
        for (s, h) in sysfs.cpus.iter().zip(hwloc.cpus.iter_mut()) {
            h.1 = s.1;
        }
    }
    (sysfs, hwloc)
}

#[test]
fn hwloc_xml_of_every_fixture_equals_sysfs_discovery() {
    let dir = sysfs_fixtures::dir();
    let tarballs = sysfs_fixtures::tarballs();
    assert!(tarballs.len() >= 9, "the fixtures are in {}", dir.display());
    let mut failures = Vec::new();
    for tarball in &tarballs {
        let name = tarball.file_name().and_then(|n| n.to_str()).unwrap_or("?").trim_end_matches(".tar.gz");
        let tmp = tempfile::tempdir().expect("temp dir");
        sysfs_fixtures::unpack(tarball, tmp.path());
        let sysfs = discover(tmp.path()).unwrap_or_else(|e| panic!("{name}: sysfs: {e}"));
        let xml = lstopo(tmp.path());
        let hwloc = nodelet::hwloc::parse(&xml).unwrap_or_else(|e| panic!("{name}: hwloc XML: {e}"));
        let (s, h) = normalise(tmp.path(), view(&sysfs), view(&hwloc));
        if s != h {
            for (what, a, b) in [
                ("cpus", format!("{:?}", s.cpus), format!("{:?}", h.cpus)),
                ("numa", format!("{:?}", s.numa), format!("{:?}", h.numa)),
                ("devices", format!("{:?}", s.devices), format!("{:?}", h.devices)),
            ] {
                if a != b {
                    failures.push(format!("{name}: {what}\n  sysfs: {a}\n  hwloc: {b}"));
                }
            }
        } else {
            println!("{name}: agree");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
