//! Choosing exclusive CPUs: the kubelet's `takeByTopologyNUMAPacked` and
//! `takeByTopologyNUMADistributed` (`pkg/kubelet/cm/cpumanager/cpu_assignment.go`).
//!
//! Packed (the default): whole sockets, then whole NUMA nodes (the other way round
//! when a NUMA node spans several sockets), then, under
//! `prefer-align-cpus-by-uncorecache`, whole last-level-cache groups and a
//! group that holds the rest exactly, then whole cores, then single threads.
//! Among candidates, groups with fewer free CPUs come first (fill what is already
//! partly used, as the kubelet does) and lower ids break ties, so on an empty
//! machine the lowest ids win: 4 CPUs on the 112-CPU seed machine are the two
//! whole cores `0,1,56,57`. Under `distribute-cpus-across-cores` (the kubelet's
//! spread order) whole cores are not taken first and the single threads come
//! socket by socket in id order, so a core's second thread comes after every
//! first thread of its socket.
//!
//! Distributed (`distribute-cpus-across-numa`), as the kubelet decides it: CPUs
//! go in groups (a core's threads under `full-pcpus-only`, else one CPU; a
//! request that is not a whole number of groups is packed). The number of NUMA
//! nodes tried runs from the fewest that could hold the request (by the
//! machine's groups per node) to the request's groups or the nodes with free
//! CPUs, whichever is smaller; the first count with a usable combination wins.
//! A combination is usable when its nodes hold the request, in groups, and each
//! node holds the even share (whole groups); the groups left over go one at a
//! time, round robin, to a subset of its nodes that still have a group free.
//! The most balanced choice wins: the lowest spread of free CPUs over the nodes
//! that had free CPUs, after the allocation; on a tie the first in the kubelet's
//! order (nodes sorted by free CPUs then id, within sockets sorted the same way
//! when sockets hold several nodes; combinations and subsets in that order,
//! larger subsets first). Each node's share is then taken packed.
//!
//! The kubelet tries every combination; here the spread is compared as an exact
//! integer (the sum of squares: the total free after allocation is the same for
//! every choice), and where the combinations are many a closed form gives the
//! same answer: with the totals fixed, the lowest spread takes the nodes with
//! the most free CPUs and gives the leftover groups to the largest of them
//! (equal to the enumeration wherever the closed form says it is exact: the
//! property test below checks it on small machines). Two differences remain, both
//! deliberate: the kubelet rounds the standard deviation to 0.001, so two
//! nearly equal spreads tie there and the earlier wins; and on a machine with
//! more combinations than [`ENUMERATION_BUDGET`], when a leftover group would
//! balance better as a second group on one node than as the first on another,
//! the closed form still gives each node at most one.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::idset::CpuSet;

use super::machine::Machine;
/// Groups at one level of the hierarchy (NUMA nodes or sockets) as
/// (free CPUs, index), ordered by free CPUs ascending, then index; empty ones left out.
fn sorted_groups(m: &Machine<'_>, numa: bool, avail: &CpuSet) -> Vec<(usize, usize)> {
    let (map, len) = if numa { (&m.cpu_node, m.n) } else { (&m.cpu_socket, m.sockets.len()) };
    let mut free = vec![0usize; len];
    for id in avail.iter() {
        if let Some(&g) = map.get(id as usize) {
            if g != u32::MAX {
                free[g as usize] += 1;
            }
        }
    }
    let mut v: Vec<(usize, usize)> =
        free.into_iter().enumerate().map(|(i, f)| (f, i)).filter(|&(f, _)| f > 0).collect();
    v.sort_unstable();
    v
}

/// How a packed take orders what it takes (the CPU-manager options).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Strategy {
    /// `distribute-cpus-across-cores`: no whole cores first; single threads
    /// socket by socket in id order.
    pub spread: bool,
    /// `prefer-align-cpus-by-uncorecache`: whole last-level-cache groups, then
    /// one group that holds the rest, before cores.
    pub uncore: bool,
}

/// Takes `n` CPUs out of `avail` (which must hold at least `n`), packed.
pub(crate) fn take_packed(m: &Machine<'_>, avail: &CpuSet, n: usize, how: Strategy) -> CpuSet {
    let mut avail = avail.clone();
    let mut taken = CpuSet::new();
    let mut need = n;
    if need == 0 {
        return taken;
    }
    // 1. Whole groups at the first, then the second level.
    for numa in [m.numa_first, !m.numa_first] {
        let groups = if numa { &m.node_cpus } else { &m.sockets };
        for (free, i) in sorted_groups(m, numa, &avail) {
            let g = &groups[i];
            if free == g.len() && free <= need {
                taken.union_with(g);
                avail.difference_with(g);
                need -= free;
            }
        }
        if need == 0 {
            return taken;
        }
    }
    if how.uncore && !m.uncores.is_empty() {
        take_uncore(m, &mut avail, &mut taken, &mut need);
        if need == 0 {
            return taken;
        }
    }
    if how.spread {
        for id in spread_order(m, &avail) {
            let _ = taken.insert(id); // a CPU of `m`: within capacity (`Machine::new`)
            need -= 1;
            if need == 0 {
                break;
            }
        }
        return taken;
    }
    // 2. Whole cores, then 3. single threads, both in the order: outer group
    // (fewest free first), inner group, core (fewest free first), id.
    for core in core_order(m, &avail) {
        let c = m.core(core);
        if c.iter().all(|&id| avail.contains(id)) && c.len() <= need {
            for &id in c {
                // A CPU of `m`, so within the set's capacity (`Machine::new`).
                let _ = taken.insert(id);
                avail.remove(id);
            }
            need -= c.len();
            if need == 0 {
                return taken;
            }
        }
    }
    for core in core_order(m, &avail) {
        for &id in m.core(core).iter().filter(|&&id| avail.contains(id)) {
            let _ = taken.insert(id); // a CPU of `m`, as above
            need -= 1;
            if need == 0 {
                return taken;
            }
        }
    }
    taken
}

/// The kubelet puts NUMA nodes above sockets when there are at least as many
/// sockets as nodes with CPUs (its `numaFirst`).
fn kubelet_numa_first(m: &Machine<'_>) -> bool {
    m.sockets.len() >= m.node_cpus.iter().filter(|s| !s.is_empty()).count()
}

/// Node indexes with free CPUs in the kubelet's `sortAvailableNUMANodes`
/// order: by free CPUs, then id; when sockets hold several nodes, the sockets
/// first in that order and their nodes within.
fn numa_order(m: &Machine<'_>, free: &[u64]) -> Vec<usize> {
    let mut nodes: Vec<usize> = (0..m.n).filter(|&i| free[i] > 0).collect();
    if kubelet_numa_first(m) {
        nodes.sort_unstable_by_key(|&i| (free[i], m.node_id(i)));
        return nodes;
    }
    let mut sock_free = vec![0u64; m.sockets.len()];
    for &i in &nodes {
        if let Some(f) = sock_free.get_mut(m.node_socket[i] as usize) {
            *f += free[i];
        }
    }
    let sock = |i: usize| m.node_socket[i] as usize;
    nodes.sort_unstable_by_key(|&i| (sock_free.get(sock(i)).copied().unwrap_or(0), sock(i), free[i], m.node_id(i)));
    nodes
}

/// The kubelet's spread order (`sortAvailableCPUsSpread`): sockets as
/// `sortAvailableSockets`, each socket's free CPUs by id.
fn spread_order(m: &Machine<'_>, avail: &CpuSet) -> Vec<u32> {
    let mut sock_free = vec![0u64; m.sockets.len()];
    for id in avail.iter() {
        if let Some(&s) = m.cpu_socket.get(id as usize).filter(|&&s| s != u32::MAX) {
            sock_free[s as usize] += 1;
        }
    }
    let by_free = |s: &usize| (sock_free[*s], *s);
    let mut sockets: Vec<usize> = Vec::new();
    if kubelet_numa_first(m) {
        for node in numa_order(m, &m.per_node(avail)) {
            // The sockets holding this node's free CPUs (the kubelet's `SocketsInNUMANodes`).
            let free_here = avail.intersection(&m.node_cpus[node]);
            let mut here: Vec<usize> =
                (0..m.sockets.len()).filter(|&s| !m.sockets[s].is_disjoint(&free_here)).collect();
            here.sort_unstable_by_key(by_free);
            sockets.extend(here.into_iter().filter(|s| !sockets.contains(s)).collect::<Vec<_>>());
        }
    } else {
        sockets = (0..m.sockets.len()).filter(|&s| sock_free[s] > 0).collect();
        sockets.sort_unstable_by_key(by_free);
    }
    sockets.into_iter().flat_map(|s| avail.intersection(&m.sockets[s]).to_vec()).collect()
}

/// Last-level-cache groups with a free CPU in the kubelet's order
/// (`sortAvailableUncoreCaches`): NUMA nodes as `numa_order`, each node's
/// groups by free CPUs, then index.
fn uncore_order(m: &Machine<'_>, avail: &CpuSet) -> Vec<usize> {
    let mut free = vec![0u64; m.uncores.len()];
    let mut in_node: std::collections::BTreeSet<(usize, usize)> = Default::default();
    for id in avail.iter() {
        let (u, node) = (m.cpu_uncore[id as usize], m.cpu_node[id as usize]);
        if u != u32::MAX && node != u32::MAX {
            free[u as usize] += 1;
            in_node.insert((node as usize, u as usize));
        }
    }
    let mut out = Vec::new();
    for node in numa_order(m, &m.per_node(avail)) {
        let mut here: Vec<usize> = in_node.range((node, 0)..(node + 1, 0)).map(|&(_, u)| u).collect();
        here.sort_unstable_by_key(|&u| (free[u], u));
        out.extend(here);
    }
    out
}

/// The kubelet's `takeUncoreCache`: whole free groups the need covers (while
/// it is at least a group's worth), then one group whose first free cores hold
/// exactly what is left.
fn take_uncore(m: &Machine<'_>, avail: &mut CpuSet, taken: &mut CpuSet, need: &mut usize) {
    let per_group = m.all_cpus.len() / m.uncores.len().max(1);
    let tpc = m.threads_per_core.max(1);
    let mut take = |set: &CpuSet, avail: &mut CpuSet, need: &mut usize| {
        taken.union_with(set);
        avail.difference_with(set);
        *need -= set.len();
    };
    for u in uncore_order(m, avail) {
        if *need >= per_group {
            for v in uncore_order(m, avail) {
                let g = &m.uncores[v];
                if g.is_subset(avail) && g.len() <= *need {
                    take(g, avail, need);
                }
            }
        }
        if *need == 0 {
            return;
        }
        // The group's first free cores (by core) that could hold the rest; an
        // odd rest on SMT leaves out the last thread.
        let here = avail.intersection(&m.uncores[u]);
        let mut cores: Vec<u32> = here.iter().map(|id| m.cpu_core[id as usize]).collect();
        cores.sort_unstable();
        cores.dedup();
        cores.truncate(need.div_ceil(tpc));
        let mut cpus: Vec<u32> =
            here.iter().filter(|&id| cores.binary_search(&m.cpu_core[id as usize]).is_ok()).collect();
        if !need.is_multiple_of(2) && tpc > 1 && cpus.len() > *need {
            cpus.pop();
        }
        if cpus.len() == *need {
            let set = CpuSet::from_ids(cpus).unwrap_or_default(); // CPUs of `m`: within capacity
            take(&set, avail, need);
            return;
        }
    }
}

/// A core's sort key: outer group (free CPUs, index), inner group (free, index),
/// the core's free CPUs, its index.
type CoreKey = (usize, usize, usize, usize, usize, usize);

/// Cores holding a free CPU, ordered as the kubelet's `sortAvailableCores`.
/// Lazily: a request takes a few of thousands of cores, so a heap (built in
/// linear time) yields them in order instead of a full sort.
fn core_order(m: &Machine<'_>, avail: &CpuSet) -> impl Iterator<Item = usize> {
    // Free CPUs per core, per node and per socket, counted in one pass.
    let mut core_free = vec![0usize; m.core_count()];
    // Slot `m.n` holds the CPUs in no node, ordered as one more node.
    let node_slot = |i: usize| match m.cpu_node[i] {
        u32::MAX => m.n,
        k => k as usize,
    };
    let mut node_free = vec![0usize; m.n + 1];
    let mut sock_free = vec![0usize; m.sockets.len()];
    for id in avail.iter() {
        let i = id as usize;
        if i >= m.cpu_core.len() || m.cpu_core[i] == u32::MAX {
            continue;
        }
        core_free[m.cpu_core[i] as usize] += 1;
        node_free[node_slot(i)] += 1;
        sock_free[m.cpu_socket[i] as usize] += 1;
    }
    let v: Vec<Reverse<CoreKey>> = (0..m.core_count())
        .filter(|&i| core_free[i] > 0)
        .filter_map(|i| {
            let first = *m.core(i).first()? as usize;
            let (node, sock) = (node_slot(first), m.cpu_socket[first] as usize);
            let (outer, inner) = if m.numa_first {
                ((node_free[node], node), (sock_free[sock], sock))
            } else {
                ((sock_free[sock], sock), (node_free[node], node))
            };
            Some(Reverse((outer.0, outer.1, inner.0, inner.1, core_free[i], i)))
        })
        .collect();
    let mut heap = BinaryHeap::from(v);
    std::iter::from_fn(move || heap.pop().map(|Reverse(t)| t.5))
}

/// Most (combination, leftover subset) pairs the exact enumeration may visit
/// for one node count before the closed form answers instead.
pub(crate) const ENUMERATION_BUDGET: u64 = 1 << 16;

/// A distributed choice, by position in the kubelet's node order: the nodes
/// that get the even share, and the subset that gets the leftover groups (in
/// turn, from its first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    pub combo: Vec<usize>,
    pub subset: Vec<usize>,
}

/// Takes `n` CPUs out of `avail`, spread over NUMA nodes in groups of `group`
/// CPUs, as the kubelet's `takeByTopologyNUMADistributed` does.
pub(crate) fn take_distributed(m: &Machine<'_>, avail: &CpuSet, n: usize, group: usize, how: Strategy) -> CpuSet {
    let group = group.max(1);
    let within = Strategy { uncore: false, ..how };
    if n == 0 || !n.is_multiple_of(group) || avail.len() < n {
        return take_packed(m, avail, n, within);
    }
    let free = m.per_node(avail);
    let order = numa_order(m, &free);
    let a: Vec<u64> = order.iter().map(|&i| free[i]).collect();
    let (n64, g64) = (n as u64, group as u64);
    let (lo, hi) = node_range(m, order.len(), n, group);
    for k in lo..=hi {
        let choice = if work(a.len(), k) <= ENUMERATION_BUDGET {
            enumerate(&a, n64, g64, k)
        } else {
            closed_form(&a, n64, g64, k).map(|(c, _exact)| c)
        };
        if let Some(c) = choice {
            return allocate(m, avail, &order, &c, n, group, within);
        }
    }
    take_packed(m, avail, n, within)
}

/// The kubelet's `rangeNUMANodesNeededToSatisfy`: from the request's groups
/// over the machine's groups per node (rounded up), to the request's groups or
/// the nodes with free CPUs.
fn node_range(m: &Machine<'_>, available: usize, n: usize, g: usize) -> (usize, usize) {
    let nodes = m.node_cpus.iter().filter(|s| !s.is_empty()).count().max(1);
    let groups = (m.all_cpus.len().max(1) - 1) / g + 1;
    let per_node = (groups - 1) / nodes + 1;
    let needed = (n - 1) / g + 1;
    ((needed - 1) / per_node + 1, needed.min(available))
}

/// An upper bound of the enumeration's work for `k` of `len` nodes:
/// C(len, k) combinations times 2^k leftover subsets, saturating.
fn work(len: usize, k: usize) -> u64 {
    let mut c: u64 = 1;
    for i in 0..k.min(len) as u64 {
        c = match c.checked_mul(len as u64 - i) {
            Some(v) => v / (i + 1),
            None => return u64::MAX,
        };
    }
    c.saturating_mul(1u64.checked_shl(k.min(63) as u32).unwrap_or(u64::MAX))
}

/// Calls `f` with every `k`-subset of `0..len`, in lexicographic order (the
/// kubelet's `iterateCombinations`).
fn combinations(len: usize, k: usize, mut f: impl FnMut(&[usize])) {
    if k == 0 || k > len {
        return;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        f(&idx);
        let Some(i) = (0..k).rev().find(|&i| idx[i] < len - k + i) else { return };
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// The spread the kubelet minimizes, as an exact integer: the sum of squares
/// of free CPUs per node (the total is the same for every choice, so it orders
/// choices as the standard deviation does).
fn spread(x: &[u64]) -> u128 {
    x.iter().map(|&v| u128::from(v) * u128::from(v)).sum()
}

/// Hands `rem` CPUs in groups of `g` to `subset` in turn, skipping nodes with
/// less than a group left; None when the subset cannot take them.
fn give_leftover(after: &[u64], subset: &[usize], mut rem: u64, g: u64) -> Option<Vec<u64>> {
    if subset.iter().map(|&i| after[i]).sum::<u64>() < rem {
        return None;
    }
    let mut x = after.to_vec();
    while rem > 0 {
        let before = rem;
        for &i in subset {
            if rem == 0 {
                break;
            }
            if x[i] >= g {
                x[i] -= g;
                rem -= g;
            }
        }
        // The kubelet would spin here; no such subset is usable.
        if rem == before {
            return None;
        }
    }
    Some(x)
}

/// The even share of `n` over `k` nodes in whole groups, when `combo` (free
/// CPUs `a` by position) can hold the request: the kubelet's three checks.
fn share(a: &[u64], combo: &[usize], n: u64, g: u64) -> Option<u64> {
    let total: u64 = combo.iter().map(|&i| a[i]).sum();
    let groups: u64 = combo.iter().map(|&i| a[i] / g).sum();
    let d = n / combo.len() as u64 / g * g;
    (total >= n && groups * g >= n && combo.iter().all(|&i| a[i] >= d)).then_some(d)
}

/// The kubelet's choice for `k` nodes, by trying every combination and every
/// leftover subset; `a` is free CPUs by position in its node order.
pub(crate) fn enumerate(a: &[u64], n: u64, g: u64, k: usize) -> Option<Choice> {
    let mut best: Option<(u128, Choice)> = None;
    combinations(a.len(), k, |combo| {
        let Some(d) = share(a, combo, n, g) else { return };
        let mut after = a.to_vec();
        for &i in combo {
            after[i] -= d;
        }
        let rem = n - d * k as u64;
        let mut local: Option<(u128, Vec<usize>)> = None;
        if rem == 0 {
            local = Some((spread(&after), Vec::new()));
        } else {
            let room: Vec<usize> = combo.iter().copied().filter(|&i| after[i] >= g).collect();
            for s in (1..=room.len()).rev() {
                combinations(room.len(), s, |sub| {
                    let subset: Vec<usize> = sub.iter().map(|&j| room[j]).collect();
                    if let Some(x) = give_leftover(&after, &subset, rem, g) {
                        let v = spread(&x);
                        if local.as_ref().is_none_or(|(b, _)| v < *b) {
                            local = Some((v, subset));
                        }
                    }
                });
            }
        }
        if let Some((v, subset)) = local {
            if best.as_ref().is_none_or(|(b, _)| v < *b) {
                best = Some((v, Choice { combo: combo.to_vec(), subset }));
            }
        }
    });
    best.map(|(_, c)| c)
}

/// The same choice without the enumeration: the `k` nodes with the most free
/// CPUs (the earliest among equals), the leftover groups one each to those of
/// them with the most room (the earliest among equals, and the subset the
/// kubelet meets first that starts with them). The flag says whether this is
/// provably the kubelet's choice: always without leftover; with leftover when
/// no node would do better with a second leftover group than the last node
/// given a first one (its room exceeds that node's by less than a group).
pub(crate) fn closed_form(a: &[u64], n: u64, g: u64, k: usize) -> Option<(Choice, bool)> {
    if k == 0 || k > a.len() {
        return None;
    }
    let mut by_free: Vec<usize> = (0..a.len()).collect();
    by_free.sort_unstable_by(|&x, &y| a[y].cmp(&a[x]).then(x.cmp(&y)));
    let mut combo = by_free[..k].to_vec();
    combo.sort_unstable();
    let d = share(a, &combo, n, g)?;
    let rem = n - d * k as u64;
    if rem == 0 {
        return Some((Choice { combo, subset: Vec::new() }, true));
    }
    let y = |i: usize| a[i] - d;
    let room: Vec<usize> = combo.iter().copied().filter(|&i| y(i) >= g).collect();
    let r = (rem / g) as usize;
    if room.len() < r {
        // Only several groups on one node can hold the leftover: the kubelet's
        // first usable subset, not proved best.
        let after: Vec<u64> = (0..a.len()).map(|i| if combo.contains(&i) { y(i) } else { a[i] }).collect();
        give_leftover(&after, &room, rem, g)?;
        return Some((Choice { combo, subset: room }, false));
    }
    let mut by_room = room.clone();
    by_room.sort_unstable_by(|&x, &z| y(z).cmp(&y(x)).then(x.cmp(&z)));
    let mut first = by_room[..r].to_vec();
    first.sort_unstable();
    let last = first[r - 1];
    let lowest = first.iter().map(|&i| y(i)).min().unwrap_or(0);
    let exact = combo.iter().all(|&i| y(i) < 2 * g || y(i).saturating_sub(lowest) < g);
    let subset = first.into_iter().chain(room.into_iter().filter(|&i| i > last)).collect();
    Some((Choice { combo, subset }, exact))
}

/// Takes the chosen shares: the even share packed on each node of the
/// combination, then the leftover groups in turn, each packed on its node.
fn allocate(m: &Machine<'_>, avail: &CpuSet, order: &[usize], c: &Choice, n: usize, g: usize, how: Strategy) -> CpuSet {
    let d = n / c.combo.len() / g * g;
    let mut taken = CpuSet::new();
    for &p in &c.combo {
        taken.union_with(&take_packed(m, &avail.intersection(&m.node_cpus[order[p]]), d, how));
    }
    let mut rem = n - d * c.combo.len();
    while rem > 0 {
        let before = rem;
        for &p in &c.subset {
            if rem == 0 {
                break;
            }
            let left = avail.intersection(&m.node_cpus[order[p]]).difference(&taken);
            if left.len() >= g {
                taken.union_with(&take_packed(m, &left, g, how));
                rem -= g;
            }
        }
        if rem == before {
            break;
        }
    }
    if taken.len() < n {
        // Only when the shares could not be placed (the choice checked that
        // they can); top up packed.
        let more = take_packed(m, &avail.difference(&taken), n - taken.len(), how);
        taken.union_with(&more);
    }
    taken
}

/// CPUs of `avail` whose whole core is in `avail` (`full-pcpus-only`).
pub(crate) fn whole_core_cpus(m: &Machine<'_>, avail: &CpuSet) -> CpuSet {
    let mut s = CpuSet::new();
    for i in 0..m.core_count() {
        let c = m.core(i);
        if !c.is_empty() && c.iter().all(|&id| avail.contains(id)) {
            for &id in c {
                let _ = s.insert(id); // a CPU of `m`: within capacity (`Machine::new`)
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{closed_form, enumerate, Choice};

    /// Free CPUs per node (in the kubelet's order: ascending, as `numa_order`
    /// sorts them, though the proof does not need it), in whole groups.
    fn machine() -> impl Strategy<Value = (Vec<u64>, u64, u64, usize)> {
        (1usize..=6, prop_oneof![Just(1u64), Just(2u64)]).prop_flat_map(|(len, g)| {
            (prop::collection::vec(1u64..=8, len), Just(g), 1u64..=48, 1usize..=len).prop_map(
                move |(groups, g, n, k)| {
                    let mut a: Vec<u64> = groups.iter().map(|x| x * g).collect();
                    a.sort_unstable();
                    let total: u64 = a.iter().sum();
                    let n = (n % (total / g) + 1) * g;
                    // The kubelet never tries more nodes than groups requested.
                    let k = k.min((n / g) as usize);
                    (a, g, n, k)
                },
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        /// Wherever the closed form says it is exact, it is the enumeration's
        /// (the kubelet's) choice; and both find a choice or neither does.
        #[test]
        fn closed_form_is_the_enumeration((a, g, n, k) in machine()) {
            let exact = enumerate(&a, n, g, k);
            let closed = closed_form(&a, n, g, k);
            prop_assert_eq!(exact.is_some(), closed.is_some(), "a={:?} n={} g={} k={}", a, n, g, k);
            if let Some((c, true)) = closed {
                prop_assert_eq!(exact, Some(c), "a={:?} n={} g={} k={}", a, n, g, k);
            }
        }
    }

    /// The cases the closed form proves are most of them, and it is not
    /// vacuous: count them over a fixed grid.
    #[test]
    fn closed_form_proves_most_choices() {
        let (mut proved, mut all) = (0, 0);
        for x in 1u64..=6 {
            for y in x..=6 {
                for z in y..=6 {
                    let a = [x, y, z];
                    for n in 1..=a.iter().sum() {
                        for k in 1..=n.min(3) as usize {
                            if let Some((c, proof)) = closed_form(&a, n, 1, k) {
                                all += 1;
                                if proof {
                                    proved += 1;
                                    assert_eq!(enumerate(&a, n, 1, k), Some(c), "a={a:?} n={n} k={k}");
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(proved * 10 >= all * 8, "{proved} of {all} proved");
    }

    /// The kubelet's balance on four nodes with 6, 8, 8, 8 free CPUs: 9 CPUs
    /// over two nodes go to the two fullest of the tied ones (positions 1 and
    /// 2, the first in order), the leftover CPU to the first of them.
    #[test]
    fn leftover_goes_to_the_first_of_the_fullest() {
        let a = [6, 8, 8, 8];
        let want = Choice { combo: vec![1, 2], subset: vec![1, 2] };
        assert_eq!(enumerate(&a, 9, 1, 2), Some(want.clone()));
        assert_eq!(closed_form(&a, 9, 1, 2), Some((want, true)));
    }
}
