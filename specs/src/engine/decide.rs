//! `admit`: reads the pod's requests, builds the hint providers, runs the merge
//! for the pod (scope `pod`) or for each container in order (scope `container`),
//! then places CPUs, memory and devices. See the parent module for semantics.
//!
//! A pod with `spec.topology.memory: nearest-memory-only` gives the merge no
//! memory providers; its memory's hint, whether the memory-only nodes nearest
//! a mask hold it (`memory::near_holds`), only breaks ties between masks, and
//! under policy `none` such a pod is merged as under `best-effort` for its
//! own placement (the `memory` module docs say what each policy does).

use std::collections::BTreeMap;

use crate::idset::{CpuSet, NumaSet};
use crate::pod::{
    CpuPolicy, MemoryPlacement, Pod, TopologyPolicy, TopologyScope, HUGEPAGES_PREFIX, RESOURCE_CPU, RESOURCE_MEMORY,
};
use crate::qos::{effective_cpu_policy, qos_class, QosClass};
use crate::quantity::Quantity;
use crate::topology::NodeTopology;

use super::hints::{Kind, Provider};
use super::machine::{bits, Free, Machine, Mask};
use super::merge::{self, Affinity, MergeOptions};
use super::{
    allocatable, cpus, devices, memory, Allocations, ContainerPlacement, NodeSettings, Placement, RejectReason,
    Rejection, RemotePlacement, Requested,
};

/// One container's requests as the engine sees them.
struct Req {
    name: String,
    policy: CpuPolicy,
    /// Exclusive / immovable: CPUs to take. Numa: pool CPUs wanted on its nodes.
    cpus: u64,
    guaranteed: bool,
    /// Bytes (Guaranteed pods only).
    memory: u64,
    /// (page size, pages), Guaranteed pods only.
    hugepages: Vec<(u64, u64)>,
    /// (resource, count).
    devices: Vec<(String, u64)>,
}

fn reject(reason: RejectReason, message: String) -> Rejection {
    Rejection { reason, message }
}

pub(crate) use crate::quantity::human_bytes as fmt_bytes;

pub(crate) fn fmt_amount(kind: Kind, v: u64) -> String {
    match kind {
        Kind::Memory => fmt_bytes(v),
        _ => v.to_string(),
    }
}

fn units(q: &Quantity, field: impl Fn() -> String) -> Result<u64, Rejection> {
    if q.is_negative() {
        return Err(reject(RejectReason::InvalidRequest, format!("{}: must not be negative", field())));
    }
    Ok(u64::try_from(q.units_ceil()).unwrap_or(u64::MAX))
}

fn requests(pod: &Pod, settings: &NodeSettings) -> Result<Vec<Req>, Rejection> {
    if pod.spec.containers.is_empty() {
        return Err(reject(RejectReason::InvalidRequest, "spec.containers: the pod has no containers".into()));
    }
    let qos = qos_class(pod);
    let guaranteed = qos == QosClass::Guaranteed;
    let mut out = Vec::with_capacity(pod.spec.containers.len());
    for (ci, c) in pod.spec.containers.iter().enumerate() {
        // Built only when a message needs it: this runs on every decision.
        let path = || format!("spec.containers[{ci}]");
        let policy = effective_cpu_policy(qos, c);
        let cpu = c.resources.request(RESOURCE_CPU);
        if let Some(q) = cpu {
            if q.is_negative() {
                return Err(reject(
                    RejectReason::InvalidRequest,
                    format!("{}.resources.requests.cpu: must not be negative", path()),
                ));
            }
        }
        let cpus = match policy {
            CpuPolicy::Exclusive | CpuPolicy::Immovable => {
                let ok = cpu.filter(|q| q.is_whole() && !q.is_zero());
                let q = ok.ok_or_else(|| {
                    reject(
                        RejectReason::InvalidRequest,
                        format!(
                            "{}.resources.requests.cpu: cpuPolicy {} needs a whole number of CPUs, got {}",
                            path(),
                            policy_name(policy),
                            cpu.map_or("none", |q| q.as_str())
                        ),
                    )
                })?;
                u64::try_from(q.units_ceil()).unwrap_or(u64::MAX)
            }
            CpuPolicy::Numa => {
                let millis = cpu.map_or(0, |q| q.millis_ceil());
                u64::try_from((millis + 999) / 1000).unwrap_or(u64::MAX).max(1)
            }
            CpuPolicy::Shared => 0,
        };
        let mut memory = 0;
        let mut hugepages = Vec::new();
        let mut devs = Vec::new();
        // Every resource named in requests or limits, with its effective request.
        let names: std::collections::BTreeSet<&String> =
            c.resources.requests.keys().chain(c.resources.limits.keys()).collect();
        for (name, q) in names.into_iter().filter_map(|n| c.resources.request(n).map(|q| (n, q))) {
            let field = || format!("{}.resources.requests[{name}]", path());
            if name == RESOURCE_MEMORY {
                memory = if guaranteed { units(q, field)? } else { 0 };
            } else if let Some(size) = name.strip_prefix(HUGEPAGES_PREFIX) {
                let size = Quantity::parse(size)
                    .ok()
                    .and_then(|s| u64::try_from(s.units_ceil()).ok())
                    .filter(|&s| s > 0)
                    .ok_or_else(|| {
                        reject(RejectReason::InvalidRequest, format!("{}: {size:?} is not a page size", field()))
                    })?;
                let bytes = units(q, field)?;
                if bytes % size != 0 {
                    return Err(reject(
                        RejectReason::InvalidRequest,
                        format!("{}: {} is not a whole number of {} pages", field(), q.as_str(), fmt_bytes(size)),
                    ));
                }
                if guaranteed && bytes > 0 {
                    hugepages.push((size, bytes / size));
                }
            } else if name.contains('/') {
                if !q.is_whole() {
                    return Err(reject(
                        RejectReason::InvalidRequest,
                        format!("{}: devices are counted in whole units, got {}", field(), q.as_str()),
                    ));
                }
                let n = units(q, field)?;
                if n > 0 {
                    if !settings.devices.contains_key(name.as_str()) {
                        return Err(reject(
                            RejectReason::InsufficientDevices,
                            format!("{} requests {n} {name} but this node offers none", path()),
                        ));
                    }
                    devs.push((name.clone(), n));
                }
            }
        }
        out.push(Req { name: c.name.clone(), policy, cpus, guaranteed, memory, hugepages, devices: devs });
    }
    Ok(out)
}

fn policy_name(p: CpuPolicy) -> &'static str {
    match p {
        CpuPolicy::Exclusive => "exclusive",
        CpuPolicy::Numa => "numa",
        CpuPolicy::Immovable => "immovable",
        CpuPolicy::Shared => "shared",
    }
}

/// Everything one decision needs besides the ledger.
struct Ctx<'a> {
    m: Machine<'a>,
    settings: &'a NodeSettings,
    policy: TopologyPolicy,
    /// `spec.topology.memory: nearest-memory-only`.
    tier: bool,
    /// `spec.topology.relaxed`.
    relaxed: &'a [String],
}

impl Ctx<'_> {
    /// CPUs an exclusive or immovable container may be given now.
    fn assignable(&self, free: &Free) -> CpuSet {
        if self.settings.cpu_manager.full_pcpus_only {
            cpus::whole_core_cpus(&self.m, &free.assignable)
        } else {
            free.assignable.clone()
        }
    }

    /// Whether the pod named this resource in `spec.topology.relaxed`.
    fn is_relaxed(&self, kind: Kind, device: &str) -> bool {
        let page_size = |r: &str| {
            let size = r.strip_prefix(HUGEPAGES_PREFIX).and_then(|s| Quantity::parse(s).ok());
            size.map(|q| q.units_ceil())
        };
        self.relaxed.iter().any(|r| match kind {
            Kind::Memory => r == RESOURCE_MEMORY,
            Kind::HugePages(size) => page_size(r) == Some(i128::from(size)),
            Kind::Device(_) => r == device,
            Kind::Cpu | Kind::PoolCpu => false,
        })
    }

    /// The memory kinds of a tier pod are placed apart from the CPU nodes: no hint.
    fn aligned_with_cpus(&self, p: &Provider) -> bool {
        !(self.tier && matches!(p.kind, Kind::Memory | Kind::HugePages(_)))
    }

    /// The providers for a group of containers (one container, or the whole pod).
    fn providers(&self, free: &Free, reqs: &[&Req]) -> Vec<Provider> {
        let m = &self.m;
        let mut out = Vec::new();
        let excl: u64 = reqs
            .iter()
            .filter(|r| matches!(r.policy, CpuPolicy::Exclusive | CpuPolicy::Immovable))
            .fold(0u64, |a, r| a.saturating_add(r.cpus));
        let node_totals: Vec<u64> = m.node_cpus.iter().map(|s| s.len() as u64).collect();
        if excl > 0 {
            let avail = self.assignable(free);
            let fr = m.per_node(&avail);
            out.push(
                Provider::new(Kind::Cpu, "exclusive CPUs".into(), excl, node_totals.clone(), fr, (0, 0))
                    .with_loose(m, &avail),
            );
        }
        let pool = reqs.iter().filter(|r| r.policy == CpuPolicy::Numa).map(|r| r.cpus).max().unwrap_or(0);
        if pool > 0 {
            let fr = m.per_node(&free.pool);
            out.push(
                Provider::new(Kind::PoolCpu, "shared CPUs".into(), pool, node_totals, fr, (0, 0))
                    .with_loose(m, &free.pool),
            );
        }
        out.extend(self.memory_providers(free, reqs));
        // Devices, by resource name in order.
        let mut dev: BTreeMap<&str, u64> = BTreeMap::new();
        for r in reqs {
            for (name, n) in &r.devices {
                let e = dev.entry(name.as_str()).or_default();
                *e = e.saturating_add(*n);
            }
        }
        for (k, (name, n)) in dev.into_iter().enumerate() {
            let addrs = self.settings.devices.get(name).map_or(&[][..], |v| &v[..]);
            let (total, fr, anywhere) = devices::counts(m, free, addrs);
            let mut p = if total.iter().all(|&t| t == 0) {
                // No device of this resource has a NUMA node: "don't care", but the
                // count still has to be there.
                Provider::new(Kind::Device(k), format!("{name} devices"), n, vec![0; m.n], vec![0; m.n], anywhere)
            } else {
                Provider::new(Kind::Device(k), format!("{name} devices"), n, total, fr, anywhere)
            };
            p.relaxed = self.is_relaxed(p.kind, name);
            out.push(p);
        }
        out
    }

    /// Memory and huge pages: on the memory-only nodes for a tier pod, on the
    /// others for every other pod.
    fn memory_providers(&self, free: &Free, reqs: &[&Req]) -> Vec<Provider> {
        let m = &self.m;
        let mut out = Vec::new();
        let counted = |i: usize| (m.memory_only & (1 << i) != 0) == self.tier;
        let on = |i: usize, v: u64| if counted(i) { v } else { 0 };
        let mem = reqs.iter().fold(0u64, |a, r| a.saturating_add(r.memory));
        if mem > 0 {
            let total = (0..m.n).map(|i| on(i, m.topo.numa_nodes[i].memory_bytes)).collect();
            let fr = (0..m.n).map(|i| on(i, free.mem_free(m, i))).collect();
            let mut p = Provider::new(Kind::Memory, "memory".into(), mem, total, fr, (0, 0));
            p.relaxed = self.is_relaxed(p.kind, "");
            out.push(p);
        }
        let mut hp: BTreeMap<u64, u64> = BTreeMap::new();
        for r in reqs {
            for &(size, pages) in &r.hugepages {
                let e = hp.entry(size).or_default();
                *e = e.saturating_add(pages);
            }
        }
        for (size, pages) in hp {
            let (total, fr): (Vec<u64>, Vec<u64>) = (0..m.n)
                .map(|i| {
                    let (t, f) = free.hp(m, size, i);
                    (on(i, t), on(i, f))
                })
                .unzip();
            let what = format!("hugepages-{} pages", fmt_bytes(size));
            let mut p = Provider::new(Kind::HugePages(size), what, pages, total, fr, (0, 0));
            p.relaxed = self.is_relaxed(p.kind, "");
            out.push(p);
        }
        out
    }

    /// Refuses what cannot fit on the whole machine, naming the resource.
    fn check_totals(&self, free: &Free, providers: &[Provider], reqs: &[&Req]) -> Result<(), Rejection> {
        let opts = self.settings.cpu_manager;
        for r in reqs {
            if opts.full_pcpus_only && matches!(r.policy, CpuPolicy::Exclusive | CpuPolicy::Immovable) {
                let tpc = self.m.threads_per_core as u64;
                if r.cpus % tpc != 0 {
                    return Err(reject(
                        RejectReason::SmtAlignment,
                        format!(
                            "SMT alignment error: container {} requested {} CPUs, not a multiple of {} CPUs per core (full-pcpus-only)",
                            r.name, r.cpus, tpc
                        ),
                    ));
                }
            }
        }
        for p in providers {
            let have = p.free_total();
            if have >= p.request {
                continue;
            }
            let (reason, extra) = match p.kind {
                Kind::Cpu => {
                    let plain = free.assignable.len() as u64;
                    if opts.full_pcpus_only && plain >= p.request {
                        return Err(reject(
                            RejectReason::SmtAlignment,
                            format!(
                                "not enough free physical CPUs: {} CPUs are free in whole cores, {} requested, {} CPUs per core (full-pcpus-only)",
                                have, p.request, self.m.threads_per_core
                            ),
                        ));
                    }
                    (RejectReason::InsufficientCpu, format!(" ({} reserved)", self.m.reserved.len()))
                }
                Kind::PoolCpu => (RejectReason::InsufficientCpu, String::new()),
                Kind::Memory => (RejectReason::InsufficientMemory, self.memory_note()),
                Kind::HugePages(_) => (RejectReason::InsufficientHugePages, self.memory_note()),
                Kind::Device(_) => (RejectReason::InsufficientDevices, String::new()),
            };
            return Err(reject(
                reason,
                format!(
                    "requests {} {} but only {} are free on the node{extra}",
                    fmt_amount(p.kind, p.request),
                    p.what,
                    fmt_amount(p.kind, have)
                ),
            ));
        }
        Ok(())
    }

    /// Which nodes a memory shortage was counted on, when not simply all.
    fn memory_note(&self) -> String {
        if self.tier && self.m.memory_only == 0 {
            ", which has no memory-only NUMA node (spec.topology.memory: nearest-memory-only)".into()
        } else if self.tier {
            "'s memory-only NUMA nodes (spec.topology.memory: nearest-memory-only)".into()
        } else if self.m.memory_only != 0 {
            " outside its memory-only NUMA nodes (spec.topology.memory: nearest-memory-only asks for those)".into()
        } else {
            String::new()
        }
    }

    fn merge_opts(&self) -> MergeOptions {
        MergeOptions {
            prefer_closest: self.settings.prefer_closest_numa_nodes,
            align_by_socket: self.settings.cpu_manager.align_by_socket,
        }
    }

    /// The affinity for a group, or None under policy `none` or when no provider
    /// cares. A tier pod's memory hints at the CPU nodes whose nearest
    /// memory-only nodes hold it (module docs of `memory`); under `none` such a
    /// pod is aligned as under `best-effort`.
    fn affinity(&self, free: &Free, reqs: &[&Req]) -> Result<Option<Affinity>, Rejection> {
        let mut providers = self.providers(free, reqs);
        self.check_totals(free, &providers, reqs)?;
        providers.retain(|p| self.aligned_with_cpus(p));
        let (bytes, pages) = self.tier_request(reqs);
        let single = self.policy == TopologyPolicy::SingleNumaNode;
        let near = |mask: Mask| memory::near_holds(&self.m, free, mask, single, bytes, &pages);
        let wish: Option<merge::Wish<'_>> = (bytes > 0 || !pages.is_empty()).then_some(&near as merge::Wish<'_>);
        let policy = match self.policy {
            TopologyPolicy::None if wish.is_some() => TopologyPolicy::BestEffort,
            p => p,
        };
        if policy == TopologyPolicy::None || providers.is_empty() {
            return Ok(None);
        }
        merge::merge(&self.m, &providers, policy, &self.merge_opts(), wish).map(Some)
    }

    /// The memory and huge pages (size, pages) a group puts on the memory-only
    /// nodes: none unless the pod asks for them.
    fn tier_request(&self, reqs: &[&Req]) -> (u64, Vec<(u64, u64)>) {
        let mut bytes = 0u64;
        let mut pages: BTreeMap<u64, u64> = BTreeMap::new();
        for r in reqs.iter().filter(|r| self.tier && r.guaranteed) {
            bytes = bytes.saturating_add(r.memory);
            for &(size, n) in &r.hugepages {
                let e = pages.entry(size).or_default();
                *e = e.saturating_add(n);
            }
        }
        (bytes, pages.into_iter().collect())
    }

    /// Places one container given the affinity of its group; relaxed
    /// resources placed outside it go to `remote`.
    fn place(
        &self,
        free: &mut Free,
        r: &Req,
        affinity: Option<Mask>,
        remote: &mut Vec<RemotePlacement>,
    ) -> Result<(ContainerPlacement, Mask), Rejection> {
        let m = &self.m;
        let opts = self.settings.cpu_manager;
        let mut cp = ContainerPlacement {
            name: r.name.clone(),
            cpu_policy: r.policy,
            cpus: CpuSet::new(),
            mems: Default::default(),
            memory: BTreeMap::new(),
            hugepages: BTreeMap::new(),
            devices: BTreeMap::new(),
        };
        let mut numa_nodes: Mask = 0;
        match r.policy {
            CpuPolicy::Exclusive | CpuPolicy::Immovable => {
                let avail = self.assignable(free);
                let n = usize::try_from(r.cpus).unwrap_or(usize::MAX);
                if avail.len() < n {
                    return Err(reject(
                        RejectReason::InsufficientCpu,
                        format!("container {} requests {n} exclusive CPUs but only {} are free", r.name, avail.len()),
                    ));
                }
                let group = if opts.full_pcpus_only { m.threads_per_core } else { 1 };
                let how = cpus::Strategy {
                    spread: opts.distribute_cpus_across_cores,
                    uncore: opts.prefer_align_cpus_by_uncore_cache,
                };
                let take_from = |set: &CpuSet, k: usize| {
                    if opts.distribute_cpus_across_numa {
                        cpus::take_distributed(m, set, k, group, how)
                    } else {
                        cpus::take_packed(m, set, k, how)
                    }
                };
                // The kernel's isolated CPUs (isolcpus) first: nothing else
                // is scheduled there, which is what an exclusive CPU is for.
                let isolated = &m.topo.kernel.isolated_cpus;
                let take = |set: &CpuSet, k: usize| {
                    let quiet = set.intersection(isolated);
                    if quiet.is_empty() {
                        return take_from(set, k);
                    }
                    let first = quiet.len().min(k);
                    let mut t = take_from(&quiet, first);
                    if first < k {
                        t.union_with(&take_from(&set.difference(&t), k - first));
                    }
                    t
                };
                let taken = match affinity {
                    Some(a) => {
                        // align-by-socket widens the aligned CPUs to the affinity's
                        // sockets; the kubelet refuses it with single-numa-node, and
                        // since a pod may pick that policy itself, it is ignored there.
                        let by_socket = opts.align_by_socket && self.policy != TopologyPolicy::SingleNumaNode;
                        let scope = if by_socket { m.socket_cpus_of(a) } else { m.cpus_of(a) };
                        let aligned = avail.intersection(&scope);
                        let k = aligned.len().min(n);
                        let mut t = take(&aligned, k);
                        if k < n {
                            t.union_with(&cpus::take_packed(m, &avail.difference(&t), n - k, how));
                        }
                        t
                    }
                    None => take(&avail, n),
                };
                free.assignable.difference_with(&taken);
                if r.policy == CpuPolicy::Exclusive {
                    free.pool.difference_with(&taken);
                }
                cp.cpus = taken;
            }
            CpuPolicy::Numa => {
                numa_nodes = match affinity {
                    Some(a) => a,
                    None => {
                        // Policy none (or nobody cared): a numa container still
                        // needs nodes, chosen as best-effort would.
                        let mut ps = self.providers(free, &[r]);
                        ps.retain(|p| {
                            matches!(p.kind, Kind::PoolCpu | Kind::Memory | Kind::HugePages(_))
                                && self.aligned_with_cpus(p)
                        });
                        merge::merge(m, &ps, TopologyPolicy::BestEffort, &self.merge_opts(), None)?.mask
                    }
                };
            }
            CpuPolicy::Shared => {}
        }
        if r.guaranteed && (r.memory > 0 || !r.hugepages.is_empty()) && self.tier {
            let cpu_nodes = match r.policy {
                CpuPolicy::Exclusive | CpuPolicy::Immovable => m.nodes_of(&cp.cpus),
                CpuPolicy::Numa => numa_nodes,
                CpuPolicy::Shared => affinity.unwrap_or(0),
            };
            let single = self.policy == TopologyPolicy::SingleNumaNode;
            let ((mem, hp), nodes) =
                memory::take_nearest_memory_only(m, free, &r.name, cpu_nodes, single, r.memory, &r.hugepages)?;
            cp.memory = mem;
            cp.hugepages = hp;
            cp.mems = m.numa_set(nodes);
        } else if r.guaranteed && (r.memory > 0 || !r.hugepages.is_empty()) {
            let providers = self.memory_providers(free, &[r]);
            let refs: Vec<&Provider> = providers.iter().collect();
            let base = if numa_nodes != 0 { Some(numa_nodes) } else { affinity };
            let mask = memory::choose_mask(m, &refs, base).ok_or_else(|| {
                let p = &providers[0];
                reject(
                    if p.kind == Kind::Memory {
                        RejectReason::InsufficientMemory
                    } else {
                        RejectReason::InsufficientHugePages
                    },
                    format!(
                        "container {} requests {} {} but only {} are free on the node",
                        r.name,
                        fmt_amount(p.kind, p.request),
                        p.what,
                        fmt_amount(p.kind, p.free_total())
                    ),
                )
            })?;
            // Relaxed memory is taken on the aligned nodes first; otherwise in
            // index order, as the kubelet does.
            let aligned = base.unwrap_or(0);
            let first = if providers.iter().any(|p| p.relaxed) { aligned } else { mask };
            let usable = mask & !m.memory_only;
            let order = bits(usable & first).chain(bits(usable & !first));
            let (mem, hp) = memory::take(m, free, order, r.memory, &r.hugepages).ok_or_else(|| {
                reject(RejectReason::InsufficientMemory, format!("container {}: memory no longer fits", r.name))
            })?;
            if aligned != 0 && affinity.is_some() {
                for p in providers.iter().filter(|p| p.relaxed) {
                    let (resource, per_node) = match p.kind {
                        Kind::HugePages(size) => (format!("hugepages-{}", fmt_bytes(size)), hp.get(&size)),
                        _ => (RESOURCE_MEMORY.to_string(), Some(&mem)),
                    };
                    let nodes = per_node.into_iter().flat_map(|n| n.keys()).copied();
                    let amounts = (fmt_amount(p.kind, p.request), fmt_amount(p.kind, p.free_in(aligned)));
                    self.note_remote(remote, r, resource, amounts, aligned, nodes);
                }
            }
            cp.memory = mem;
            cp.hugepages = hp;
            cp.mems = m.numa_set(m.with_memory(mask | numa_nodes));
        } else if numa_nodes != 0 {
            cp.mems = m.numa_set(m.with_memory(numa_nodes));
        }
        for (name, n) in &r.devices {
            let addrs = self.settings.devices.get(name).map_or(&[][..], |v| &v[..]);
            let requested = n.to_string();
            let n = usize::try_from(*n).unwrap_or(usize::MAX);
            // Under `none` a tier pod has an affinity for its own placement only:
            // nothing is remote from it.
            let reported = affinity.filter(|_| self.policy != TopologyPolicy::None);
            let relaxed = reported.filter(|_| self.is_relaxed(Kind::Device(0), name));
            // What the affinity had free, for the remote note.
            let aligned_free = relaxed.map(|a| {
                let (_, fr, anywhere) = devices::counts(m, free, addrs);
                bits(a).fold(anywhere.1, |acc, i| acc.saturating_add(fr[i]))
            });
            let got = devices::take(m, free, addrs, n, affinity);
            if got.len() < n {
                return Err(reject(
                    RejectReason::InsufficientDevices,
                    format!("container {} requests {n} {name} but only {} are free", r.name, got.len()),
                ));
            }
            if let (Some(aligned), Some(there)) = (relaxed, aligned_free) {
                let nodes = got.iter().filter_map(|a| m.device_node.get(a.as_str()).copied().flatten());
                let ids: Vec<u32> = nodes.map(|i| m.node_id(i)).collect();
                self.note_remote(remote, r, name.clone(), (requested, there.to_string()), aligned, ids.into_iter());
            }
            cp.devices.insert(name.clone(), got);
        }
        Ok((cp, numa_nodes))
    }

    /// Records a relaxed resource placed on `nodes` (ids) when some lie
    /// outside `aligned`; `amounts`: what was requested, what `aligned` had free.
    fn note_remote(
        &self,
        remote: &mut Vec<RemotePlacement>,
        r: &Req,
        resource: String,
        (requested, there): (String, String),
        aligned: Mask,
        nodes: impl Iterator<Item = u32>,
    ) {
        let inside = self.m.numa_set(aligned);
        let mut outside = NumaSet::new();
        for id in nodes.filter(|id| !inside.contains(*id)) {
            // A node id of this machine: `Machine::new` bounded them.
            let _ = outside.insert(id);
        }
        if outside.is_empty() {
            return;
        }
        remote.push(RemotePlacement {
            container: r.name.clone(),
            resource,
            numa_nodes: outside,
            reason: format!("relaxed: {requested} requested, {there} free on the affinity's NUMA node(s) {inside}"),
        });
    }
}

/// Decides one pod. See the module docs.
pub fn admit(
    topology: &NodeTopology,
    settings: &NodeSettings,
    allocations: &Allocations,
    pod_key: &str,
    pod: &Pod,
) -> Result<Placement, Rejection> {
    if allocations.pods.contains_key(pod_key) {
        return Err(reject(RejectReason::AlreadyAllocated, format!("pod {pod_key} is already allocated on this node")));
    }
    let reqs = requests(pod, settings)?;
    super::machine::check_bounds(topology)?;
    let requested = fits_allocatable(topology, settings, allocations, pod)?;
    let m = Machine::new(topology, settings)?;
    let mut free = Free::new(&m, allocations, settings.cpu_manager.strict_cpu_reservation);
    let topo_spec = pod.spec.topology.as_ref();
    let policy = topo_spec.and_then(|t| t.policy).unwrap_or(settings.topology_policy);
    let scope = topo_spec.and_then(|t| t.scope).unwrap_or(settings.topology_scope);
    let tier = topo_spec.is_some_and(|t| t.memory == MemoryPlacement::NearestMemoryOnly);
    let relaxed = topo_spec.map_or(&[][..], |t| &t.relaxed[..]);
    let ctx = Ctx { m, settings, policy, tier, relaxed };
    let mut remote = Vec::new();

    let mut containers = Vec::with_capacity(reqs.len());
    let mut numa_nodes: Vec<Mask> = Vec::with_capacity(reqs.len());
    let mut union: Mask = 0;
    match scope {
        TopologyScope::Pod => {
            let all: Vec<&Req> = reqs.iter().collect();
            let aff = ctx.affinity(&free, &all)?;
            for r in &reqs {
                let (cp, nodes) = ctx.place(&mut free, r, aff.map(|a| a.mask), &mut remote)?;
                containers.push(cp);
                numa_nodes.push(nodes);
            }
            union = aff.map_or(0, |a| a.mask);
        }
        TopologyScope::Container => {
            for r in &reqs {
                let aff = ctx.affinity(&free, &[r])?;
                let (cp, nodes) = ctx.place(&mut free, r, aff.map(|a| a.mask), &mut remote)?;
                containers.push(cp);
                numa_nodes.push(nodes);
                union |= aff.map_or(0, |a| a.mask);
            }
        }
    }
    let m = &ctx.m;
    // A shared or numa container with no CPU at all cannot run: when the pool
    // would be empty, refuse the pod that empties it or needs it. (The kubelet
    // avoids this by requiring reserved CPUs, which stay in the pool unless
    // `strict-cpu-reservation`; it does not guard that case.)
    if let Some(who) = super::starved_by_empty_pool(&free.pool, &containers, allocations) {
        let hint = if settings.cpu_manager.strict_cpu_reservation {
            "every other CPU would be exclusive and strict-cpu-reservation keeps the reserved ones out of the pool"
        } else {
            "every CPU would be exclusive (reserve CPUs for the system and shared pods, e.g. --reserved-cpus 0)"
        };
        return Err(reject(
            RejectReason::InsufficientCpu,
            format!("no CPU would be left in the shared pool for {who}: {hint}"),
        ));
    }
    // Shared and numa CPUs are the pool after this pod's exclusive CPUs left it.
    for (cp, &nodes) in containers.iter_mut().zip(&numa_nodes) {
        match cp.cpu_policy {
            CpuPolicy::Shared => cp.cpus = free.pool.clone(),
            CpuPolicy::Numa => {
                let s = free.pool.intersection(&m.cpus_of(nodes));
                cp.cpus = if s.is_empty() { free.pool.clone() } else { s };
            }
            CpuPolicy::Exclusive | CpuPolicy::Immovable => {}
        }
    }
    if policy == TopologyPolicy::None || union == 0 {
        union = m.all_nodes();
    }
    Ok(Placement { numa_affinity: m.numa_set(union), containers, requested, remote })
}

/// The kubelet's allocatable check, on node totals: what the pods here
/// requested, plus this pod's, within what the node offers ([`allocatable`]).
/// A pod that requests nothing always fits (BestEffort). Returns this pod's
/// requests.
fn fits_allocatable(
    topology: &NodeTopology,
    settings: &NodeSettings,
    allocations: &Allocations,
    pod: &Pod,
) -> Result<Requested, Rejection> {
    let want = Requested::of(pod);
    let reserved = settings.reserved(topology);
    let offered = allocatable(topology, settings);
    let (cpu_capacity, memory_capacity) = (offered.cpu_millis, offered.memory);
    let used = allocations.requested(&reserved);
    let cpus = |m: u64| Quantity::from_millis(i64::try_from(m).unwrap_or(i64::MAX)).as_str().to_string();
    if want.cpu_millis > 0 && used.cpu_millis.saturating_add(want.cpu_millis) > cpu_capacity {
        return Err(reject(
            RejectReason::InsufficientCpu,
            format!(
                "requests {} CPU but only {} of the node's {} allocatable CPUs ({} reserved) are not requested by other pods",
                cpus(want.cpu_millis),
                cpus(cpu_capacity.saturating_sub(used.cpu_millis)),
                cpus(cpu_capacity),
                reserved.len()
            ),
        ));
    }
    if want.memory > 0 && used.memory.saturating_add(want.memory) > memory_capacity {
        return Err(reject(
            RejectReason::InsufficientMemory,
            format!(
                "requests {} memory but only {} of the node's {} are not requested by other pods",
                fmt_bytes(want.memory),
                fmt_bytes(memory_capacity.saturating_sub(used.memory)),
                fmt_bytes(memory_capacity)
            ),
        ));
    }
    for (size, bytes) in &want.hugepages {
        let capacity = offered.hugepages.get(size).copied().unwrap_or(0);
        let taken = used.hugepages.get(size).copied().unwrap_or(0);
        if taken.saturating_add(*bytes) > capacity {
            return Err(reject(
                RejectReason::InsufficientHugePages,
                format!(
                    "requests {} hugepages-{} pages but only {} of the node's {} are not requested by other pods",
                    bytes / size.max(&1),
                    fmt_bytes(*size),
                    capacity.saturating_sub(taken) / size.max(&1),
                    capacity / size.max(&1)
                ),
            ));
        }
    }
    Ok(want)
}
