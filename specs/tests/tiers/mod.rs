//! Machines with memory-only NUMA nodes (HBM, CXL expanders) for the engine's
//! tests: a synthetic machine plus memory-only nodes at given distances.
//! Shared by `engine_memory_tiers` and `engine_props`; each uses a part.
#![allow(dead_code)]

use specs::topology::{HugePages, NodeTopology, NumaKind, NumaNode};
use specs::CpuSet;

pub const GI: u64 = 1 << 30;

/// Appends a memory-only node of `memory` bytes (and `hugepages_2m` 2 MiB
/// pages) whose distance to each node already there is `distances[i]`.
pub fn add_memory_only(t: &mut NodeTopology, memory: u64, hugepages_2m: u64, distances: &[u32]) {
    assert_eq!(distances.len(), t.numa_nodes.len(), "one distance per node already there");
    for (n, &d) in t.numa_nodes.iter_mut().zip(distances) {
        n.distances.push(d);
    }
    let id = t.numa_nodes.last().map_or(0, |n| n.id + 1);
    let mut row = distances.to_vec();
    row.push(10);
    let hugepages =
        if hugepages_2m > 0 { vec![HugePages { page_size_bytes: 2 << 20, total: hugepages_2m }] } else { vec![] };
    t.numa_nodes.push(NumaNode {
        id,
        kind: NumaKind::MemoryOnly,
        cpus: CpuSet::new(),
        memory_bytes: memory,
        distances: row,
        hugepages,
    });
}

/// Two sockets of `cores` CPUs (NUMA nodes 0 and 1, 64 GiB each, distance
/// 32 between them), then four memory-only nodes: 2, HBM next to node 0
/// (16 GiB, distance 12), 3, HBM next to node 1; 4, CXL memory on node 0's
/// side (64 GiB, distance 30, 42 from node 1), 5, the same on node 1's side.
/// From node 0 the memory-only nodes are, nearest first, 2 (12), 4 (30), 3
/// (32), 5 (42).
pub fn hbm_machine(cores: u32, hbm_hugepages_2m: u64) -> NodeTopology {
    let mut t = specs::topology::synthetic::parse(&format!("pack:2 numa:1 core:{cores} pu:1")).expect("synthetic");
    add_memory_only(&mut t, 16 * GI, hbm_hugepages_2m, &[12, 32]);
    add_memory_only(&mut t, 16 * GI, hbm_hugepages_2m, &[32, 12, 32]);
    add_memory_only(&mut t, 64 * GI, 0, &[30, 42, 30, 42]);
    add_memory_only(&mut t, 64 * GI, 0, &[42, 30, 42, 30, 42]);
    t
}
