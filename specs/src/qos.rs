//! QoS class, derived as Kubernetes does, and the default CPU policy that follows.

use serde::{Deserialize, Serialize};

use crate::pod::{Container, CpuPolicy, Pod, RESOURCE_CPU, RESOURCE_MEMORY};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Kubernetes' rule: Guaranteed when every container sets cpu and memory limits
/// equal to their requests; BestEffort when no container sets any cpu or memory
/// request or limit; otherwise Burstable.
pub fn qos_class(pod: &Pod) -> QosClass {
    let mut any = false;
    let mut all_guaranteed = true;
    for c in &pod.spec.containers {
        for r in [RESOURCE_CPU, RESOURCE_MEMORY] {
            let req = c.resources.requests.get(r);
            let lim = c.resources.limits.get(r);
            if req.is_some_and(|q| !q.is_zero()) || lim.is_some_and(|q| !q.is_zero()) {
                any = true;
            }
            match (req, lim) {
                (_, None) => all_guaranteed = false,
                (Some(req), Some(lim)) if req != lim => all_guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        QosClass::BestEffort
    } else if all_guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The CPU policy a container gets: its own `cpuPolicy` if set, else exclusive
/// for a Guaranteed pod's container with an integer CPU request (the kubelet's
/// static policy), else shared.
pub fn effective_cpu_policy(qos: QosClass, c: &Container) -> CpuPolicy {
    if let Some(p) = c.cpu_policy {
        return p;
    }
    let integer_cpu = c.resources.request(RESOURCE_CPU).is_some_and(|q| q.is_whole() && !q.is_zero());
    if qos == QosClass::Guaranteed && integer_cpu {
        CpuPolicy::Exclusive
    } else {
        CpuPolicy::Shared
    }
}
