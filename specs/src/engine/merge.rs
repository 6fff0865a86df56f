//! The Topology Manager's merge: from providers to one NUMA affinity, or a refusal.
//!
//! The kubelet merges by taking one hint from every provider in every
//! combination, ANDing their masks, and keeping the best result; a merged hint is
//! *preferred* when every hint in it was. Here each candidate mask (see `hints`) is
//! asked of every provider at once: a mask is feasible when every provider fits in
//! it, and preferred when it is also as narrow as the widest of the providers'
//! narrowest widths (the kubelet's preferred hints all have exactly that width
//! when the providers agree on it). The best mask is chosen with the kubelet's
//! order:
//!   - preferred before non-preferred;
//!   - among preferred, the narrowest; equal widths by the smaller mean distance
//!     when `prefer-closest-numa-nodes` is set, then the lower node indexes
//!     (the kubelet's `IsLessThan`: the smaller mask value);
//!   - among non-preferred, the width closest to the preferred width from above,
//!     then from below (the kubelet's `BestNonPreferredAffinityCount` cases).
//!
//! Policies: `best-effort` admits whatever is best (all nodes, not preferred, when
//! nothing fits); `restricted` admits only a preferred mask; `single-numa-node`
//! looks at single nodes only and admits only a preferred one. `none` never calls
//! the merge for alignment.
//!
//! Relaxed providers (the resources of `spec.topology.relaxed`) are merged as
//! best-effort hints: only the others decide which masks are feasible,
//! preferred and admitted, and among masks equal by those rules (same class,
//! same width) one where the relaxed resources fit too comes first. So a
//! relaxed resource is aligned whenever that costs the others nothing, and a
//! pod is never refused for it (beyond the machine having too few of it).
//! A *wish* breaks ties the same way, for a hint no per-node count expresses:
//! a tier pod's memory on the memory-only nodes nearest the mask (`memory`).
//!
//! With `align-by-socket`, a CPU-carrying mask is also preferred when it spans no
//! more sockets than the narrowest width needs (the kubelet's `isHintSocketAligned`).
//! The kubelet refuses `align-by-socket` with `single-numa-node`; since a pod may
//! choose that policy itself, the option is ignored under it instead.

use crate::pod::TopologyPolicy;

use super::hints::{self, Kind, Provider};
use super::machine::{bits, Machine, Mask};
use super::{fmt_amount, RejectReason, Rejection};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Affinity {
    pub mask: Mask,
    pub preferred: bool,
}

pub(crate) struct MergeOptions {
    pub prefer_closest: bool,
    pub align_by_socket: bool,
}

fn distance_sum(m: &Machine<'_>, mask: Mask) -> u64 {
    let mut s = 0u64;
    for a in bits(mask) {
        for b in bits(mask) {
            if a < b {
                s += u64::from(m.distance(a, b));
            }
        }
    }
    s
}

pub(crate) fn merge(
    m: &Machine<'_>,
    providers: &[Provider],
    policy: TopologyPolicy,
    opts: &MergeOptions,
    wish: Option<Wish<'_>>,
) -> Result<Affinity, Rejection> {
    if providers.iter().any(|p| p.relaxed) {
        let (relaxed, strict): (Vec<Provider>, Vec<Provider>) = providers.iter().cloned().partition(|p| p.relaxed);
        return merge_strict(m, &strict, &relaxed, policy, opts, wish);
    }
    merge_strict(m, providers, &[], policy, opts, wish)
}

/// A hint that only breaks ties, as a relaxed provider's does, but that no
/// per-node count expresses: a tier pod's (`memory::near_holds`).
pub(crate) type Wish<'a> = &'a dyn Fn(Mask) -> bool;

/// The merge over `providers`, with `relaxed` and `wish` only breaking ties (module docs).
fn merge_strict(
    m: &Machine<'_>,
    providers: &[Provider],
    relaxed: &[Provider],
    policy: TopologyPolicy,
    opts: &MergeOptions,
    wish: Option<Wish<'_>>,
) -> Result<Affinity, Rejection> {
    if providers.is_empty() {
        // Nobody cares: the kubelet's default hint, every node, preferred.
        return Ok(Affinity { mask: m.all_nodes(), preferred: true });
    }
    // How many tie-breaking hints a mask misses.
    let misses = |x: Mask| relaxed.iter().filter(|p| !p.feasible(x)).count() + usize::from(wish.is_some_and(|w| !w(x)));
    // The first single node that fits every provider, one that misses no tie-breaking hint first.
    let first_single = || {
        let fits = |x: &Mask| providers.iter().all(|p| p.feasible(*x));
        let singles = hints::single_nodes(m);
        let aligned = singles.iter().copied().find(|&x| fits(&x) && misses(x) == 0);
        aligned.or_else(|| singles.into_iter().find(fits))
    };
    if policy == TopologyPolicy::SingleNumaNode {
        let all_single = providers.iter().all(|p| p.min_width == 1);
        if all_single {
            if let Some(mask) = first_single() {
                return Ok(Affinity { mask, preferred: true });
            }
        }
        return Err(Rejection { reason: RejectReason::TopologyAffinity, message: diagnose_single(m, providers) });
    }
    let target = providers.iter().map(|p| p.min_width).max().unwrap_or(1);
    let min_sockets = providers.iter().find(|p| p.kind == Kind::Cpu).and_then(|p| {
        let per_socket = m.n / m.sockets.len().max(1);
        (opts.align_by_socket && per_socket > 0).then(|| p.min_width.div_ceil(per_socket))
    });
    if target == 1 {
        // Fast path: a feasible single node is preferred and as narrow as any
        // mask can be; the lowest index wins ties, as in the full search.
        if let Some(mask) = first_single() {
            return Ok(Affinity { mask, preferred: true });
        }
    }
    let refs: Vec<&Provider> = providers.iter().collect();
    // With relaxed providers, also the masks grown for all of them together.
    let all: Vec<&Provider> = providers.iter().chain(relaxed).collect();
    let family = |width: usize| {
        let mut masks = hints::candidates(m, &refs, width);
        if !relaxed.is_empty() {
            masks.extend(hints::candidates(m, &all, width));
        }
        masks
    };
    // Masks of the preferred width first: a preferred one there beats anything
    // wider, so the full family is only built when none fits.
    let fine = |b: &Option<(Affinity, usize)>| {
        b.is_some_and(|(b, misfits)| b.preferred && b.mask.count_ones() as usize == target && misfits == 0)
    };
    let mut best = best_of(m, providers, &misses, target, min_sockets, opts, family(target));
    if !fine(&best) {
        best = best_of(m, providers, &misses, target, min_sockets, opts, family(m.n));
    }
    let best = best.map_or(Affinity { mask: m.all_nodes(), preferred: false }, |(b, _)| b);
    if policy == TopologyPolicy::Restricted && !best.preferred {
        return Err(Rejection {
            reason: RejectReason::TopologyAffinity,
            message: diagnose_restricted(m, providers, target, best),
        });
    }
    Ok(best)
}

/// The best feasible mask among `masks` in the kubelet's order (module docs),
/// and how many tie-breaking hints it `misses`.
fn best_of(
    m: &Machine<'_>,
    providers: &[Provider],
    misses: &dyn Fn(Mask) -> usize,
    target: usize,
    min_sockets: Option<usize>,
    opts: &MergeOptions,
    masks: impl IntoIterator<Item = Mask>,
) -> Option<(Affinity, usize)> {
    // (class, width or distance to the target, relaxed misfits, closeness, mask): smaller is better.
    type Rank = (u8, usize, usize, u64, Mask);
    let mut best: Option<(Affinity, Rank)> = None;
    for mask in masks {
        if !providers.iter().all(|p| p.feasible(mask)) {
            continue;
        }
        let w = mask.count_ones() as usize;
        let aligned = min_sockets.is_some_and(|s| w >= target && m.sockets_of(mask) == s);
        let preferred = w == target || aligned;
        let closeness = if opts.prefer_closest { distance_sum(m, mask) } else { 0 };
        let misfits = misses(mask);
        let key = if preferred {
            (0, w, misfits, closeness, mask)
        } else if w >= target {
            (1, w, misfits, closeness, mask)
        } else {
            (2, target - w, misfits, closeness, mask)
        };
        let better = match &best {
            Some((_, k)) => key < *k,
            None => true,
        };
        if better {
            best = Some((Affinity { mask, preferred }, key));
        }
    }
    best.map(|(a, k)| (a, k.2))
}

fn node_list(m: &Machine<'_>, mask: Mask) -> String {
    bits(mask).map(|i| m.node_id(i).to_string()).collect::<Vec<_>>().join(",")
}

fn diagnose_single(m: &Machine<'_>, providers: &[Provider]) -> String {
    for p in providers {
        // The node with the most free, lowest index on ties.
        let (best, free) = (0..m.n).map(|i| (i, p.free[i].saturating_add(p.anywhere_free))).fold((0, 0), |acc, x| {
            if x.1 > acc.1 {
                x
            } else {
                acc
            }
        });
        if p.min_width > 1 {
            let (big, total) = (0..m.n)
                .map(|i| (i, p.total[i].saturating_add(p.anywhere_total)))
                .fold((0, 0), |acc, x| if x.1 > acc.1 { x } else { acc });
            return format!(
                "no single NUMA node can hold {} {}; the largest, node {}, has {}",
                fmt_amount(p.kind, p.request),
                p.what,
                m.node_id(big),
                fmt_amount(p.kind, total)
            );
        }
        if free < p.request {
            return format!(
                "no single NUMA node has {} free {}; best is node {} with {}",
                fmt_amount(p.kind, p.request),
                p.what,
                m.node_id(best),
                fmt_amount(p.kind, free)
            );
        }
    }
    let parts: Vec<String> = providers
        .iter()
        .map(|p| {
            let fits: Mask = (0..m.n).filter(|&i| p.feasible(1 << i)).fold(0, |a, i| a | (1 << i));
            format!("{} fit on node(s) {}", p.what, node_list(m, fits))
        })
        .collect();
    format!("no single NUMA node fits every request: {}", parts.join("; "))
}

fn diagnose_restricted(m: &Machine<'_>, providers: &[Provider], target: usize, best: Affinity) -> String {
    let mut msg = format!("no set of {target} NUMA node(s) has every request free");
    if best.mask != m.all_nodes() || providers.iter().all(|p| p.feasible(best.mask)) {
        msg.push_str(&format!("; the narrowest that does is nodes {}", node_list(m, best.mask)));
    }
    for p in providers {
        let free = p.free_total();
        if free < p.request {
            msg.push_str(&format!(
                "; {} {} requested, {} free on the machine",
                fmt_amount(p.kind, p.request),
                p.what,
                fmt_amount(p.kind, free)
            ));
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::machine::Free;
    use crate::engine::{Allocations, NodeSettings};

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
        /// The polynomial candidates against an exhaustive search over every subset
        /// of NUMA nodes (the kubelet's), on machines of up to 8 nodes: same width
        /// and preference for one resource, same mask for answers of 1-2 nodes,
        /// always a mask that fits.
        #[test]
        fn candidates_match_exhaustive_search(
            packs in 1u32..=2, nodes in 1u32..=4, cores in 1u32..=4,
            taken in proptest::collection::vec(any::<bool>(), 32),
            request in 1u64..=24, mem_gib in 0u64..=200,
            closest in any::<bool>(), align in any::<bool>(),
        ) {
            let t = crate::topology::synthetic::parse(&format!("pack:{packs} numa:{nodes} core:{cores} pu:1")).expect("test input");
            let s = NodeSettings::default();
            let m = Machine::new(&t, &s).expect("test input");
            let mut free = Free::new(&m, &Allocations::default(), false);
            for (i, &b) in taken.iter().enumerate() {
                if b { free.assignable.remove(i as u32); }
            }
            let node_totals: Vec<u64> = m.node_cpus.iter().map(|c| c.len() as u64).collect();
            let fr = m.node_cpus.iter().map(|c| c.intersection(&free.assignable).len() as u64).collect();
            let mut ps = vec![Provider::new(Kind::Cpu, "cpu".into(), request, node_totals, fr, (0, 0))];
            if mem_gib > 0 {
                let total = vec![64 << 30; m.n];
                let fr: Vec<u64> = (0..m.n).map(|i| (64u64 << 30) - (((i as u64 * 13) % 64) << 30)).collect();
                ps.push(Provider::new(Kind::Memory, "memory".into(), mem_gib << 30, total, fr, (0, 0)));
            }
            let opts = MergeOptions { prefer_closest: closest, align_by_socket: align };
            let target = ps.iter().map(|p| p.min_width).max().expect("test input");
            let min_sockets = (align && m.n / m.sockets.len() > 0).then(|| ps[0].min_width.div_ceil(m.n / m.sockets.len()));
            let refs: Vec<&Provider> = ps.iter().collect();
            let fast = best_of(&m, &ps, &|_| 0, target, min_sockets, &opts, hints::candidates(&m, &refs, m.n)).map(|b| b.0);
            let exhaustive = best_of(&m, &ps, &|_| 0, target, min_sockets, &opts, 1..=m.all_nodes()).map(|b| b.0);
            let shape = |a: Option<Affinity>| a.map(|a| (a.preferred, a.mask.count_ones()));
            if ps.len() == 1 {
                prop_assert_eq!(shape(fast), shape(exhaustive));
            }
            prop_assert_eq!(fast.is_some(), exhaustive.is_some());
            if let Some(a) = fast {
                prop_assert!(ps.iter().all(|p| p.feasible(a.mask)));
                if a.mask.count_ones() <= 2 && shape(fast) == shape(exhaustive) && !closest {
                    // Narrow answers are the exhaustive (kubelet) answer exactly.
                    prop_assert_eq!(fast, exhaustive);
                }
            }
        }
    }
}
