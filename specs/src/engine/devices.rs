//! Device resources: hints like kubelet device plugins, allocation aligned first.
//!
//! `NodeSettings::devices` names the PCI addresses behind each resource; the
//! topology gives each address its NUMA node. A resource whose devices have no
//! NUMA node at all gives no hint (the kubelet's "don't care"). Allocation takes
//! free devices on the affinity's nodes first, then devices without a node, then
//! the rest, by address within each group.

use super::machine::{Free, Machine, Mask};

/// Free addresses of a resource, in allocation order for `mask` (None: by address).
pub(crate) fn take(
    m: &Machine<'_>,
    free: &mut Free,
    addrs: &[String],
    count: usize,
    mask: Option<Mask>,
) -> Vec<String> {
    let mut v: Vec<(u8, &String)> = addrs
        .iter()
        .filter(|a| !free.devices_taken.contains(a.as_str()))
        .map(|a| {
            let node = m.device_node.get(a.as_str()).copied().flatten();
            let rank = match (mask, node) {
                (None, _) => 0,
                (Some(k), Some(i)) if k & (1 << i) != 0 => 0,
                (Some(_), None) => 1,
                (Some(_), Some(_)) => 2,
            };
            (rank, a)
        })
        .collect();
    v.sort();
    v.dedup();
    let out: Vec<String> = v.into_iter().take(count).map(|(_, a)| a.clone()).collect();
    free.devices_taken.extend(out.iter().cloned());
    out
}

/// Per node index: (total, free) devices of a resource, and (total, free) without a node.
pub(crate) fn counts(m: &Machine<'_>, free: &Free, addrs: &[String]) -> (Vec<u64>, Vec<u64>, (u64, u64)) {
    let mut total = vec![0u64; m.n];
    let mut fr = vec![0u64; m.n];
    let mut anywhere = (0u64, 0u64);
    let mut seen: Vec<&str> = Vec::with_capacity(addrs.len());
    for a in addrs {
        if seen.contains(&a.as_str()) {
            continue;
        }
        seen.push(a);
        let is_free = !free.devices_taken.contains(a.as_str());
        match m.device_node.get(a.as_str()).copied().flatten() {
            Some(i) => {
                total[i] += 1;
                fr[i] += u64::from(is_free);
            }
            None => {
                anywhere.0 += 1;
                anywhere.1 += u64::from(is_free);
            }
        }
    }
    (total, fr, anywhere)
}
