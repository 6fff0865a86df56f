//! Discovery against the real machines captured in `shared/fixtures/sysfs/*.tar.gz`.
//!
//! Every tarball in the folder must have an expectation here (and every expectation a
//! tarball), so a new fixture cannot slip in untested. The expected figures are the
//! fixture README's (hwloc's view of each machine), except cores on the AMD dump, where
//! Pinion deliberately groups threads by `thread_siblings` (32 cores x 2) while hwloc
//! reports 64 cores x 1.

mod sysfs_fixtures;

use std::path::Path;

use nodelet::discovery::discover;
use specs::idset::CpuSet;
use specs::topology::NumaKind;
use specs::NodeTopology;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

struct Expect {
    name: &'static str,
    sockets: usize,
    numa: usize,
    cores: usize,
    threads: usize,
    /// NUMA node id -> its CPUs (cpulist syntax).
    numa_cpus: &'static [(u32, &'static str)],
    /// How many uncore (L3) cache groups the kernel describes; `None` for a
    /// dump without level-3 caches (every CPU's `uncore_cache` is `None`).
    l3_groups: Option<usize>,
    /// The memory-only NUMA nodes.
    memory_only: &'static [u32],
    /// Fixture-specific checks.
    extra: fn(&NodeTopology),
}

fn mem(t: &NodeTopology, node: u32) -> u64 {
    t.numa_node(node).unwrap_or_else(|| panic!("no node {node}")).memory_bytes
}

fn core_of(t: &NodeTopology, cpu: u32) -> u32 {
    t.cpu(cpu).unwrap_or_else(|| panic!("no cpu {cpu}")).core
}

const EXPECTATIONS: &[Expect] = &[
    Expect {
        name: "32intel64-2p8co2t+8ve",
        sockets: 2,
        numa: 2,
        cores: 16,
        threads: 32,
        numa_cpus: &[(0, "0-7,16-23"), (1, "8-15,24-31")],
        l3_groups: Some(2),
        memory_only: &[],
        extra: |t| {
            for n in 0..16 {
                assert_eq!(core_of(t, n), core_of(t, n + 16), "cpu {n} and {} are HT siblings", n + 16);
                assert_ne!(core_of(t, n), core_of(t, (n + 1) % 16));
            }
            assert!((45 * GIB..46 * GIB).contains(&mem(t, 0)), "node0 45.7 GiB: {}", mem(t, 0));
            assert!((47 * GIB..48 * GIB).contains(&mem(t, 1)), "node1 47.2 GiB: {}", mem(t, 1));
            for n in &t.numa_nodes {
                let two_mib = n.hugepages.iter().find(|h| h.page_size_bytes == 2 * MIB).expect("2 MiB pages");
                assert_eq!(two_mib.total, 2048, "node{}", n.id);
            }
            assert_eq!(t.devices.len(), 28);
            assert!(t.devices.iter().all(|d| d.numa == Some(0)));
        },
    },
    Expect {
        name: "64amd64-4s2n4ca2co",
        sockets: 4,
        numa: 8,
        cores: 32,
        threads: 64,
        numa_cpus: &[
            (0, "0-7"),
            (1, "8-15"),
            (2, "16-23"),
            (3, "24-31"),
            (4, "32-39"),
            (5, "40-47"),
            (6, "48-55"),
            (7, "56-63"),
        ],
        l3_groups: Some(8),
        memory_only: &[],
        extra: |t| {
            assert_eq!(t.numa_nodes[0].distances, vec![10, 16, 16, 22, 16, 22, 16, 22]);
            let mut seen: Vec<u32> = t.numa_nodes.iter().flat_map(|n| n.distances.clone()).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, vec![10, 16, 22]);
            assert_eq!(t.distance(3, 0), 22);
            assert_eq!(mem(t, 5), 8 * GIB, "node5 is the 8 GiB one");
            // core_id 0-7 repeats per die inside a package: cpu 0 and cpu 8 are different cores.
            assert_ne!(core_of(t, 0), core_of(t, 8));
            assert_eq!(core_of(t, 0), core_of(t, 1));
            // Two L3 groups per package, one per die (= NUMA node): 0-7 and 8-15 on package 0.
            let l3 = |cpu: u32| t.cpu(cpu).and_then(|c| c.uncore_cache);
            assert_eq!((l3(0), l3(7), l3(8), l3(15), l3(16)), (Some(0), Some(0), Some(1), Some(1), Some(2)));
            assert_eq!(t.cpu(8).map(|c| c.socket), t.cpu(0).map(|c| c.socket));
            assert!(t.devices.is_empty());
        },
    },
    Expect {
        name: "128arm-2pa2n8cluster4co",
        sockets: 2,
        numa: 4,
        cores: 128,
        threads: 128,
        numa_cpus: &[(0, "0-31"), (1, "32-63"), (2, "64-95"), (3, "96-127")],
        l3_groups: Some(4),
        memory_only: &[],
        extra: |t| {
            assert_eq!(t.numa_nodes[0].distances, vec![10, 16, 32, 33]);
            let sizes: Vec<u64> = t.numa_nodes[0].hugepages.iter().map(|h| h.page_size_bytes).collect();
            assert_eq!(sizes, vec![64 << 10, 2 * MIB, 32 * MIB, GIB]);
            assert!(t.numa_nodes[0].hugepages.iter().all(|h| h.total == 0));
            assert!(t.cpus.iter().all(|c| c.die.is_none()), "die_id -1 is no die");
            assert_eq!((t.cpu(63).map(|c| c.socket), t.cpu(64).map(|c| c.socket)), (Some(0), Some(1)));
        },
    },
    Expect {
        name: "256ppc-8n8s4t",
        sockets: 64,
        numa: 8,
        cores: 64,
        threads: 256,
        numa_cpus: &[
            (0, "0-31"),
            (1, "32-63"),
            (4, "64-95"),
            (5, "96-127"),
            (8, "128-159"),
            (9, "160-191"),
            (12, "192-223"),
            (13, "224-255"),
        ],
        l3_groups: Some(64),
        memory_only: &[],
        extra: |t| {
            for c in (0..256).step_by(4) {
                assert_eq!(core_of(t, c), core_of(t, c + 3), "SMT4: cpu {c}..{}", c + 3);
            }
            let mut seen: Vec<u32> = t.numa_nodes.iter().flat_map(|n| n.distances.clone()).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, vec![10, 20, 40]);
            assert!(t.numa_nodes.iter().all(|n| (54 * GIB..65 * GIB).contains(&n.memory_bytes)));
        },
    },
    Expect {
        name: "128ia64-17n4s2c",
        sockets: 64,
        numa: 17,
        cores: 128,
        threads: 128,
        numa_cpus: &[
            (0, "0-7"),
            (1, "8-15"),
            (2, "16-23"),
            (3, "24-31"),
            (4, "32-39"),
            (5, "40-47"),
            (6, "48-55"),
            (7, "56-63"),
            (8, "64-71"),
            (9, "72-79"),
            (10, "80-87"),
            (11, "88-95"),
            (12, "96-103"),
            (13, "104-111"),
            (14, "112-119"),
            (15, "120-127"),
            (16, ""),
        ],
        l3_groups: None,
        memory_only: &[16],
        extra: |t| {
            assert!((GIB - 64 * MIB..=GIB).contains(&mem(t, 16)), "node16 1 GiB: {}", mem(t, 16));
            assert!(t.numa_nodes.iter().all(|n| n.distances.len() == 17));
            assert!((95 * GIB..96 * GIB).contains(&mem(t, 0)), "node0 95.9 GiB: {}", mem(t, 0));
        },
    },
    Expect {
        name: "16em64t-4s2c2t-offlines",
        sockets: 4,
        numa: 1,
        cores: 7,
        threads: 12,
        numa_cpus: &[(0, "0-1,3-4,6-12,15")],
        l3_groups: Some(4),
        memory_only: &[],
        extra: |t| {
            for offline in [2, 5, 13, 14] {
                assert!(t.cpu(offline).is_none(), "cpu {offline} is offline");
            }
            assert_eq!(mem(t, 0) / GIB, 15, "16 GiB node: {}", mem(t, 0));
        },
    },
    Expect {
        name: "20em64t-hybrid-1p6c2t+2ca4co1t",
        sockets: 1,
        numa: 1,
        cores: 14,
        threads: 20,
        numa_cpus: &[(0, "0-19")],
        l3_groups: Some(1),
        memory_only: &[],
        extra: |t| {
            assert_eq!(core_of(t, 0), core_of(t, 1));
            assert_ne!(core_of(t, 12), core_of(t, 13), "E-cores have one thread");
            assert_eq!(mem(t, 0) / GIB, 30, "31 GiB: {}", mem(t, 0));
        },
    },
    Expect {
        name: "32em64t-2n8c+dax+nvme+mic+dimms",
        sockets: 2,
        numa: 2,
        cores: 16,
        threads: 16,
        numa_cpus: &[(0, "0-7"), (1, "8-15")],
        l3_groups: Some(2),
        memory_only: &[],
        extra: |t| {
            assert_eq!(t.devices.len(), 137);
            let count = |n: Option<u32>| t.devices.iter().filter(|d| d.numa == n).count();
            assert_eq!((count(Some(0)), count(Some(1)), count(None)), (28, 16, 93));
            let host_bridge = t.devices.iter().find(|d| d.address == "0000:00:00.0").expect("00:00.0");
            assert_eq!((host_bridge.class.as_str(), host_bridge.numa), ("0x060000", Some(0)));
            assert_eq!(t.numa_nodes[0].distances, vec![10, 21]);
        },
    },
    Expect {
        name: "2arm-2c",
        sockets: 1,
        numa: 1,
        cores: 2,
        threads: 2,
        numa_cpus: &[(0, "0-1")],
        l3_groups: None,
        memory_only: &[],
        extra: |t| {
            // No node/ directory: one implicit node with /proc/meminfo's MemTotal (274 MiB).
            assert_eq!(mem(t, 0) / MIB, 274, "{}", mem(t, 0));
            assert_eq!(t.numa_nodes[0].distances, vec![10]);
        },
    },
];

fn check(root: &Path, e: &Expect) {
    let t = discover(root).unwrap_or_else(|err| panic!("{}: {err}", e.name));
    let summary = (t.sockets(), t.numa_nodes.len(), t.cores(), t.cpus.len());
    println!("{}: sockets={} numa={} cores={} threads={}", e.name, summary.0, summary.1, summary.2, summary.3);
    assert_eq!(summary, (e.sockets, e.numa, e.cores, e.threads), "{}: (sockets, numa, cores, threads)", e.name);

    let got: Vec<(u32, String)> = t.numa_nodes.iter().map(|n| (n.id, n.cpus.to_string())).collect();
    let want: Vec<(u32, String)> = e.numa_cpus.iter().map(|(id, l)| (*id, (*l).to_string())).collect();
    assert_eq!(got, want, "{}: NUMA node cpulists", e.name);
    for c in &t.cpus {
        // Every node of these machines is online: no CPU is in none.
        let numa = c.numa.unwrap_or_else(|| panic!("{}: cpu {} in no node", e.name, c.id));
        let node = t.numa_node(numa).unwrap_or_else(|| panic!("{}: cpu {} in unknown node", e.name, c.id));
        assert!(node.cpus.contains(c.id), "{}: cpu {} not in node {numa}'s list", e.name, c.id);
    }

    // Invariants every discovered machine holds.
    let ids: Vec<u32> = t.cpus.iter().map(|c| c.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{}: cpus sorted by id", e.name);
    let max_socket = t.cpus.iter().map(|c| c.socket).max().unwrap_or(0);
    assert_eq!(max_socket as usize + 1, t.sockets(), "{}: sockets numbered 0..", e.name);
    let max_core = t.cpus.iter().map(|c| c.core).max().unwrap_or(0);
    assert_eq!(max_core as usize + 1, t.cores(), "{}: cores numbered 0..", e.name);
    for c in &t.cpus {
        let same_core = t.cpus.iter().filter(|d| d.core == c.core);
        assert!(same_core.clone().all(|d| d.socket == c.socket), "{}: core {} spans sockets", e.name, c.core);
    }
    for n in &t.numa_nodes {
        assert!(
            n.distances.is_empty() || n.distances.len() == t.numa_nodes.len(),
            "{}: node{} distance row length",
            e.name,
            n.id
        );
    }
    let all: CpuSet = t.numa_nodes.iter().fold(CpuSet::new(), |acc, n| acc.union(&n.cpus));
    assert_eq!(all, t.all_cpus(), "{}: NUMA cpulists cover exactly the online CPUs", e.name);

    // The JSON shape round-trips.
    let json = serde_json::to_string(&t).expect("serialize");
    let back: NodeTopology = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, t, "{}: JSON round trip", e.name);

    let l3: Vec<Option<u32>> = t.cpus.iter().map(|c| c.uncore_cache).collect();
    let groups = match e.l3_groups {
        None => {
            assert!(l3.iter().all(Option::is_none), "{}: no L3 in the dump, none in the topology", e.name);
            0
        }
        Some(_) => {
            assert!(l3.iter().all(Option::is_some), "{}: every CPU in an L3 group", e.name);
            let max = l3.iter().flatten().max().copied().unwrap_or(0) as usize + 1;
            // Numbered 0.. in order of first appearance.
            let mut next = 0;
            for g in l3.iter().flatten() {
                assert!(*g <= next, "{}: L3 group {g} appears before {next}", e.name);
                next = next.max(*g + 1);
            }
            max
        }
    };
    assert_eq!(groups, e.l3_groups.unwrap_or(0), "{}: L3 groups", e.name);
    for c in &t.cpus {
        let same = t.cpus.iter().filter(|d| c.uncore_cache.is_some() && d.uncore_cache == c.uncore_cache);
        assert!(same.clone().all(|d| d.socket == c.socket), "{}: L3 of cpu {} spans sockets", e.name, c.id);
    }
    let memory_only: Vec<u32> = t.numa_nodes.iter().filter(|n| n.kind == NumaKind::MemoryOnly).map(|n| n.id).collect();
    assert_eq!(memory_only, e.memory_only, "{}: memory-only NUMA nodes", e.name);

    (e.extra)(&t);
}

#[test]
fn every_fixture_matches_its_readme() {
    let tarballs = sysfs_fixtures::tarballs();
    let names: Vec<String> =
        tarballs.iter().filter_map(|p| p.file_name()?.to_str()?.strip_suffix(".tar.gz").map(str::to_string)).collect();
    let mut expected: Vec<String> = EXPECTATIONS.iter().map(|e| e.name.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "every fixture has an expectation and vice versa");

    for (tarball, name) in tarballs.iter().zip(&names) {
        let e = EXPECTATIONS.iter().find(|e| e.name == name).expect("checked above");
        let tmp = tempfile::tempdir().expect("temp dir");
        sysfs_fixtures::unpack(tarball, tmp.path());
        check(tmp.path(), e);
    }
}

#[test]
fn fixture_without_node_dir_has_no_pci_and_one_node() {
    // Guards the fallback separately so a failure names it.
    let dir = sysfs_fixtures::dir();
    let tmp = tempfile::tempdir().expect("temp dir");
    sysfs_fixtures::unpack(&dir.join("2arm-2c.tar.gz"), tmp.path());
    assert!(!tmp.path().join("sys/devices/system/node").exists());
    let t = discover(tmp.path()).expect("discover");
    assert_eq!(t.numa_ids().to_vec(), vec![0]);
    assert!(t.devices.is_empty());
}
