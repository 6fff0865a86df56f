//! Feasibility checks on node summaries, and the named reasons a node is ruled out.
//!
//! Every check here is a *necessary* condition for the engine to admit the pod:
//! a node it rules out is one the engine would reject too, so running these
//! first never loses a placement, it only saves engine runs. Where the engine's
//! rule is subtle (e.g. `align-by-socket`) the check stays at the totals and
//! leaves the decision to the engine. The request accounting in `totals` (as
//! the Kubernetes scheduler's) is the engine's allocatable check (CPU, memory
//! and huge pages requests of every pod). `props` checks all this on random
//! nodes.

use std::fmt;

use specs::pod::TopologyPolicy;
use specs::{NodeSettings, Pod, RejectReason, TopologyScope};

use super::demand::{Demand, Request};
use super::summary::{lookup, Hot, NodeSummary, NumaFree};

/// Why a node cannot take a pod: one named variant per cause, counted per node
/// in `Unschedulable`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    prometheus_client::encoding::EncodeLabelValue,
)]
#[serde(rename_all = "camelCase")]
pub enum ReasonKind {
    NotReady,
    NodeSelector,
    /// The node rejected this pod and its state has not changed since.
    RejectedAtThisState,
    InsufficientCpu,
    InsufficientMemory,
    InsufficientHugePages,
    InsufficientDevices,
    TopologyAffinity,
    SmtAlignment,
    InvalidRequest,
    AlreadyAllocated,
    /// A gang placed `spread` already has a member there.
    GangSpread,
}

impl ReasonKind {
    /// Whether what the node has free rules it out (what a pod stopping
    /// there gives back), not what it is (its labels, its readiness).
    pub fn is_about_resources(self) -> bool {
        matches!(
            self,
            ReasonKind::InsufficientCpu
                | ReasonKind::InsufficientMemory
                | ReasonKind::InsufficientHugePages
                | ReasonKind::InsufficientDevices
                | ReasonKind::TopologyAffinity
                | ReasonKind::SmtAlignment
        )
    }

    /// The words used in the summary line ("2 topology affinity, 1 not ready").
    pub fn label(self) -> &'static str {
        match self {
            ReasonKind::NotReady => "not ready",
            ReasonKind::NodeSelector => "node selector mismatch",
            ReasonKind::RejectedAtThisState => "rejected by the node at this state",
            ReasonKind::InsufficientCpu => "insufficient cpu",
            ReasonKind::InsufficientMemory => "insufficient memory",
            ReasonKind::InsufficientHugePages => "insufficient hugepages",
            ReasonKind::InsufficientDevices => "insufficient devices",
            ReasonKind::TopologyAffinity => "topology affinity",
            ReasonKind::SmtAlignment => "smt alignment",
            ReasonKind::InvalidRequest => "invalid request",
            ReasonKind::AlreadyAllocated => "already allocated",
            ReasonKind::GangSpread => "holding another member of the gang (spread)",
        }
    }
}

impl From<RejectReason> for ReasonKind {
    fn from(r: RejectReason) -> Self {
        match r {
            RejectReason::InvalidRequest => ReasonKind::InvalidRequest,
            RejectReason::InsufficientCpu => ReasonKind::InsufficientCpu,
            RejectReason::InsufficientMemory => ReasonKind::InsufficientMemory,
            RejectReason::InsufficientHugePages => ReasonKind::InsufficientHugePages,
            RejectReason::InsufficientDevices => ReasonKind::InsufficientDevices,
            RejectReason::SmtAlignment => ReasonKind::SmtAlignment,
            RejectReason::TopologyAffinity => ReasonKind::TopologyAffinity,
            RejectReason::AlreadyAllocated => ReasonKind::AlreadyAllocated,
        }
    }
}

/// A resource named in a per-NUMA message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Res<'a> {
    Cpu,
    Memory,
    HugePages(u64),
    Device(&'a str),
}

/// One node's reason with the numbers behind it; formatted only when the pod
/// turns out unschedulable, so the hot path builds no strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Detail<'a> {
    NotReady,
    NodeSelector {
        key: &'a str,
        want: &'a str,
    },
    RejectedAtThisState {
        message: String,
    },
    ExclusiveCpu {
        want: u64,
        free: u64,
    },
    CpuMillis {
        want: u64,
        free: u64,
    },
    Memory {
        want: u64,
        free: u64,
    },
    HugePages {
        size: u64,
        want: u64,
        free: u64,
    },
    Devices {
        name: &'a str,
        want: u64,
        free: u64,
    },
    /// No single NUMA node has `want` of `res`; the best one has `best`.
    SingleNuma {
        res: Res<'a>,
        want: u64,
        best_numa: Option<u32>,
        best: u64,
    },
    /// `restricted`: the request needs `k` NUMA nodes at best; the `k` freest hold `best`.
    SpanNuma {
        k: usize,
        want: u64,
        best: u64,
    },
    /// Each resource fits some NUMA node, but no one node has all of them at once.
    JointNuma,
    /// A gang placed `spread` already has a member on the node.
    GangSpread,
    Engine {
        reason: RejectReason,
        message: String,
    },
}

impl Detail<'_> {
    pub fn kind(&self) -> ReasonKind {
        match self {
            Detail::NotReady => ReasonKind::NotReady,
            Detail::NodeSelector { .. } => ReasonKind::NodeSelector,
            Detail::RejectedAtThisState { .. } => ReasonKind::RejectedAtThisState,
            Detail::ExclusiveCpu { .. } | Detail::CpuMillis { .. } => ReasonKind::InsufficientCpu,
            Detail::Memory { .. } => ReasonKind::InsufficientMemory,
            Detail::HugePages { .. } => ReasonKind::InsufficientHugePages,
            Detail::Devices { .. } => ReasonKind::InsufficientDevices,
            Detail::SingleNuma { .. } | Detail::SpanNuma { .. } | Detail::JointNuma => ReasonKind::TopologyAffinity,
            Detail::GangSpread => ReasonKind::GangSpread,
            Detail::Engine { reason, .. } => (*reason).into(),
        }
    }
}

pub(crate) use specs::quantity::human_bytes as bytes;

fn res_amount(res: Res<'_>, n: u64) -> String {
    match res {
        Res::Cpu => format!("{n} free exclusive CPUs"),
        Res::Memory => format!("{} free memory", bytes(n)),
        Res::HugePages(size) => format!("{} free hugepages-{}", bytes(n), bytes(size)),
        Res::Device(name) => format!("{n} free {name}"),
    }
}

fn res_short(res: Res<'_>, n: u64) -> String {
    match res {
        Res::Cpu => format!("{n}"),
        Res::Memory | Res::HugePages(_) => bytes(n),
        Res::Device(_) => format!("{n}"),
    }
}

impl fmt::Display for Detail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Detail::NotReady => write!(f, "node is not ready"),
            Detail::GangSpread => write!(f, "holds another member of the gang, which is placed one member per node"),
            Detail::NodeSelector { key, want } => {
                write!(f, "node selector {key}={want} does not match the node's labels")
            }
            Detail::RejectedAtThisState { message } => {
                write!(f, "the node rejected this pod and its state has not changed since: {message}")
            }
            Detail::ExclusiveCpu { want, free } => write!(f, "needs {want} exclusive CPUs; {free} free"),
            Detail::CpuMillis { want, free } => write!(f, "needs {want}m CPU; {free}m free"),
            Detail::Memory { want, free } => write!(f, "needs {} memory; {} free", bytes(*want), bytes(*free)),
            Detail::HugePages { size, want, free } => {
                write!(f, "needs {} of hugepages-{}; {} free", bytes(*want), bytes(*size), bytes(*free))
            }
            Detail::Devices { name, want, free } => write!(f, "needs {want} {name}; {free} free"),
            Detail::SingleNuma { res, want, best_numa, best } => {
                write!(f, "no single NUMA node has {}", res_amount(*res, *want))?;
                match best_numa {
                    Some(id) => write!(f, "; best is node {id} with {}", res_short(*res, *best)),
                    None => write!(f, "; the node has no NUMA nodes"),
                }
            }
            Detail::SpanNuma { k, want, best } => write!(
                f,
                "restricted policy: the request needs {k} NUMA node(s) at best; the freest {k} have {best} of {want} exclusive CPUs"
            ),
            Detail::JointNuma => {
                write!(f, "no single NUMA node has all the pod's aligned resources at once")
            }
            Detail::Engine { message, .. } => write!(f, "{message}"),
        }
    }
}

/// A detail found on the node's empty summary (`Scheduler::never_fits`): what
/// is "free" there is all the node can ever allocate.
pub(crate) struct OnEmptyNode<'a>(pub Detail<'a>);

impl fmt::Display for OnEmptyNode<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Detail::ExclusiveCpu { want, free } => write!(f, "needs {want} exclusive CPUs, {free} allocatable"),
            Detail::CpuMillis { want, free } => write!(f, "needs {want}m CPU, {free}m allocatable"),
            Detail::Memory { want, free } => write!(f, "needs {} memory, {} allocatable", bytes(*want), bytes(*free)),
            Detail::HugePages { size, want, free } => {
                write!(f, "needs {} of hugepages-{}, {} allocatable", bytes(*want), bytes(*size), bytes(*free))
            }
            Detail::Devices { name, want, free } => write!(f, "needs {want} {name}, {free} allocatable"),
            other => other.fmt(f),
        }
    }
}

/// nodeSelector: every selector label must be on the node with that value.
pub(crate) fn node_selector<'a>(
    pod: &'a Pod,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), Detail<'a>> {
    for (k, v) in &pod.spec.node_selector {
        if labels.get(k) != Some(v) {
            return Err(Detail::NodeSelector { key: k, want: v });
        }
    }
    Ok(())
}

/// Enough free resources by node totals (what the Kubernetes scheduler sees).
pub(crate) fn totals<'a>(s: &NodeSummary, d: &'a Demand) -> Result<(), Detail<'a>> {
    let t = &d.total;
    if t.exclusive_cpus > s.free_cpus {
        return Err(Detail::ExclusiveCpu { want: t.exclusive_cpus.into(), free: s.free_cpus.into() });
    }
    if t.cpu_millis > s.free_cpu_millis() {
        return Err(Detail::CpuMillis { want: t.cpu_millis, free: s.free_cpu_millis() });
    }
    if t.memory > s.free_memory() {
        return Err(Detail::Memory { want: t.memory, free: s.free_memory() });
    }
    for &(size, want) in &t.hugepages {
        let free = s.free_hugepages(size);
        if want > free {
            return Err(Detail::HugePages { size, want, free });
        }
    }
    for (name, want) in &t.devices {
        let free = s.free_devices(name);
        if *want > free {
            return Err(Detail::Devices { name, want: (*want).into(), free: free.into() });
        }
    }
    Ok(())
}

/// The node's policy and scope for this pod: the pod's override, else the node's.
pub(crate) fn effective_policy(d: &Demand, settings: &NodeSettings) -> (TopologyPolicy, TopologyScope) {
    (d.topology_policy.unwrap_or(settings.topology_policy), d.topology_scope.unwrap_or(settings.topology_scope))
}

fn device_free(s: &NodeSummary, n: &NumaFree, name: &str) -> u64 {
    match s.device_index(name) {
        Some(i) => u64::from(n.free_devices[i]) + u64::from(s.floating_devices[i]),
        None => 0,
    }
}

/// Per-NUMA feasibility under the pod's topology policy: rules out nodes that
/// cannot possibly satisfy `single-numa-node` or `restricted` whatever the
/// engine picks. `none` and `best-effort` admit any spread, so only totals apply.
pub(crate) fn numa<'a>(s: &NodeSummary, d: &'a Demand, settings: &NodeSettings) -> Result<(), Detail<'a>> {
    let (policy, scope) = effective_policy(d, settings);
    if settings.cpu_manager.align_by_socket {
        // Alignment to sockets follows rules of its own: the engine decides.
        return Ok(());
    }
    for r in d.aligned_requests(scope) {
        if !r.is_aligned(d.guaranteed) {
            continue;
        }
        match policy {
            TopologyPolicy::None | TopologyPolicy::BestEffort => {}
            TopologyPolicy::SingleNumaNode => single_numa(s, r, d.guaranteed)?,
            TopologyPolicy::Restricted => restricted(s, r, d.guaranteed)?,
        }
    }
    Ok(())
}

fn fits_one(s: &NodeSummary, n: &NumaFree, r: &Request, guaranteed: bool) -> bool {
    n.free_cpus >= r.exclusive_cpus
        && (!guaranteed
            || (n.free_memory >= r.memory
                && r.hugepages.iter().all(|&(size, want)| lookup(&n.free_hugepages, size) >= want)))
        && r.devices.iter().all(|(name, want)| device_free(s, n, name) >= u64::from(*want))
}

/// The NUMA node with the most of one resource (lowest id on ties).
fn best_of(s: &NodeSummary, amount: impl Fn(&NumaFree) -> u64) -> (Option<u32>, u64) {
    let mut best: (Option<u32>, u64) = (None, 0);
    for n in &s.numa {
        let a = amount(n);
        if best.0.is_none() || a > best.1 {
            best = (Some(n.id), a);
        }
    }
    best
}

fn single_numa<'a>(s: &NodeSummary, r: &'a Request, guaranteed: bool) -> Result<(), Detail<'a>> {
    if s.numa.iter().any(|n| fits_one(s, n, r, guaranteed)) {
        return Ok(());
    }
    // Say which resource alone does not fit one NUMA node, CPUs first.
    let mut checks: Vec<(Res<'a>, u64)> = Vec::new();
    if r.exclusive_cpus > 0 {
        checks.push((Res::Cpu, r.exclusive_cpus.into()));
    }
    if guaranteed {
        if r.memory > 0 {
            checks.push((Res::Memory, r.memory));
        }
        checks.extend(r.hugepages.iter().map(|&(size, want)| (Res::HugePages(size), want)));
    }
    checks.extend(r.devices.iter().map(|(name, want)| (Res::Device(name), u64::from(*want))));
    for (res, want) in checks {
        let (best_numa, best) = best_of(s, |n| match res {
            Res::Cpu => n.free_cpus.into(),
            Res::Memory => n.free_memory,
            Res::HugePages(size) => lookup(&n.free_hugepages, size),
            Res::Device(name) => device_free(s, n, name),
        });
        if best < want {
            return Err(Detail::SingleNuma { res, want, best_numa, best });
        }
    }
    Err(Detail::JointNuma)
}

/// `restricted` takes only the narrowest possible affinity: as many NUMA nodes
/// as the widest of the request's resources needs at best. Those nodes' free
/// CPUs must hold the exclusive ones.
fn restricted<'a>(s: &NodeSummary, r: &'a Request, guaranteed: bool) -> Result<(), Detail<'a>> {
    let want = u64::from(r.exclusive_cpus);
    if want == 0 {
        return Ok(());
    }
    // The width must never be narrower than the engine's, or a node the engine
    // admits on is ruled out: the engine's width is the widest over *every*
    // resource of the request, so memory that no single NUMA node holds widens
    // an exclusive-CPU request that one node could hold (found by the property
    // test in `props`). The engine counts totals; the widths here come from
    // amounts at most those (capacity without reserved CPUs, free memory, huge
    // pages and devices), so they are at least the engine's. The CPU width
    // covers the request's CPUs of any policy, since immovable and `numa`
    // containers have their own engine CPU requests, each at most this many.
    let cpus = r.cpu_millis.div_ceil(1000).max(want);
    let mut k = narrowest(s.numa.iter().map(|n| u64::from(n.cpu_capacity)), 0, cpus);
    if guaranteed {
        k = k.max(narrowest(s.numa.iter().map(|n| n.free_memory), 0, r.memory));
        for &(size, bytes) in &r.hugepages {
            k = k.max(narrowest(s.numa.iter().map(|n| lookup(&n.free_hugepages, size)), 0, bytes));
        }
    }
    for (name, count) in &r.devices {
        if let Some(i) = s.device_index(name) {
            let per_numa = s.numa.iter().map(|n| u64::from(n.free_devices[i]));
            k = k.max(narrowest(per_numa, u64::from(s.floating_devices[i]), u64::from(*count)));
        }
    }
    let mut free: Vec<u64> = s.numa.iter().map(|n| u64::from(n.free_cpus)).collect();
    free.sort_unstable_by(|a, b| b.cmp(a));
    let best: u64 = free.iter().take(k).sum();
    if best < want {
        return Err(Detail::SpanNuma { k, want, best });
    }
    Ok(())
}

/// The fewest NUMA nodes whose amounts (largest first) plus `anywhere` cover
/// `want`; all of them when none do (as the engine's narrowest width).
fn narrowest(amounts: impl Iterator<Item = u64>, anywhere: u64, want: u64) -> usize {
    let mut v: Vec<u64> = amounts.collect();
    let n = v.len();
    if anywhere >= want {
        return 1;
    }
    v.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = anywhere;
    for (k, a) in v.into_iter().enumerate() {
        sum = sum.saturating_add(a);
        if sum >= want {
            return k + 1;
        }
    }
    n.max(1)
}

/// What the hot summary alone says about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quick {
    Fit,
    NoFit,
    /// Needs the full summary (hugepages, devices, `restricted`, many NUMA nodes).
    Unknown,
}

/// The totals and per-NUMA checks on the hot summary: the same rules as
/// `totals` and `numa` for the common case (CPUs and memory, `none`,
/// `best-effort`, `single-numa-node`), deciding most nodes from one
/// contiguous array. Readiness, selector and stale-state checks come first,
/// elsewhere.
#[inline]
pub(crate) fn quick(h: &Hot, d: &Demand, aware: bool) -> Quick {
    let t = &d.total;
    if t.exclusive_cpus > h.free_cpus || t.cpu_millis > h.free_cpu_millis() || t.memory > h.free_memory() {
        return Quick::NoFit;
    }
    if !t.hugepages.is_empty() || !t.devices.is_empty() {
        return Quick::Unknown;
    }
    if !aware || h.align_by_socket {
        return Quick::Fit;
    }
    let policy = d.topology_policy.unwrap_or(h.policy);
    match policy {
        TopologyPolicy::None | TopologyPolicy::BestEffort => Quick::Fit,
        TopologyPolicy::Restricted => Quick::Unknown,
        TopologyPolicy::SingleNumaNode if !h.numa_inline => Quick::Unknown,
        TopologyPolicy::SingleNumaNode => {
            let n = usize::from(h.numa_len);
            for r in d.aligned_requests(d.topology_scope.unwrap_or(h.scope)) {
                if !r.is_aligned(d.guaranteed) {
                    continue;
                }
                let want_memory = if d.guaranteed { r.memory } else { 0 };
                let fits =
                    (0..n).any(|i| h.numa_free_cpus[i] >= r.exclusive_cpus && h.numa_free_memory[i] >= want_memory);
                if !fits {
                    return Quick::NoFit;
                }
            }
            Quick::Fit
        }
    }
}
