//! The Memory Manager's static policy: memory and huge pages accounted per NUMA node.
//!
//! Only Guaranteed pods are accounted and bound, as in the kubelet. The nodes are
//! the Topology Manager's affinity when it holds the request; otherwise the
//! narrowest candidate mask that contains the affinity and holds it (the kubelet's
//! `extendTopologyManagerHint`); with no affinity (policy `none`), the narrowest
//! mask that holds it (the kubelet's default hint). Within the nodes, memory is
//! taken node by node in index order until the request is covered; the
//! container's `mems` are all the nodes of the mask.
//!
//! Not reproduced: the kubelet's rule that a node already holding part of a
//! multi-node memory group may only be reused by exactly that group.
//!
//! Memory-only nodes (HBM, CXL expanders: `NumaKind::MemoryOnly`) are a tier
//! apart. A pod that does not ask for them never has memory or huge pages
//! accounted there, nor a binding naming them (the providers count nothing
//! on them and `Machine::with_memory` leaves them out). A pod with
//! `spec.topology.memory: nearest-memory-only` has its CPUs (and devices)
//! aligned as usual, without its memory and huge pages as providers in the
//! merge; then each container's memory and huge pages go to the memory-only
//! nodes nearest its CPU nodes: ordered by the distance from the closest of
//! its CPU nodes, then by id, and taken from them in that order, so the
//! request spills to the next nearest only where the nearer ones are full (as
//! the kernel's `MPOL_BIND` allocates from the nearest node of its set first).
//! Its `mems` are the memory-only nodes it got some of; none with room is
//! `InsufficientMemory` (or `InsufficientHugePages`). Under
//! `single-numa-node` the CPUs stay on one node and the memory must be on
//! one memory-only node too, the nearest that holds all of it; when only
//! several together hold it, the pod is refused with `TopologyAffinity`.
//! So "one NUMA node" means one CPU node plus, for such a pod, its one
//! near-memory node.
//!
//! The tier's hint: which CPU nodes such a pod gets still depends on where
//! the tier has room. A mask of CPU nodes is *near-holding* ([`near_holds`])
//! when the memory-only nodes nearest it, those at the smallest distance in
//! the order above (HBM next to a CPU node, not the CXL behind it), have the
//! group's memory and every huge-page size free (the pod's under scope
//! `pod`, the container's under scope `container`); under `single-numa-node`,
//! when one of them holds it all. The merge uses this only to break ties,
//! as it does a relaxed resource's hint: among the masks the CPUs and
//! devices find equally good (same class, same width) a near-holding one
//! comes first, the lowest otherwise. It never widens, moves or refuses
//! what the CPUs and devices decide. Per policy:
//!   - `best-effort`, `restricted`: a CPU node with local room when the CPUs
//!     fit one equally well; else the CPUs' choice, the memory spilled nearest
//!     first (`restricted` refuses only for the CPUs and devices, as before);
//!   - `single-numa-node`: the first CPU node that fits the CPUs and devices
//!     and whose nearest memory-only nodes include one holding it all; else
//!     the first that fits, and the memory goes to the nearest single
//!     memory-only node holding it all, refused only when none does (the rule
//!     above, unchanged);
//!   - `none`: a tier pod with memory is aligned as under `best-effort` (its
//!     CPUs, and devices, on the chosen nodes), since local memory is what
//!     it asked for; `numaAffinity` still says all nodes and no relaxed
//!     resource is reported remote.
//!
//! The hint looks at the mask, not at the CPUs then taken in it; they are
//! the same node for a request one node holds.
use std::collections::BTreeMap;

use super::decide::fmt_bytes;
use super::hints::{self, Provider};
use super::machine::{bits, Free, Machine, Mask};
use super::{RejectReason, Rejection};

/// The mask memory comes from: `affinity` itself when every memory provider fits
/// it, else the narrowest feasible candidate containing it.
pub(crate) fn choose_mask(m: &Machine<'_>, providers: &[&Provider], affinity: Option<Mask>) -> Option<Mask> {
    let base = affinity.unwrap_or(0);
    if base != 0 && providers.iter().all(|p| p.feasible(base)) {
        return Some(base);
    }
    if base == 0 {
        // The narrowest first: a single node that holds it, lowest index.
        if let Some(x) = hints::single_nodes(m).into_iter().find(|&x| providers.iter().all(|p| p.feasible(x))) {
            return Some(x);
        }
    }
    // The candidates include the whole machine, so this is None only when even
    // that does not hold the request.
    hints::candidates(m, providers, m.n)
        .into_iter()
        .find(|&c| c & base == base && providers.iter().all(|p| p.feasible(c)))
}

/// Memory and huge pages accounted: bytes per node id; page size -> node id -> pages.
pub(crate) type Taken = (BTreeMap<u32, u64>, BTreeMap<u64, BTreeMap<u32, u64>>);

/// Takes `bytes` of memory and `pages` huge pages (size -> count) from `nodes`
/// (indexes) in that order. Returns what was taken per node id, or `None` when
/// they do not hold it (nothing is changed then).
pub(crate) fn take(
    m: &Machine<'_>,
    free: &mut Free,
    nodes: impl Iterator<Item = usize> + Clone,
    bytes: u64,
    pages: &[(u64, u64)],
) -> Option<Taken> {
    let mut mem = BTreeMap::new();
    let mut left = bytes;
    let mut plan_mem: Vec<(usize, u64)> = Vec::new();
    for i in nodes.clone() {
        if left == 0 {
            break;
        }
        let t = left.min(free.mem_free(m, i));
        if t > 0 {
            plan_mem.push((i, t));
            left -= t;
        }
    }
    if left > 0 {
        return None;
    }
    let mut plan_hp: Vec<(u64, usize, u64)> = Vec::new();
    for &(size, count) in pages {
        let mut left = count;
        for i in nodes.clone() {
            if left == 0 {
                break;
            }
            let t = left.min(free.hp(m, size, i).1);
            if t > 0 {
                plan_hp.push((size, i, t));
                left -= t;
            }
        }
        if left > 0 {
            return None;
        }
    }
    for (i, t) in plan_mem {
        free.mem_used[i] = free.mem_used[i].saturating_add(t);
        mem.insert(m.node_id(i), t);
    }
    let mut hp: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
    for (size, i, t) in plan_hp {
        let v = free.hp_used.entry(size).or_insert_with(|| vec![0; m.n]);
        v[i] = v[i].saturating_add(t);
        *hp.entry(size).or_default().entry(m.node_id(i)).or_default() += t;
    }
    Some((mem, hp))
}

/// The memory-only nodes with their distance from the closest of `cpu_nodes`
/// (its CPU nodes; all CPU nodes when it has none), nearest first, then by index.
fn memory_only_by_distance(m: &Machine<'_>, cpu_nodes: Mask) -> Vec<(u32, usize)> {
    let cpu_nodes = match cpu_nodes & !m.memory_only {
        0 => m.all_nodes() & !m.memory_only,
        x => x,
    };
    let reach = |j: usize| bits(cpu_nodes).map(|i| m.distance(i, j)).min().unwrap_or(u32::MAX);
    let mut order: Vec<(u32, usize)> = bits(m.memory_only).map(|j| (reach(j), j)).collect();
    order.sort_unstable();
    order
}

/// Whether `nodes` together have `bytes` of memory free, and which page size
/// (size, count) they are short of, if any; and how much memory they have free.
fn fits(
    m: &Machine<'_>,
    free: &Free,
    nodes: &[usize],
    bytes: u64,
    pages: &[(u64, u64)],
) -> (bool, Option<(u64, u64)>, u64) {
    let mem = nodes.iter().fold(0u64, |a, &i| a.saturating_add(free.mem_free(m, i)));
    let short_hp = pages
        .iter()
        .find(|&&(size, count)| nodes.iter().fold(0u64, |a, &i| a.saturating_add(free.hp(m, size, i).1)) < count);
    (mem >= bytes, short_hp.copied(), mem)
}

/// A tier pod's hint for a mask of CPU nodes (module docs): whether the
/// memory-only nodes nearest it, those at the smallest distance from it, hold
/// `bytes` and `pages` (`single`: one of them holds it all), so that
/// [`take_nearest_memory_only`] would take it all there.
pub(crate) fn near_holds(
    m: &Machine<'_>,
    free: &Free,
    cpu_nodes: Mask,
    single: bool,
    bytes: u64,
    pages: &[(u64, u64)],
) -> bool {
    let order = memory_only_by_distance(m, cpu_nodes);
    let Some(&(nearest, _)) = order.first() else {
        return false;
    };
    let near: Vec<usize> = order.iter().take_while(|&&(d, _)| d == nearest).map(|&(_, j)| j).collect();
    let holds = |nodes: &[usize]| matches!(fits(m, free, nodes, bytes, pages), (true, None, _));
    if single {
        near.iter().any(|&j| holds(&[j]))
    } else {
        holds(&near)
    }
}

/// Places a container's memory and huge pages on the memory-only nodes nearest
/// `cpu_nodes` (module docs); `single`: on one node only. Returns what was
/// taken and the nodes it was taken from.
pub(crate) fn take_nearest_memory_only(
    m: &Machine<'_>,
    free: &mut Free,
    container: &str,
    cpu_nodes: Mask,
    single: bool,
    bytes: u64,
    pages: &[(u64, u64)],
) -> Result<(Taken, Mask), Rejection> {
    let order: Vec<usize> = memory_only_by_distance(m, cpu_nodes).into_iter().map(|(_, j)| j).collect();
    let asks = "on memory-only NUMA nodes (spec.topology.memory: nearest-memory-only)";
    if order.is_empty() {
        return Err(Rejection {
            reason: RejectReason::InsufficientMemory,
            message: format!("container {container} asks for its memory {asks} but this node has none"),
        });
    }
    let fit = |nodes: &[usize]| fits(m, free, nodes, bytes, pages);
    let nodes: Vec<usize> = match (fit(&order), single) {
        ((false, _, have), _) => {
            return Err(Rejection {
                reason: RejectReason::InsufficientMemory,
                message: format!(
                    "container {container} requests {} memory {asks} but they have only {} free (nodes {})",
                    fmt_bytes(bytes),
                    fmt_bytes(have),
                    node_ids(m, &order)
                ),
            })
        }
        ((true, Some((size, count)), _), _) => {
            let have = order.iter().fold(0u64, |a, &i| a.saturating_add(free.hp(m, size, i).1));
            return Err(Rejection {
                reason: RejectReason::InsufficientHugePages,
                message: format!(
                    "container {container} requests {count} hugepages-{} pages {asks} but they have only {have} free (nodes {})",
                    fmt_bytes(size),
                    node_ids(m, &order)
                ),
            });
        }
        ((true, None, _), false) => order,
        ((true, None, _), true) => {
            let one = order.iter().copied().find(|&i| matches!(fit(&[i]), (true, None, _)));
            let Some(one) = one else {
                return Err(Rejection {
                    reason: RejectReason::TopologyAffinity,
                    message: format!(
                        "no single memory-only NUMA node has {}{} free for container {container}'s memory \
                         (single-numa-node with spec.topology.memory: nearest-memory-only); nodes {} hold it only together",
                        fmt_bytes(bytes),
                        if pages.is_empty() { "" } else { " and its huge pages" },
                        node_ids(m, &order)
                    ),
                });
            };
            vec![one]
        }
    };
    let taken = take(m, free, nodes.iter().copied(), bytes, pages).ok_or_else(|| Rejection {
        reason: RejectReason::InsufficientMemory,
        message: format!("container {container}: memory no longer fits {asks}"),
    })?;
    let index = |id: u32| (0..m.n).find(|&i| m.node_id(i) == id);
    let used = taken.0.keys().chain(taken.1.values().flat_map(|per_node| per_node.keys()));
    let mask = used.filter_map(|&id| index(id)).fold(0, |a: Mask, i| a | (1 << i));
    Ok((taken, mask))
}

fn node_ids(m: &Machine<'_>, nodes: &[usize]) -> String {
    nodes.iter().map(|&i| m.node_id(i).to_string()).collect::<Vec<_>>().join(",")
}
