//! Score stages: how good a feasible node is for a pod under a strategy, from
//! the node's summary with the pod added. Higher is better; ties go to the
//! node whose name sorts first, so the same inputs always bind the same node.

use specs::pod::SchedulingStrategy;

use super::demand::Demand;
use super::summary::{Hot, NodeSummary};

/// Fractions are in units of `SCALE` (the per-node reciprocals are stored so).
pub(crate) const SCALE: u64 = 1_000_000;
const FULL: f64 = SCALE as f64;

/// Fraction of capacity in use once the pod is added, in `SCALE` units.
/// `scale` is `SCALE / capacity`, computed once per node change: a division per
/// node per pod costs more than the rest of a node's checks. Floating point is
/// deterministic (the same inputs give the same bits, so identical nodes tie
/// exactly) and exact enough to rank nodes.
#[inline]
fn used_fraction(used: u64, want: u64, capacity: u64, scale: f64) -> f64 {
    used.saturating_add(want).min(capacity) as f64 * scale
}

/// `s` is read only for `least-numa-nodes` on nodes with many NUMA nodes.
#[inline]
pub(crate) fn score(strategy: SchedulingStrategy, h: &Hot, s: &NodeSummary, d: &Demand) -> f64 {
    // CPU use counts exclusive CPUs at 1000m each (as they are accounted in
    // `cpu_millis_used`), so an exclusive-heavy node reads as busy.
    let cpu = used_fraction(h.cpu_millis_used, d.total.cpu_millis, h.cpu_millis_capacity, h.cpu_scale);
    let mem = used_fraction(h.memory_used, d.total.memory, h.memory_capacity, h.memory_scale);
    match strategy {
        // Spread: the most free capacity left afterwards (telecom: headroom per site).
        SchedulingStrategy::LeastAllocated => FULL - (cpu + mem) / 2.0,
        // Pack: the fullest node that still fits (HPC: keep whole nodes free).
        SchedulingStrategy::MostAllocated => (cpu + mem) / 2.0,
        // CPU and memory used in the same proportion, so neither strands the other.
        SchedulingStrategy::Balanced => FULL - (cpu - mem).abs(),
        // The fewest NUMA nodes the pod would need here, then spread.
        SchedulingStrategy::LeastNumaNodes => {
            let k = numa_nodes_needed(h, s, d) as f64;
            (64.0 - k) * 2.0 * FULL + FULL - (cpu + mem) / 2.0
        }
    }
}

/// The smallest number of this node's NUMA nodes whose free exclusive CPUs (and,
/// for a Guaranteed pod, memory) could hold the pod: an estimate of how many
/// NUMA nodes its placement spans. Sorting on the stack: this runs per node.
pub(crate) fn numa_nodes_needed(h: &Hot, s: &NodeSummary, d: &Demand) -> usize {
    const MAX: usize = 64;
    let n = if h.numa_inline { usize::from(h.numa_len) } else { s.numa.len().min(MAX) };
    let k_cpu = {
        let mut free = [0u64; MAX];
        if h.numa_inline {
            for (slot, c) in free.iter_mut().zip(&h.numa_free_cpus[..usize::from(h.numa_len)]) {
                *slot = (*c).into();
            }
        } else {
            for (slot, numa) in free.iter_mut().zip(&s.numa) {
                *slot = numa.free_cpus.into();
            }
        }
        cover(&mut free[..n], d.total.exclusive_cpus.into())
    };
    let k_mem = if d.guaranteed {
        let mut free = [0u64; MAX];
        if h.numa_inline {
            free[..usize::from(h.numa_len)].copy_from_slice(&h.numa_free_memory[..usize::from(h.numa_len)]);
        } else {
            for (slot, numa) in free.iter_mut().zip(&s.numa) {
                *slot = numa.free_memory;
            }
        }
        cover(&mut free[..n], d.total.memory)
    } else {
        0
    };
    k_cpu.max(k_mem)
}

/// How many of the largest amounts it takes to reach `want` (all of them if never).
fn cover(amounts: &mut [u64], want: u64) -> usize {
    if want == 0 {
        return 0;
    }
    amounts.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0u64;
    for (i, a) in amounts.iter().enumerate() {
        sum = sum.saturating_add(*a);
        if sum >= want {
            return i + 1;
        }
    }
    amounts.len()
}
