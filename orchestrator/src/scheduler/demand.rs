//! What a pod asks for, reduced once per scheduling attempt to plain numbers the
//! filter and score stages compare against node summaries.
//!
//! Only the numbers that decide feasibility cheaply live here: exclusive CPUs,
//! CPU millicores, memory, huge pages and devices, per container and in total,
//! plus the pod's overrides (topology policy and scope, scheduling strategy).
//! The engine still has the final word; these numbers only rule nodes out.

use specs::pod::{SchedulingStrategy, HUGEPAGES_PREFIX, RESOURCE_CPU, RESOURCE_MEMORY};
use specs::qos::{effective_cpu_policy, qos_class, QosClass};
use specs::{CpuPolicy, Pod, Quantity, TopologyPolicy, TopologyScope};

/// Resources one container (or the whole pod) asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Request {
    /// Whole CPUs taken out of the shared pool (`exclusive` policy).
    pub exclusive_cpus: u32,
    /// Every CPU request in millicores, exclusive ones included (as Kubernetes counts).
    pub cpu_millis: u64,
    pub memory: u64,
    /// Page size in bytes -> bytes asked for, sorted by page size.
    pub hugepages: Vec<(u64, u64)>,
    /// Device resource name -> count, sorted by name.
    pub devices: Vec<(String, u32)>,
}

/// A pod's demand: per container and in total, with its overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Demand {
    pub topology_policy: Option<TopologyPolicy>,
    pub topology_scope: Option<TopologyScope>,
    pub strategy: Option<SchedulingStrategy>,
    /// The Memory Manager only aligns memory for Guaranteed pods (as the kubelet's static policy).
    pub guaranteed: bool,
    pub containers: Vec<Request>,
    pub total: Request,
}

impl Request {
    fn add(&mut self, other: &Request) {
        self.exclusive_cpus = self.exclusive_cpus.saturating_add(other.exclusive_cpus);
        self.cpu_millis = self.cpu_millis.saturating_add(other.cpu_millis);
        self.memory = self.memory.saturating_add(other.memory);
        for (size, bytes) in &other.hugepages {
            add_keyed(&mut self.hugepages, *size, *bytes);
        }
        for (name, n) in &other.devices {
            match self.devices.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
                Ok(i) => self.devices[i].1 = self.devices[i].1.saturating_add(*n),
                Err(i) => self.devices.insert(i, (name.clone(), *n)),
            }
        }
    }

    /// Whether the request takes part in NUMA alignment at all.
    pub fn is_aligned(&self, guaranteed: bool) -> bool {
        self.exclusive_cpus > 0
            || !self.devices.is_empty()
            || (guaranteed && (self.memory > 0 || !self.hugepages.is_empty()))
    }
}

fn add_keyed(v: &mut Vec<(u64, u64)>, key: u64, value: u64) {
    match v.binary_search_by_key(&key, |(k, _)| *k) {
        Ok(i) => v[i].1 = v[i].1.saturating_add(value),
        Err(i) => v.insert(i, (key, value)),
    }
}

/// Whole, non-negative units of a quantity, clamped into `u64` (validation has
/// already refused negative and absurd values; clamping keeps this total).
fn units(q: &Quantity) -> u64 {
    u64::try_from(q.units_ceil().max(0)).unwrap_or(u64::MAX)
}

fn millis(q: &Quantity) -> u64 {
    u64::try_from(q.millis_ceil().max(0)).unwrap_or(u64::MAX)
}

/// The page size in bytes named by a `hugepages-<size>` resource, if it parses.
pub(crate) fn hugepage_size(resource: &str) -> Option<u64> {
    let size = resource.strip_prefix(HUGEPAGES_PREFIX)?;
    Quantity::parse(size).ok().map(|q| units(&q)).filter(|s| *s > 0)
}

/// Device resources are the extended resources with a domain (`pinion.io/sriov-vf`).
fn is_device(resource: &str) -> bool {
    resource.contains('/')
}

impl Demand {
    pub fn of(pod: &Pod) -> Demand {
        let qos = qos_class(pod);
        let mut total = Request::default();
        let mut containers = Vec::with_capacity(pod.spec.containers.len());
        for c in &pod.spec.containers {
            let mut r = Request::default();
            if let Some(q) = c.resources.request(RESOURCE_CPU) {
                r.cpu_millis = millis(q);
                if effective_cpu_policy(qos, c) == CpuPolicy::Exclusive {
                    r.exclusive_cpus = u32::try_from(units(q)).unwrap_or(u32::MAX);
                }
            }
            if let Some(q) = c.resources.request(RESOURCE_MEMORY) {
                r.memory = units(q);
            }
            // Requests and limits name the same resources; take each name once.
            let names = c.resources.requests.keys().chain(c.resources.limits.keys());
            let mut seen: Vec<&str> = Vec::new();
            for name in names {
                if seen.contains(&name.as_str()) {
                    continue;
                }
                seen.push(name);
                let Some(q) = c.resources.request(name) else { continue };
                if let Some(size) = hugepage_size(name) {
                    add_keyed(&mut r.hugepages, size, units(q));
                } else if is_device(name) {
                    let n = u32::try_from(units(q)).unwrap_or(u32::MAX);
                    if n > 0 {
                        r.add(&Request { devices: vec![(name.clone(), n)], ..Request::default() });
                    }
                }
            }
            total.add(&r);
            containers.push(r);
        }
        let topology = pod.spec.topology.as_ref();
        Demand {
            topology_policy: topology.and_then(|t| t.policy),
            topology_scope: topology.and_then(|t| t.scope),
            strategy: pod.spec.scheduling_strategy,
            guaranteed: qos == QosClass::Guaranteed,
            containers,
            total,
        }
    }

    /// The requests that must each be NUMA-aligned under the given scope: the
    /// whole pod for `pod` scope, each container for `container` scope.
    pub fn aligned_requests(&self, scope: TopologyScope) -> &[Request] {
        match scope {
            TopologyScope::Pod => std::slice::from_ref(&self.total),
            TopologyScope::Container => &self.containers,
        }
    }
}
