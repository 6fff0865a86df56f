//! Choosing exclusive CPUs: the kubelet's `takeByTopology`, packed and distributed.
//!
//! Packed (the default): whole sockets, then whole NUMA nodes (the other way round
//! when a NUMA node spans several sockets), then whole cores, then single threads.
//! Among candidates, groups with fewer free CPUs come first (fill what is already
//! partly used, as the kubelet does) and lower ids break ties, so on an empty
//! machine the lowest ids win: 4 CPUs on the 112-CPU seed machine are the two
//! whole cores `0,1,56,57`.
//!
//! Distributed (`distribute-cpus-across-numa`): a request that fits one NUMA node
//! is packed there; a larger one is split evenly (in whole cores under
//! `full-pcpus-only`) across the fewest NUMA nodes that hold it, the nodes with the
//! most free CPUs first. Unlike the kubelet, which tries every combination of
//! nodes, the nodes are chosen greedily, so the cost stays polynomial.

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

/// Takes `n` CPUs out of `avail` (which must hold at least `n`), packed.
pub(crate) fn take_packed(m: &Machine<'_>, avail: &CpuSet, n: usize) -> CpuSet {
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
    // 2. Whole cores, then 3. single threads, both in the order: outer group
    // (fewest free first), inner group, core (fewest free first), id.
    let order = core_order(m, &avail);
    for &core in &order {
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
    let order = core_order(m, &avail);
    for &core in &order {
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

/// Cores holding a free CPU, ordered as the kubelet's `sortAvailableCores`.
fn core_order(m: &Machine<'_>, avail: &CpuSet) -> Vec<usize> {
    // Free CPUs per core, per node and per socket, counted in one pass.
    let mut core_free = vec![0usize; m.core_count()];
    let mut node_free = vec![0usize; m.n];
    let mut sock_free = vec![0usize; m.sockets.len()];
    for id in avail.iter() {
        let i = id as usize;
        if i >= m.cpu_core.len() || m.cpu_core[i] == u32::MAX {
            continue;
        }
        core_free[m.cpu_core[i] as usize] += 1;
        node_free[m.cpu_node[i] as usize] += 1;
        sock_free[m.cpu_socket[i] as usize] += 1;
    }
    let mut v: Vec<(usize, usize, usize, usize, usize, usize)> = (0..m.core_count())
        .filter(|&i| core_free[i] > 0)
        .filter_map(|i| {
            let first = *m.core(i).first()? as usize;
            let (node, sock) = (m.cpu_node[first] as usize, m.cpu_socket[first] as usize);
            let (outer, inner) = if m.numa_first {
                ((node_free[node], node), (sock_free[sock], sock))
            } else {
                ((sock_free[sock], sock), (node_free[node], node))
            };
            Some((outer.0, outer.1, inner.0, inner.1, core_free[i], i))
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|t| t.5).collect()
}

/// Takes `n` CPUs out of `avail`, spread over NUMA nodes in units of `group`.
pub(crate) fn take_distributed(m: &Machine<'_>, avail: &CpuSet, n: usize, group: usize) -> CpuSet {
    let group = group.max(1);
    // Free CPUs per node, in order (most free first, then index).
    let mut nodes: Vec<(usize, usize)> =
        m.per_node(avail).into_iter().enumerate().map(|(i, f)| (f as usize, i)).filter(|&(f, _)| f > 0).collect();
    nodes.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    // Fits one node: pack it on the fullest node that holds it (fewest free, as packed).
    if let Some(&(_, i)) = nodes.iter().filter(|&&(f, _)| f >= n).min_by_key(|&&(f, i)| (f, i)) {
        return take_packed(m, &m.node_cpus[i].intersection(avail), n);
    }
    // The fewest nodes (most free first) that hold the request.
    let mut k = 0;
    let mut sum = 0;
    while k < nodes.len() && sum < n {
        sum += nodes[k].0;
        k += 1;
    }
    let chosen = &nodes[..k];
    // Even shares in whole groups; the remainder one group at a time to the nodes
    // with the most room; what a node cannot hold moves to the next.
    let groups_total = n / group;
    let mut share: Vec<usize> = vec![(groups_total / k) * group; k];
    let mut rest = n - share.iter().sum::<usize>();
    let mut j = 0;
    let mut guard = 0;
    while rest > 0 && guard < 4 * n + 4 * k {
        let room = chosen[j].0.saturating_sub(share[j]);
        let step = group.min(rest).min(room);
        share[j] += step;
        rest -= step;
        j = (j + 1) % k;
        guard += 1;
    }
    // Clamp to what each node has and hand overflow to the others in order.
    let mut overflow = 0;
    for (s, &(f, _)) in share.iter_mut().zip(chosen) {
        if *s > f {
            overflow += *s - f;
            *s = f;
        }
    }
    for (s, &(f, _)) in share.iter_mut().zip(chosen) {
        let add = overflow.min(f - *s);
        *s += add;
        overflow -= add;
    }
    let mut taken = CpuSet::new();
    for (&s, &(_, i)) in share.iter().zip(chosen) {
        taken.union_with(&take_packed(m, &m.node_cpus[i].intersection(avail), s));
    }
    if taken.len() < n {
        // Only when the shares could not be placed (they always can when the
        // caller checked that `avail` holds `n`); top up packed.
        let more = take_packed(m, &avail.difference(&taken), n - taken.len());
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
