//! The Memory Manager's static policy: memory and huge pages accounted per NUMA node.
//!
//! Only Guaranteed pods are accounted and bound, as in the kubelet. The nodes are
//! the Topology Manager's affinity when it holds the request; otherwise the
//! narrowest candidate mask that contains the affinity and holds it (the kubelet's
//! `extendTopologyManagerHint`); with no affinity (policy `none`), the narrowest
//! mask that holds it (the kubelet's default hint). Within the nodes, memory is
//! taken node by node in index order until the request is covered; the
//! container's `mems` are all the nodes of the mask.

use std::collections::BTreeMap;

use super::hints::{self, Provider};
use super::machine::{bits, Free, Machine, Mask};

/// The mask memory comes from: `affinity` itself when every memory provider fits
/// it, else the narrowest feasible candidate containing it.
pub(crate) fn choose_mask(m: &Machine<'_>, providers: &[&Provider], affinity: Option<Mask>) -> Option<Mask> {
    let base = affinity.unwrap_or(0);
    if base != 0 && providers.iter().all(|p| p.feasible(base)) {
        return Some(base);
    }
    // The candidates include the whole machine, so this is None only when even
    // that does not hold the request.
    hints::candidates(m, providers).into_iter().find(|&c| c & base == base && providers.iter().all(|p| p.feasible(c)))
}

/// Takes `bytes` of memory and `pages` huge pages (size -> count) from the nodes
/// of `mask` in index order. Returns what was taken per node id, or `None` when
/// the mask does not hold it (nothing is changed then).
#[allow(clippy::type_complexity)]
pub(crate) fn take(
    m: &Machine<'_>,
    free: &mut Free,
    mask: Mask,
    bytes: u64,
    pages: &[(u64, u64)],
) -> Option<(BTreeMap<u32, u64>, BTreeMap<u64, BTreeMap<u32, u64>>)> {
    let mut mem = BTreeMap::new();
    let mut left = bytes;
    let mut plan_mem: Vec<(usize, u64)> = Vec::new();
    for i in bits(mask) {
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
        for i in bits(mask) {
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
